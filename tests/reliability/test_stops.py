"""Stops of the periodic methods on 2 forked gloo ranks: SIGUSR1 (SLURM's warning before its
deadline) and SIGTERM (a spot node's) to one rank, and ``request_stop()`` from one rank's code, end
every rank at the same step, at most a round after the request, with one checkpoint that verifies."""

import os
import signal

import pytest
import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint
from torch.multiprocessing import ProcessExitedException

from lightning_cocod import PREEMPTED_EXIT_CODE, CoCoDStrategy, LocalSGDStrategy
from lightning_cocod.rounds.checkpoint import verify_checkpoint
from tests.helpers import toy

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]
TAU, ASK_AT, STEPS = 4, 5, 20


class AskToStop(pl.Callback):
    """Rank 1 asks, after optimizer step ASK_AT; every rank notes the steps it saved at."""

    def __init__(self, out_dir, how):
        self.out_dir, self.how = out_dir, how

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_rank != 1 or trainer.global_step != ASK_AT:
            return
        if self.how == "request_stop":
            trainer.strategy.request_stop("asked by the test")
        else:
            os.kill(os.getpid(), self.how)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        with open(self.out_dir / f"saves{trainer.global_rank}", "a") as fh:
            fh.write(f"{trainer.global_step}\n")


@pytest.mark.parametrize(
    "strategy, how",
    [
        (lambda: CoCoDStrategy(tau=TAU, start_method="fork", timeout=20), signal.SIGUSR1),
        (lambda: LocalSGDStrategy(tau=TAU, start_method="fork", timeout=20), signal.SIGTERM),
        (lambda: LocalSGDStrategy(tau=TAU, start_method="fork", timeout=20), signal.SIGUSR1),
        (lambda: CoCoDStrategy(tau=TAU, start_method="fork", timeout=20), "request_stop"),
    ],
    ids=["cocod-sigusr1", "local_sgd-sigterm", "local_sgd-sigusr1", "cocod-request_stop"],
)
def test_a_stop_asked_on_one_rank_ends_every_rank_at_one_step_with_a_checkpoint(tmp_path, strategy, how):
    trainer = pl.Trainer(
        strategy=strategy(),
        accelerator="cpu",
        devices=2,
        max_steps=STEPS,
        logger=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        callbacks=[AskToStop(tmp_path, how), ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=0)],
    )
    with pytest.raises(ProcessExitedException) as stopped:
        trainer.fit(toy.ToyRegression(STEPS, str(tmp_path)))
    # (Forked ranks leave fit without Lightning's exception hooks: the exit code and the files tell.)
    assert stopped.value.exit_code == PREEMPTED_EXIT_CODE
    saved = [[int(s) for s in (tmp_path / f"saves{r}").read_text().split()] for r in range(2)]
    assert saved[0] == saved[1] and len(saved[0]) == 1, saved
    # The request rides on the next exchange of flags, read at the latest a round later.
    assert ASK_AT < saved[0][0] <= ASK_AT + 1 + TAU, saved
    assert saved[0][0] < STEPS  # stopped early, not at the end of fit
    verify_checkpoint(tmp_path / "ckpt" / "last.ckpt")
