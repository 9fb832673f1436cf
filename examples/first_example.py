"""First example: a small classifier trained with CoCoD-SGD on 2 CPU worker processes.

    pip install torch==2.13.0 -e .      # in a clone of this repository, in the venv you train in
    python examples/first_example.py    # about 20 s on a 2-core machine

scikit-learn's handwritten digits need no download. Lightning starts the second worker by
running this script again, hence the ``__main__`` guard.
"""

import pytorch_lightning as pl
import torch
from torch import nn

import lightning_cocod  # noqa: F401 - registers "cocod", "local_sgd", "pipe_sgd", "ssgd" as strategies
from lightning_cocod.data import DigitsDataModule


class TinyClassifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        accuracy = (self.net(x).argmax(dim=1) == y).float().mean()
        self.log("val/acc", accuracy, sync_dist=True)  # of the workers' averaged model

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


if __name__ == "__main__":
    pl.seed_everything(0)
    trainer = pl.Trainer(
        strategy="cocod",  # tau="auto": the shortest period that hides each round, at most 2
        accelerator="cpu",
        devices=2,
        max_epochs=5,
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(TinyClassifier(), datamodule=DigitsDataModule(batch_size=32))
    if trainer.global_rank == 0:
        print(f"validation accuracy {float(trainer.callback_metrics['val/acc']):.3f}")
