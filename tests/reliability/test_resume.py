"""Checkpoints mid-epoch and mid-round, and exact resume, on 2 gloo processes."""

import json

import pytest
import pytorch_lightning as pl
import torch

from lightning_cocod import CoCoDStrategy, DiLoCoStrategy, LocalSGDStrategy, PipeSGDStrategy
from lightning_cocod.callbacks import ProportionalSampling
from lightning_cocod.data import DigitsDataModule
from lightning_cocod.models import ClassifierModule, SmallCNN
from lightning_cocod.rounds.checkpoint import STATE_KEY

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]

SAVE_AT, STEPS = 10, 30  # 22 steps per epoch at 2 x 32: the save is mid-epoch and mid-round


class SaveAt(pl.Callback):
    def __init__(self, step, path):
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


class SingleThread(pl.Callback):
    def setup(self, trainer, pl_module, stage):
        torch.set_num_threads(1)


def fit(make_strategy, max_steps, ckpt_path=None, save=None, callbacks=()):
    pl.seed_everything(0)
    model = ClassifierModule(SmallCNN(in_channels=1, num_classes=10, width=8), lr=0.05, schedule="cosine")
    trainer = pl.Trainer(
        strategy=make_strategy(),
        accelerator="cpu",
        devices=2,
        max_steps=max_steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[SingleThread(), *([SaveAt(*save)] if save else []), *callbacks],
    )
    trainer.fit(model, datamodule=DigitsDataModule(batch_size=32), ckpt_path=ckpt_path)
    return torch.cat([p.detach().flatten() for p in model.parameters()])


STRATEGIES = {
    "cocod": lambda: CoCoDStrategy(tau=4, start_method="fork"),
    "local_sgd": lambda: LocalSGDStrategy(tau=4, start_method="fork"),
    "pipe_sgd": lambda: PipeSGDStrategy(start_method="fork"),
    "ssgd": lambda: "ssgd_fork",
    # Compressed rounds resume with their reference average and residuals, bit for bit.
    "cocod_int8": lambda: CoCoDStrategy(tau=4, compression="int8", start_method="fork"),
    "local_sgd_bf16": lambda: LocalSGDStrategy(tau=4, compression="bf16", start_method="fork"),
    # The outer round resumes with theta, the outer momentum and where the round began (the save
    # at step 10 falls between round 3's start at 8 and its snapshot at 11).
    "diloco_overlap": lambda: DiLoCoStrategy(tau=4, overlap=1, start_method="fork"),
    "diloco_int8": lambda: DiLoCoStrategy(tau=4, compression="int8", start_method="fork"),
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_resume_reproduces_the_run(tmp_path, name):
    ckpt = tmp_path / "mid.ckpt"
    straight = fit(STRATEGIES[name], STEPS, save=(SAVE_AT, ckpt))
    assert ckpt.exists() and not list(tmp_path.glob("*.tmp*"))  # written whole, no leftovers
    resumed = fit(STRATEGIES[name], STEPS, ckpt_path=ckpt)
    torch.testing.assert_close(resumed, straight, rtol=0, atol=1e-6)
    if name != "ssgd":
        state = torch.load(ckpt, weights_only=False)[STATE_KEY]
        assert state["world_size"] == 2 and len(state["ranks"]) == 2
        assert state["strategy"]["steps"] == SAVE_AT


class RecordTau(pl.Callback):
    """Writes the period a run starts training with (workers are forked: a file, not an attribute)."""

    def __init__(self, path):
        self.path = path

    def on_train_start(self, trainer, pl_module):
        strategy = trainer.strategy
        self.path.with_suffix(f".rank{trainer.global_rank}").write_text(
            json.dumps([strategy.tau, strategy.tau_history])
        )


def test_resume_restores_the_adaptive_period(tmp_path):
    # tau="auto" follows measured times, so two runs need not choose alike; what must hold is
    # that a resumed run starts from the period and history the saved run had reached.
    ckpt = tmp_path / "mid.ckpt"
    fit(lambda: CoCoDStrategy(tau="auto", start_method="fork"), SAVE_AT, save=(SAVE_AT, ckpt))
    saved = torch.load(ckpt, weights_only=False)[STATE_KEY]["strategy"]
    fit(
        lambda: CoCoDStrategy(tau="auto", start_method="fork"),
        SAVE_AT + 4,
        ckpt_path=ckpt,
        callbacks=[RecordTau(tmp_path / "tau")],
    )
    for rank in range(2):
        tau, history = json.loads((tmp_path / f"tau.rank{rank}").read_text())
        assert (tau, history) == (saved["tau"], [list(e) for e in saved["tau_history"]])
    assert saved["adaptive"]["step_seconds"] is not None  # the measurements travelled too


def test_resume_reproduces_a_heterogeneous_run(tmp_path):
    ckpt = tmp_path / "mid.ckpt"

    def split():
        return [ProportionalSampling(global_batch_size=64, batch_sizes=[40, 24])]

    straight = fit(STRATEGIES["cocod"], STEPS, save=(SAVE_AT, ckpt), callbacks=split())
    resumed = fit(STRATEGIES["cocod"], STEPS, ckpt_path=ckpt, callbacks=split())
    torch.testing.assert_close(resumed, straight, rtol=0, atol=1e-6)
    state = torch.load(ckpt, weights_only=False)[STATE_KEY]
    assert state["strategy"]["weight"] == 40 / 64  # rank 0's share, saved with the strategy
    assert [r["weight"] for r in state["ranks"]] == [40 / 64, 24 / 64]  # and each rank's own


class ForgetTheResumeOnRankOne(pl.Callback):
    """Rank 1 as on a node that does not see the checkpoint: its loops start from step 0.
    (Callbacks' on_train_start runs before the strategy's.)"""

    def on_train_start(self, trainer, pl_module):
        if trainer.global_rank == 1:
            trainer.fit_loop.epoch_loop.automatic_optimization.optim_progress.optimizer.step.total.completed = 0


@pytest.mark.parametrize("name", ["cocod", "ssgd"])
def test_ranks_that_resumed_at_different_steps_are_refused_before_training(tmp_path, name):
    ckpt = tmp_path / "mid.ckpt"
    fit(STRATEGIES[name], SAVE_AT, save=(SAVE_AT, ckpt))
    with pytest.raises(
        Exception, match=rf"CheckpointError: the workers start fit at different steps \(0 to {SAVE_AT};"
    ):
        fit(STRATEGIES[name], STEPS, ckpt_path=ckpt, callbacks=[ForgetTheResumeOnRankOne()])
