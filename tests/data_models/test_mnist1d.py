"""MNIST-1D: generated without a network, split and sharded deterministically, cached, learnable."""

import random
import socket
from types import SimpleNamespace

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from lightning_cocod.data import MNIST1DDataModule, mnist1d
from lightning_cocod.models import MNIST1DCNN, ClassifierModule, build_model
from tests.helpers.trainers import single_cpu_trainer

SMALL = 600  # signals: 400 / 100 / 100, generated in a fraction of a second


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any connection attempt fails the test: the data must come from the generator alone."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"MNIST-1D tried to reach the network: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def module(tmp_path, **kwargs):
    return MNIST1DDataModule(**{"num_samples": SMALL, "cache_dir": tmp_path, **kwargs})


def test_splits_are_the_generators_signals_in_its_order(tmp_path):
    from mnist1d.data import get_dataset_args, make_dataset

    dm = module(tmp_path)
    dm.setup()
    args = get_dataset_args()
    args.num_samples, args.seed = SMALL, 42
    reference = make_dataset(args)  # the package's own train/test split, 80/20
    x_all = np.concatenate([reference["x"], reference["x_test"]]).astype(np.float32)
    y_all = np.concatenate([reference["y"], reference["y_test"]])
    ours = [dm.train_tensors, dm.eval_tensors, dm.test_tensors]
    assert [len(y) for _, y in ours] == [400, 100, 100] and dm.num_train_samples == 400
    x = torch.cat([x for x, _ in ours])
    assert x.shape == (SMALL, 1, 40) and x.dtype == torch.float32
    np.testing.assert_array_equal(x.squeeze(1).numpy(), x_all)
    np.testing.assert_array_equal(torch.cat([y for _, y in ours]).numpy(), y_all)
    assert torch.bincount(torch.cat([y for _, y in ours]), minlength=10).tolist() == [60] * 10


def test_the_generator_leaves_the_global_random_state_alone(tmp_path):
    random.seed(7)
    np.random.seed(7)
    expected = (random.random(), np.random.rand())
    random.seed(7)
    np.random.seed(7)
    module(tmp_path).setup()
    assert (random.random(), np.random.rand()) == expected


def test_the_data_seed_fixes_the_data_and_the_seed_only_the_batch_order(tmp_path):
    a, b, c = module(tmp_path, seed=0), module(tmp_path, seed=1), module(tmp_path / "other", data_seed=3)
    for dm in (a, b, c):
        dm.setup()
    assert torch.equal(a.train_tensors[0], b.train_tensors[0])
    assert not torch.equal(a.train_tensors[0], c.train_tensors[0])
    order = [torch.cat(list(dm.train_dataloader().sampler)) for dm in (a, b)]
    assert not torch.equal(order[0], order[1])


def test_every_ranks_shard_is_disjoint_and_together_they_cover_the_epoch(tmp_path):
    shards = []
    for rank in range(4):
        dm = module(tmp_path, batch_size=10)
        dm.trainer = SimpleNamespace(global_rank=rank, world_size=4)
        dm.setup()
        shards.append(torch.cat(list(dm.train_dataloader().sampler)).tolist())
        assert len(dm.train_dataloader()) == 400 // 40
    seen = [i for shard in shards for i in shard]
    assert len(seen) == len(set(seen)) == 400 and set(seen) == set(range(400))


def test_the_cache_is_reused_and_a_damaged_one_regenerated(tmp_path, monkeypatch):
    first = module(tmp_path)
    first.prepare_data()
    assert [p.name for p in tmp_path.iterdir()] == [first.cache_path.name]
    calls = []
    real = mnist1d.generate_mnist1d
    monkeypatch.setattr(mnist1d, "generate_mnist1d", lambda *a: calls.append(a) or real(*a))
    again = module(tmp_path)
    again.setup()
    assert calls == []  # read from the cache, not generated again
    first.setup()
    assert torch.equal(again.train_tensors[0], first.train_tensors[0])
    first.cache_path.write_bytes(first.cache_path.read_bytes()[:100])  # truncated by a crash elsewhere
    damaged = module(tmp_path)
    damaged.setup()
    assert calls == [(SMALL, 42)]
    assert torch.equal(damaged.test_tensors[0], first.test_tensors[0])
    assert module(tmp_path)._read_cache() is not None  # rewritten whole
    assert module(tmp_path, num_samples=300).cache_path != first.cache_path


def test_an_unwritable_cache_folder_still_gives_the_data(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    dm = module(blocker)
    dm.setup()
    assert len(dm.train_tensors[1]) == 400


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"num_samples": 605}, "num_samples=605 is invalid; accepted: a multiple of 10"),
        ({"num_samples": True}, "num_samples=True is invalid"),
        ({"val_fraction": 0}, "val_fraction=0 is invalid; accepted: a number strictly between 0 and 1"),
        ({"val_fraction": 0.5, "test_fraction": 0.5}, "val_fraction \\+ test_fraction=1.0 is invalid"),
        ({"data_seed": "a"}, "data_seed='a' is invalid; accepted: an integer"),
    ],
)
def test_bad_arguments_are_named(tmp_path, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        module(tmp_path, **kwargs)


def test_the_cnn_has_the_papers_shape():
    # The paper's ConvBase with 25 channels: conv 1->25 (k5), 25->25 (k3) twice, linear 125->10.
    by_hand = (1 * 25 * 5 + 25) + 2 * (25 * 25 * 3 + 25) + (25 * 5 * 10 + 10)
    assert sum(p.numel() for p in MNIST1DCNN(channels=25).parameters()) == by_hand == 5210
    net = build_model("mnist1d_cnn", num_classes=10, in_channels=1)
    assert net(torch.zeros(3, 1, 40)).shape == (3, 10)
    with pytest.raises(ValueError, match="channels=0 is invalid; accepted: a positive integer"):
        MNIST1DCNN(channels=0)
    with pytest.raises(ValueError, match="length=2 is invalid; accepted: an integer >= 3"):
        MNIST1DCNN(length=2)


def test_one_process_reaches_90_percent_on_the_default_task(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pl.seed_everything(0)
        dm = MNIST1DDataModule(batch_size=64, cache_dir=tmp_path)  # the default 8,000 / 2,000 / 2,000
        model = ClassifierModule(MNIST1DCNN(), lr=0.1, weight_decay=1e-4, no_decay_bn_bias=False)
        trainer = single_cpu_trainer(max_epochs=8, limit_val_batches=0, num_sanity_val_steps=0)
        trainer.fit(model, datamodule=dm)
        (result,) = trainer.test(model, datamodule=dm, verbose=False)
    finally:
        torch.set_num_threads(threads)
    assert len(dm.test_tensors[1]) == 2000
    assert result["test/acc"] >= 0.90
