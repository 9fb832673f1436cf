"""Preemption of one worker, requested checkpoints and peers lost in Lightning's own collectives:
2 gloo processes on CPU, each a real Trainer (tests/_launch_workers/preempt_worker.py)."""

import json
import os
import signal
import subprocess
import sys

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from torch.multiprocessing import ProcessExitedException

from lightning_cocod import PREEMPTED_EXIT_CODE, CoCoDStrategy, PipeSGDStrategy, SSGDStrategy
from lightning_cocod.rounds.checkpoint import verify_checkpoint
from tests.helpers import toy
from tests.reliability.test_failures import ROOT, free_port

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]
TAU = 4  # the worker's period for cocod


def run_ranks(out_dir, *args, timeout=120):
    port, procs = free_port(), []
    for rank in range(2):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": "2",
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "NODE_RANK": "0",
            "PYTHONPATH": str(ROOT),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests._launch_workers.preempt_worker", str(out_dir), *map(str, args)],
                env=env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
        errs = [p.stderr.read() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    ends = [
        json.loads((out_dir / f"rank{r}.json").read_text()) if (out_dir / f"rank{r}.json").exists() else None
        for r in range(2)
    ]
    return codes, errs, ends


def test_sigterm_to_one_worker_stops_all_at_one_step_with_a_checkpoint_and_the_run_resumes(tmp_path):
    strategy, lag = "cocod", TAU
    codes, errs, ends = run_ranks(tmp_path, strategy, 40, "sigterm", 1, 9)
    assert codes == [PREEMPTED_EXIT_CODE] * 2, errs[0][-3000:] + errs[1][-3000:]
    signalled = json.loads((tmp_path / "event_at").read_text())
    steps = {end["step"] for end in ends}
    assert len(steps) == 1, ends  # every rank stopped at the same step
    stop = steps.pop()
    # The flag raised after step 9 goes out with step 10's flags, which every rank reads `lag`
    # steps later; all stop at the next batch: at most a round after the signal.
    assert signalled["step"] < stop <= signalled["step"] + 1 + lag, (signalled, stop)
    # (Both ranks exited with the preemption code at one step: no collective timed out, which
    # would have ended them with WorkerLostError instead.)
    assert all("SIGTERM on rank 1" in end["reason"] for end in ends if end["rank"] == 1)
    checkpoint = tmp_path / "ckpt" / "last.ckpt"
    assert {end["checkpoint"] for end in ends} == {str(checkpoint)}
    verify_checkpoint(checkpoint)
    assert not [p for p in (tmp_path / "ckpt").iterdir() if ".tmp-" in p.name]
    saved = [json.loads((tmp_path / f"saves{r}.json").read_text()) for r in range(2)]
    assert saved == [[stop], [stop]]

    codes, errs, ends = run_ranks(tmp_path, strategy, stop + 6, "none", 0, 0, "resume")
    assert codes == [0, 0], errs[0][-3000:] + errs[1][-3000:]
    assert [end["step"] for end in ends] == [stop + 6] * 2
    weights = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


class SignalAt(pl.Callback):
    """In a forked rank: after optimizer step `step`, `rank` signals itself (or asks for a checkpoint)."""

    def __init__(self, out_dir, rank, step, what):
        self.out_dir, self.rank, self.step, self.what = out_dir, rank, step, what

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            self._act(trainer)

    def on_sanity_check_start(self, trainer, pl_module):
        if trainer.global_rank == self.rank and self.step == "sanity check":
            self._act(trainer)

    def _act(self, trainer):
        if self.what == "checkpoint":
            trainer.strategy.request_checkpoint()
        else:
            os.kill(os.getpid(), self.what)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        with open(self.out_dir / f"saves{trainer.global_rank}", "a") as fh:
            fh.write(f"{trainer.global_step}\n")


def fork_fit(tmp_path, strategy, what, at=5, steps=20):
    model = toy.ToyRegression(steps, str(tmp_path))
    sanity = at == "sanity check"
    trainer = pl.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=2,
        max_steps=steps,
        logger=False,
        limit_val_batches=1 if sanity else 0,
        num_sanity_val_steps=1 if sanity else 0,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        callbacks=[SignalAt(tmp_path, 1, at, what), ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=0)],
    )
    trainer.fit(model)


def saves(tmp_path):
    return [[int(s) for s in (tmp_path / f"saves{r}").read_text().split()] for r in range(2)]


@pytest.mark.parametrize(
    "strategy",
    [
        lambda: SSGDStrategy(start_method="fork", timeout=20),
        lambda: PipeSGDStrategy(start_method="fork", timeout=20),
    ],
)
@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM])
def test_a_signal_to_one_rank_stops_every_strategy_at_one_step(tmp_path, strategy, signum):
    with pytest.raises(ProcessExitedException) as stopped:
        fork_fit(tmp_path, strategy(), signum)
    # (Forked ranks leave fit without Lightning's exception hooks: the exit code and the files tell.)
    assert stopped.value.exit_code == PREEMPTED_EXIT_CODE
    written = saves(tmp_path)
    assert written[0] == written[1] and len(written[0]) == 1 and 5 < written[0][0] <= 5 + 2, written  # lag 1
    verify_checkpoint(tmp_path / "ckpt" / "last.ckpt")


def test_a_signal_before_training_starts_is_a_stop_too(tmp_path):
    # During the sanity check Lightning's own handler is in place: it must only raise our request.
    with pytest.raises(ProcessExitedException) as stopped:
        fork_fit(
            tmp_path,
            CoCoDStrategy(tau=TAU, start_method="fork", timeout=20),
            signal.SIGTERM,
            at="sanity check",
        )
    assert stopped.value.exit_code == PREEMPTED_EXIT_CODE
    written = saves(tmp_path)
    assert written[0] == written[1] and len(written[0]) == 1 and written[0][0] <= 1 + TAU, written


def test_a_requested_checkpoint_is_written_by_every_rank_at_one_step(tmp_path):
    fork_fit(tmp_path, CoCoDStrategy(tau=TAU, start_method="fork"), "checkpoint")
    written = saves(tmp_path)
    assert written[0] == written[1] and len(written[0]) == 1 and 5 < written[0][0] <= 5 + 1 + TAU, written
    verify_checkpoint(tmp_path / "ckpt" / "last.ckpt")


def test_a_peer_dying_in_lightnings_own_collectives_is_a_worker_lost_error(tmp_path):
    codes, errs, _ = run_ranks(tmp_path, "cocod", 40, "die_in_validation", 1, 4)
    assert codes[1] == 3 and codes[0] not in (0, PREEMPTED_EXIT_CODE)
    last = [line for line in errs[0].splitlines() if "WorkerLostError" in line]
    assert (
        last and "rank 0, optimizer step 4" in last[-1] and "resume from the last checkpoint" in last[-1]
    ), errs[0][-3000:]
    # Stopped because the peer's death was seen (its connection went), not by waiting out the
    # collective timeout: gloo's cause says which.
    assert "by peer" in last[-1] and "Timed out" not in last[-1], last[-1]
