"""Where the in-memory datamodules gather their batches.

On the CPU nothing moves and batches are the epoch's permutation gathered by hand. On an
accelerator the data moves there once and every index, batch and preprocessing constant is made
there: the "meta" device stands in for a GPU here (an op that mixed in a host tensor would fail
on it, as it would cost a copy on a GPU); tests/gpu/ checks real CUDA batches and host syncs.
"""

from types import SimpleNamespace

import pytest
import torch

from lightning_cocod.data import SyntheticDataModule

META = torch.device("meta")


def datamodule(device=None, rank=0, world_size=1, training=True, **kwargs):
    settings = {
        "num_samples": 40,
        "num_eval_samples": 10,
        "image_shape": (3, 6, 6),
        "batch_size": 4,
        **kwargs,
    }
    dm = SyntheticDataModule(**settings)
    strategy = SimpleNamespace(root_device=device) if device is not None else None
    dm.trainer = SimpleNamespace(
        global_rank=rank, world_size=world_size, strategy=strategy, training=training
    )
    dm.setup("fit")
    return dm


def test_host_batches_are_the_epochs_permutation_sliced_by_rank():
    dm = datamodule(torch.device("cpu"), rank=1, world_size=2, per_rank_batch_sizes=[3, 5])
    x, y = dm.train_tensors
    loader = dm.train_dataloader()
    assert dm.train_tensors[0] is x  # the CPU keeps the data where it is
    for epoch in (0, 1):
        loader.sampler.set_epoch(epoch)
        order = torch.randperm(40, generator=torch.Generator().manual_seed(epoch))  # seed 0 + epoch
        batches = list(loader)
        assert len(batches) == 40 // 8
        for step, (bx, by) in enumerate(batches):
            mine = order[8 * step + 3 : 8 * step + 8]  # rank 1 takes the 5 after rank 0's 3
            assert torch.equal(bx, x[mine]) and torch.equal(by, y[mine])


def test_an_accelerator_gets_the_data_once_and_every_batch_is_made_there():
    dm = datamodule(META, rank=0, world_size=2, per_rank_batch_sizes=[5, 3])
    loader = dm.train_dataloader()
    moved = dm.train_tensors
    assert all(t.device == META for t in moved)
    assert dm.train_dataloader() is not loader and dm.train_tensors is moved  # moved once only
    indices = list(loader.sampler)
    assert len(indices) == 5 and all(i.device == META and i.shape == (5,) for i in indices)
    x, y = next(iter(loader))
    assert x.device == META and x.dtype == torch.uint8 and x.shape == (5, 3, 6, 6) and y.shape == (5,)
    out, labels = dm.on_after_batch_transfer((x, y), 0)  # crop, flip and normalise, all on the device
    assert out.device == META and out.dtype == torch.float32 and out.shape == (5, 3, 6, 6)
    assert labels is y
    evaluation = list(dm.val_dataloader())
    assert all(bx.device == META for bx, _ in evaluation) and sum(len(by) for _, by in evaluation) == 5


def test_resuming_mid_epoch_on_an_accelerator_skips_the_batches_done():
    dm = datamodule(META)
    dm.load_state_dict({"epoch": 2, "batches_done": 7})
    loader = dm.train_dataloader()
    assert loader.sampler.epoch == 2 and len(list(loader)) == 10 - 7


def test_without_a_trainer_the_data_stays_on_the_host():
    dm = SyntheticDataModule(num_samples=16, num_eval_samples=4, image_shape=(3, 4, 4), batch_size=4)
    dm.setup()
    x, _ = next(iter(dm.train_dataloader()))
    assert x.device.type == "cpu"
    out, _ = dm.on_after_batch_transfer((x, torch.zeros(4)), 0)
    assert out.device.type == "cpu" and out.dtype == torch.float32


@pytest.mark.parametrize("device", [torch.device("cpu"), META])
def test_eval_batches_cover_the_rank_block_once_on_the_data_device(device):
    dm = datamodule(device, rank=1, world_size=2, eval_batch_size=2)
    batches = list(dm.test_dataloader())
    assert len(batches) == 3 and all(bx.device == device for bx, _ in batches)
    if device.type == "cpu":
        x, y = dm.eval_tensors
        assert torch.equal(torch.cat([by for _, by in batches]), y[5:10])
        assert torch.equal(torch.cat([bx for bx, _ in batches]), x[5:10])
