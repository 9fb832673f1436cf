"""A rank of a small CoCoD run on digits, for the reliability tests.

argv: out_dir max_steps [die_at_step] [resume]; rank 1 kills itself (SIGKILL) after optimizer
step die_at_step; a checkpoint is written at step 4; the final weights go to out_dir/rank{R}.pt,
the step each rank's training began at to out_dir/began{R}.
"""

import os
import signal
import sys
from datetime import timedelta
from pathlib import Path

import pytorch_lightning as pl
import torch

from lightning_cocod import CoCoDStrategy
from lightning_cocod.data import DigitsDataModule
from lightning_cocod.models import ClassifierModule, SmallCNN


class Script(pl.Callback):
    def __init__(self, out_dir, die_at):
        self.out_dir, self.die_at = out_dir, die_at

    def on_train_start(self, trainer, pl_module):
        (self.out_dir / f"began{trainer.global_rank}").write_text(str(trainer.global_step))

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == 4:
            trainer.save_checkpoint(self.out_dir / "step4.ckpt")
        if trainer.global_rank == 1 and trainer.global_step == self.die_at:
            os.kill(os.getpid(), signal.SIGKILL)


def main():
    out_dir, max_steps = Path(sys.argv[1]), int(sys.argv[2])
    die_at = int(sys.argv[3]) if len(sys.argv) > 3 else -1
    resume = len(sys.argv) > 4 and sys.argv[4] == "resume"
    torch.set_num_threads(1)
    pl.seed_everything(0)
    model = ClassifierModule(SmallCNN(in_channels=1, num_classes=10, width=8), lr=0.05, schedule="none")
    trainer = pl.Trainer(
        strategy=CoCoDStrategy(tau=2, timeout=timedelta(seconds=30)),
        accelerator="cpu",
        devices=2,
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[Script(out_dir, die_at)],
    )
    trainer.fit(
        model,
        datamodule=DigitsDataModule(batch_size=32),
        ckpt_path=str(out_dir / "step4.ckpt") if resume else None,
    )
    torch.save(model.state_dict(), out_dir / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main()
