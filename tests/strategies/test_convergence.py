"""Real data on CPU: 2 workers on the handwritten digits, CoCoD-SGD against S-SGD."""

import pytest
import pytorch_lightning as pl
import torch

from lightning_cocod import CoCoDStrategy
from lightning_cocod.data import DigitsDataModule
from lightning_cocod.models import ClassifierModule, SmallCNN

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(300)]

EPOCHS = 10


class SingleThread(pl.Callback):
    def setup(self, trainer, pl_module, stage):
        torch.set_num_threads(1)  # two workers on two cores


def fit_and_test(strategy) -> float:
    pl.seed_everything(0, workers=True)
    model = ClassifierModule(SmallCNN(in_channels=1, num_classes=10), lr=0.05, momentum=0.9, schedule="none")
    data = DigitsDataModule(batch_size=32)
    trainer = pl.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=2,
        max_epochs=EPOCHS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        check_val_every_n_epoch=EPOCHS,
        callbacks=[SingleThread()],
    )
    trainer.fit(model, datamodule=data)
    return trainer.test(model, datamodule=data, verbose=False)[0]["test/acc"]


def test_cocod_matches_ssgd_accuracy_on_digits():
    ssgd = fit_and_test("ssgd_fork")
    cocod = fit_and_test(CoCoDStrategy(tau=4, start_method="fork"))
    assert ssgd > 0.95 and cocod > 0.95, (ssgd, cocod)
    assert cocod >= ssgd - 0.01, (ssgd, cocod)
