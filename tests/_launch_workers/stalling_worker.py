"""A rank of a small CoCoD run on digits whose rank 1 stalls: alive, silent, after optimizer step
argv[2]; the collective timeout is argv[3] seconds. argv[1]: a folder for the stalled rank's
"stalled" marker file."""

import sys
import time
from datetime import timedelta
from pathlib import Path

import pytorch_lightning as pl
import torch

from lightning_cocod import CoCoDStrategy
from lightning_cocod.data import DigitsDataModule
from lightning_cocod.models import ClassifierModule, SmallCNN


class Stall(pl.Callback):
    def __init__(self, out_dir: Path, at_step: int) -> None:
        self.out_dir, self.at_step = out_dir, at_step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_rank == 1 and trainer.global_step == self.at_step:
            (self.out_dir / "stalled").write_text(str(trainer.global_step))
            while True:  # neither dies nor talks: only the peer's timeout can end the run
                time.sleep(1)


def main():
    out_dir, stall_at, timeout = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    torch.set_num_threads(1)
    pl.seed_everything(0)
    model = ClassifierModule(SmallCNN(in_channels=1, num_classes=10, width=8), lr=0.05, schedule="none")
    trainer = pl.Trainer(
        strategy=CoCoDStrategy(tau=2, timeout=timedelta(seconds=timeout)),
        accelerator="cpu",
        devices=2,
        max_steps=40,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[Stall(out_dir, stall_at)],
    )
    trainer.fit(model, datamodule=DigitsDataModule(batch_size=32))


if __name__ == "__main__":
    main()
