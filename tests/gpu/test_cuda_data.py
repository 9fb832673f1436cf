"""The data path and a training step on a real GPU: batches are gathered and preprocessed on the
device, equal to the host path's, and a step of it never makes the host wait for the device."""

from types import SimpleNamespace

import pytest
import pytorch_lightning as pl
import torch

from lightning_cocod.data import SyntheticDataModule
from lightning_cocod.models import ClassifierModule, build_model

pytestmark = pytest.mark.timeout(120)

DEVICE = torch.device("cuda", 0)


def datamodule(device, training=True):
    dm = SyntheticDataModule(num_samples=512, num_eval_samples=96, batch_size=64, eval_batch_size=40)
    dm.trainer = SimpleNamespace(
        global_rank=0, world_size=1, strategy=SimpleNamespace(root_device=device), training=training
    )
    dm.setup("fit")
    return dm


def test_device_batches_equal_the_host_path():
    on_gpu, on_host = datamodule(DEVICE), datamodule(torch.device("cpu"))
    for epoch in (0, 3):
        loaders = on_gpu.train_dataloader(), on_host.train_dataloader()
        for loader in loaders:
            loader.sampler.set_epoch(epoch)
        for (gx, gy), (hx, hy) in zip(*loaders, strict=True):
            assert gx.device == DEVICE and gy.device == DEVICE
            assert torch.equal(gx.cpu(), hx) and torch.equal(gy.cpu(), hy)
    on_gpu.trainer.training = on_host.trainer.training = False  # no augmentation: same values
    for (gx, gy), (hx, hy) in zip(on_gpu.val_dataloader(), on_host.val_dataloader(), strict=True):
        g, _ = on_gpu.on_after_batch_transfer((gx, gy), 0)
        h, _ = on_host.on_after_batch_transfer((hx, hy), 0)
        assert g.device == DEVICE
        torch.testing.assert_close(g.cpu(), h, rtol=1e-6, atol=1e-6)


def test_epochs_of_device_batches_and_augmentation_never_sync_the_host():
    dm = datamodule(DEVICE)
    loader = dm.train_dataloader()  # moves the data to the device: once, outside the check
    x, y = next(iter(loader))
    dm.on_after_batch_transfer((x, y), 0)  # first batch: the normalisation constants move once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for epoch in (1, 2):  # a new epoch: its order is copied to the device, still no sync
            loader.sampler.set_epoch(epoch)
            for x, y in loader:
                out, _ = dm.on_after_batch_transfer((x, y), 0)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert out.device == DEVICE and out.dtype == torch.float32 and out.shape == (64, 3, 32, 32)


def test_bf16_mixed_channels_last_fit_on_the_gpu():
    pl.seed_everything(0)
    module = ClassifierModule(build_model("small_cnn", 10), lr=0.05, schedule="none", channels_last=True)
    conv = next(m for m in module.net.modules() if isinstance(m, torch.nn.Conv2d))
    seen = []  # what the convolution computed in: bf16 under autocast, not the weights' float32
    conv.register_forward_hook(lambda _m, _inputs, out: seen.append((out.dtype, out.device.type)))
    trainer = pl.Trainer(
        accelerator="gpu",
        devices=1,
        max_steps=6,
        precision="bf16-mixed",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, datamodule=SyntheticDataModule(num_samples=256, batch_size=32))
    assert torch.isfinite(trainer.callback_metrics["train/loss"]).item()
    assert len(seen) == 6 and set(seen) == {(torch.bfloat16, "cuda")}, seen
    weight = next(p for p in module.net.parameters() if p.dim() == 4)
    assert weight.dtype == torch.float32 and weight.is_contiguous(memory_format=torch.channels_last)
