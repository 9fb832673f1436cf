"""Failures: a worker that dies, non-finite values, determinism. 2 gloo processes on CPU."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from lightning_cocod import CoCoDStrategy, LocalSGDStrategy, PipeSGDStrategy
from tests.helpers import toy
from tests.reliability.test_resume import SaveAt
from tests.strategies.test_against_reference import fit

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]
ROOT = Path(__file__).resolve().parents[2]


def start_ranks(args, port):
    procs = []
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
                [sys.executable, "-m", "tests._launch_workers.train_worker", *map(str, args)],
                env=env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    return procs


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dead_worker_stops_the_others_with_a_clear_error_and_the_run_resumes(tmp_path):
    procs = start_ranks([tmp_path, 12, 6], free_port())  # rank 1 is SIGKILLed after step 6
    try:
        died = procs[1].wait(timeout=120)
        killed_at = time.monotonic()
        code = procs[0].wait(timeout=90)
        stopped_after = time.monotonic() - killed_at
        err = procs[0].stderr.read()
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert died == -signal.SIGKILL
    assert code != 0
    assert "WorkerLostError" in err and "rank 0" in err and "resume from the last checkpoint" in err, err[
        -2000:
    ]
    # Stopped because the peer's death was seen (its connection went), not by waiting out the
    # 30 s collective timeout: gloo's cause says which (an order of events, not a duration).
    lost = [line for line in err.splitlines() if "WorkerLostError" in line][-1]
    assert "by peer" in lost and "Timed out" not in lost, (lost, stopped_after)
    # The checkpoint written before the failure is whole and the run resumes from it.
    assert (tmp_path / "step4.ckpt").exists() and not list(tmp_path.glob("*.tmp*"))
    resumed = start_ranks([tmp_path, 10, -1, "resume"], free_port())
    for p in resumed:
        assert p.wait(timeout=120) == 0, p.stderr.read()[-2000:]
    weights = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for key in weights[0]:
        assert torch.equal(weights[0][key], weights[1][key])
    # Every rank went on from the checkpoint's step (not from scratch) and trained past it.
    assert [(tmp_path / f"began{r}").read_text() for r in range(2)] == ["4", "4"]
    saved = torch.load(tmp_path / "step4.ckpt", weights_only=True)["state_dict"]
    assert any(not torch.equal(weights[0][k], saved[k]) for k in saved)


class PoisonRank1(pl.Callback):
    """Puts a NaN into rank 1's weights after optimizer step `at`."""

    def __init__(self, at):
        self.at = at

    def on_train_batch_end(self, trainer, pl_module, *args):
        if trainer.global_rank == 1 and trainer.global_step == self.at:
            with torch.no_grad():
                pl_module.net.weight[0, 0] = float("nan")


@pytest.mark.parametrize(
    ("strategy", "expected_step"),
    [
        (lambda: CoCoDStrategy(tau=4, start_method="fork"), "optimizer step 12"),
        (lambda: LocalSGDStrategy(tau=4, start_method="fork"), "optimizer step 8"),
        (lambda: PipeSGDStrategy(start_method="fork"), "optimizer step 7"),
    ],
)
def test_nonfinite_values_stop_the_run_naming_rank_and_step(tmp_path, strategy, expected_step):
    # CoCoD sees the NaN in the snapshot of the round launched at step 8 and stops before
    # merging it (step 12); Local-SGD at its next average; Pipe-SGD before applying the
    # gradients that the NaN weights produced at step 7.
    with pytest.raises(Exception, match=rf"NonFiniteError.*rank 1 at {expected_step}"):
        fit(strategy(), tmp_path, steps=16, callbacks=[PoisonRank1(6)])


@pytest.mark.parametrize("strategy_cls", [CoCoDStrategy, LocalSGDStrategy, PipeSGDStrategy])
def test_skip_recovers_the_bad_worker_and_the_run_goes_on(tmp_path, strategy_cls):
    ranks = fit(
        strategy_cls(on_nonfinite="skip", start_method="fork"), tmp_path, steps=16, callbacks=[PoisonRank1(6)]
    )
    final = [torch.tensor(r["final"]) for r in ranks]
    assert all(torch.isfinite(f).all() for f in final) and torch.equal(final[0], final[1])
    for record in ranks:  # rank 1 was bad for a while, then healthy to the end
        late = torch.tensor(record["trajectory"][-1])
        assert torch.isfinite(late).all()


def test_no_checkpoint_is_written_from_nonfinite_weights(tmp_path):
    ckpt = tmp_path / "late.ckpt"
    with pytest.raises(Exception, match=r"NonFiniteError.*rank 1 at optimizer step 7.*synchronisation point"):
        fit(
            CoCoDStrategy(tau=4, start_method="fork"),
            tmp_path,
            steps=16,
            callbacks=[PoisonRank1(6), SaveAt(7, ckpt)],
        )
    assert not ckpt.exists() and not list(tmp_path.glob("*.tmp*"))


def test_same_seed_same_weights(tmp_path):
    runs = [fit(CoCoDStrategy(tau=4, start_method="fork"), tmp_path / str(i), steps=10) for i in range(2)]
    assert runs[0][0]["final"] == runs[1][0]["final"] and runs[0][1]["trajectory"] == runs[1][1]["trajectory"]
    reference = toy.reference_cocod(2, 10, 4)[1]
    assert torch.allclose(torch.tensor(runs[0][0]["final"]), torch.tensor(reference[0]), atol=1e-6)


def test_unreachable_rendezvous_is_one_clear_error_and_writes_nothing(tmp_path):
    # Rank 1 of 2 with nobody serving the store: it must give up after the strategy's timeout
    # with one line saying so, not wait for torch's 30-minute default.
    script = f"""
import os, sys, datetime
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{free_port()}", WORLD_SIZE="2", RANK="1",
                  LOCAL_RANK="1", NODE_RANK="0")
import pytorch_lightning as pl
from lightning_cocod import CoCoDStrategy
from tests.helpers import toy
trainer = pl.Trainer(strategy=CoCoDStrategy(timeout=datetime.timedelta(seconds=5)), accelerator="cpu",
                     devices=2, max_steps=2, logger=False, enable_checkpointing=False,
                     default_root_dir={str(tmp_path / "run")!r})
try:
    trainer.fit(toy.ToyRegression(2, {str(tmp_path / "out")!r}))
except Exception as err:
    print(type(err).__name__ + ": " + str(err), file=sys.stderr)
    sys.exit(1)
"""
    # (The subprocess timeout guards against a hang; the message says which deadline ended it.)
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("RendezvousError: rank 1 of 2 could not meet the others at 127.0.0.1:"), last
    assert "within 0:00:05" in last
    assert not (tmp_path / "run").exists() and not (tmp_path / "out").exists()
