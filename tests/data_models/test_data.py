import dataclasses
import hashlib
import io
import pickle
import shutil
import tarfile
from types import SimpleNamespace

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from torch import nn

from lightning_cocod.data import (
    CIFARDataModule,
    DigitsDataModule,
    ShardedBatchSampler,
    SyntheticDataModule,
    cifar,
    eval_batches,
    load_cifar,
    normalize,
    random_crop,
    random_flip,
)
from tests.helpers.trainers import single_cpu_trainer


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Tests share 2 cores with other processes; extra intra-op threads only spin against each other.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


LAYOUT = {  # folder, {file: number of images}, label key
    "cifar10": (
        "cifar-10-batches-py",
        {**{f"data_batch_{i}": 2 for i in range(1, 6)}, "test_batch": 3},
        b"labels",
    ),
    "cifar100": ("cifar-100-python", {"train": 4, "test": 3}, b"fine_labels"),
}


def fake_cifar_files(dataset):
    """Pickled dicts as in the official archives; image k of a file has every byte equal to a running
    counter except one marked pixel, so layout and order can be checked by hand."""
    _, files, label_key = LAYOUT[dataset]
    blobs, counter = {}, 0
    for name, n in files.items():
        data = np.zeros((n, 3072), dtype=np.uint8)
        for k in range(n):
            data[k] = counter
            data[k, 1 * 1024 + 5 * 32 + 7] = 200  # green channel, row 5, column 7
            counter += 1
        entry = {
            b"data": data,
            label_key: [(counter + j) % 10 for j in range(n)],
            b"batch_label": name.encode(),
        }
        blobs[name] = pickle.dumps(entry)
    blobs["batches.meta" if dataset == "cifar10" else "meta"] = pickle.dumps({b"label_names": []})
    return blobs


def write_archive(root, dataset):
    folder = LAYOUT[dataset][0]
    path = root / ("cifar-10-python.tar.gz" if dataset == "cifar10" else "cifar-100-python.tar.gz")
    with tarfile.open(path, "w:gz") as tar:
        for name, blob in fake_cifar_files(dataset).items():
            info = tarfile.TarInfo(f"{folder}/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return path


def write_folder(root, dataset):
    folder = root / LAYOUT[dataset][0]
    folder.mkdir()
    for name, blob in fake_cifar_files(dataset).items():
        (folder / name).write_bytes(blob)


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
@pytest.mark.parametrize("writer", [write_archive, write_folder])
def test_cifar_decoding(tmp_path, dataset, writer):
    writer(tmp_path, dataset)
    splits = load_cifar(tmp_path, dataset)
    x, y = splits["train"]
    n_train = 10 if dataset == "cifar10" else 4
    assert x.shape == (n_train, 3, 32, 32) and x.dtype == torch.uint8 and y.dtype == torch.long
    # Training files are concatenated in order, so image k carries counter value k.
    assert x[:, 0, 0, 0].tolist() == list(range(n_train))
    assert (x[:, 1, 5, 7] == 200).all() and (x[:, 1, 5, 6] == x[:, 0, 0, 0]).all()
    assert (x[:, 2, 5, 7] == x[:, 0, 0, 0]).all()  # the mark is only in green
    x_test, y_test = splits["test"]
    assert x_test[:, 0, 31, 31].tolist() == [n_train, n_train + 1, n_train + 2]
    assert y_test.tolist() == [(n_train + 3 + j) % 10 for j in range(3)]


def test_cifar_missing_files_message(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        load_cifar(tmp_path, "cifar10")
    message = str(info.value)
    assert "\n" not in message and str(tmp_path) in message
    for expected in (
        "cifar-10-python.tar.gz",
        "cifar-10-batches-py",
        "data_batch_1",
        "data_batch_5",
        "test_batch",
        "download=True",
    ):
        assert expected in message
    with pytest.raises(ValueError, match="'svhn'.*'cifar10', 'cifar100'"):
        CIFARDataModule(tmp_path, dataset="svhn")


def test_cifar_download_checks_md5(tmp_path, monkeypatch):
    source = write_archive(tmp_path, "cifar10")
    root = tmp_path / "data"
    monkeypatch.setattr(cifar.urllib.request, "urlretrieve", lambda url, dst: shutil.copy(source, dst))
    with pytest.raises(ValueError, match="c58f30108f718f92721af3b95e74349a"):
        CIFARDataModule(root, download=True).prepare_data()
    assert list(root.iterdir()) == []  # no archive with the wrong content left behind
    true_md5 = hashlib.md5(source.read_bytes()).hexdigest()
    monkeypatch.setitem(cifar.SPECS, "cifar10", dataclasses.replace(cifar.SPECS["cifar10"], md5=true_md5))
    dm = CIFARDataModule(root, download=True, batch_size=2)
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.train_tensors[0]) == 10


def test_cifar_datamodule_normalises_after_transfer(tmp_path):
    write_archive(tmp_path, "cifar10")
    dm = CIFARDataModule(tmp_path, batch_size=4)
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.dtype == torch.uint8 and x.shape == (4, 3, 32, 32)
    out, _ = dm.on_after_batch_transfer((x, y), 0)  # no trainer attached: not training, so no augmentation
    assert out.dtype == torch.float32
    assert out[0, 1, 5, 7].item() == pytest.approx((200 / 255 - 0.4822) / 0.2435, rel=1e-5)
    dm.trainer = SimpleNamespace(training=True)
    x = torch.arange(64 * 3 * 32 * 32).remainder(251).to(torch.uint8).view(64, 3, 32, 32)
    augmented, _ = dm.on_after_batch_transfer((x, y), 0)
    plain = normalize(x, cifar.SPECS["cifar10"].mean, cifar.SPECS["cifar10"].std)
    assert augmented.shape == plain.shape and augmented.dtype == torch.float32
    # An image is unchanged only for the centre crop without a flip (1 in 162): most must differ.
    assert sum(not torch.equal(a, p) for a, p in zip(augmented, plain)) > 48


def test_flip():
    x = torch.arange(2 * 3 * 4 * 5, dtype=torch.uint8).view(2, 3, 4, 5)
    assert torch.equal(random_flip(x, p=1.0), torch.flip(x, dims=[3]))
    assert torch.equal(random_flip(x, p=0.0), x)
    out = random_flip(torch.arange(400 * 12).view(400, 1, 3, 4), generator=torch.Generator().manual_seed(0))
    flipped = [
        torch.equal(o, torch.arange(i * 12, i * 12 + 12).view(1, 3, 4).flip(-1)) for i, o in enumerate(out)
    ]
    kept = [torch.equal(o, torch.arange(i * 12, i * 12 + 12).view(1, 3, 4)) for i, o in enumerate(out)]
    assert all(f or k for f, k in zip(flipped, kept)) and 150 < sum(flipped) < 250


def test_crop_is_a_window_of_the_zero_padded_image():
    n, pad = 500, 4
    x = torch.arange(1, n * 3 * 32 * 32 + 1, dtype=torch.int32).view(
        n, 3, 32, 32
    )  # every value distinct, no 0
    reference = torch.zeros(n, 3, 40, 40, dtype=torch.int32)
    reference[:, :, 4:36, 4:36] = x
    out = random_crop(x, pad, generator=torch.Generator().manual_seed(0))
    assert out.shape == x.shape and out.dtype == x.dtype
    windows = torch.stack(
        [
            (out == reference[:, :, dy : dy + 32, dx : dx + 32]).flatten(1).all(1)
            for dy in range(9)
            for dx in range(9)
        ],
        dim=1,
    )
    assert (windows.sum(1) == 1).all()  # each output is exactly one window of its padded image
    dy, dx = windows.float().argmax(1).div(9, rounding_mode="floor"), windows.float().argmax(1).remainder(9)
    assert {0, 8} <= set(dy.tolist()) and {0, 8} <= set(dx.tolist())  # the extreme shifts do occur
    u8 = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    assert random_crop(u8, 4).dtype == torch.uint8 and torch.equal(random_crop(u8, 0), u8)


def test_normalize_known_values():
    x = torch.tensor([0, 51, 255], dtype=torch.uint8).view(1, 1, 1, 3).expand(1, 2, 1, 3)
    out = normalize(x, mean=[0.5, 0.2], std=[0.25, 0.4])
    assert out.dtype == torch.float32
    assert out[0, 0, 0].tolist() == pytest.approx([-2.0, -1.2, 2.0])  # (0.2 - 0.5) / 0.25 = -1.2
    assert out[0, 1, 0].tolist() == pytest.approx([-0.5, 0.0, 2.0])
    with pytest.raises(ValueError, match="3 channels"):
        normalize(torch.zeros(1, 3, 2, 2, dtype=torch.uint8), [0.5], [0.5])


def rank_batches(n, sizes, epoch, seed=0):
    samplers = [
        ShardedBatchSampler(n, sizes, rank=r, world_size=len(sizes), seed=seed) for r in range(len(sizes))
    ]
    for s in samplers:
        s.set_epoch(epoch)
    return [list(s) for s in samplers]


def test_shards_are_disjoint_equal_length_and_cover_the_epoch():
    per_rank = rank_batches(100, [21, 11], epoch=0)
    assert [len(b) for b in per_rank] == [3, 3]  # 100 // 32
    assert all(len(b) == 21 for b in per_rank[0]) and all(len(b) == 11 for b in per_rank[1])
    seen = torch.cat([torch.cat(b) for b in per_rank]).tolist()
    assert len(seen) == len(set(seen)) == 96 and set(seen) <= set(range(100))
    # Same seed and epoch: every simulated rank reproduces its shard; a new epoch reshuffles.
    assert all(torch.equal(a, b) for a, b in zip(per_rank[0], rank_batches(100, [21, 11], epoch=0)[0]))
    assert not torch.equal(per_rank[0][0], rank_batches(100, [21, 11], epoch=1)[0][0])
    epoch1 = torch.cat([torch.cat(b) for b in rank_batches(100, [21, 11], epoch=1)]).tolist()
    assert len(set(epoch1)) == 96


def test_batch_size_changes_apply_from_the_next_epoch():
    sampler = ShardedBatchSampler(60, 10, rank=1, world_size=2)
    running = iter(sampler)
    sampler.set_per_rank_batch_sizes([25, 5])
    assert [len(b) for b in running] == [10, 10, 10]
    assert [len(b) for b in sampler] == [5, 5] and len(sampler) == 2


@pytest.mark.parametrize(
    "sizes, world_size, pattern",
    [
        ([4, 0], 2, "positive ints"),
        ([4, 2.5], 2, "positive ints"),
        ([4, 4, 4], 2, "3 entries for world size 2"),
    ],
)
def test_bad_batch_sizes(sizes, world_size, pattern):
    with pytest.raises(ValueError, match=pattern):
        ShardedBatchSampler(100, sizes, rank=0, world_size=world_size)


def test_eval_batches_split_evenly_and_cover_once():
    per_rank = [eval_batches(103, 10, rank=r, world_size=2) for r in range(2)]
    assert len(per_rank[0]) == len(per_rank[1]) == 6  # ceil(52 / 10)
    assert all(len(b) <= 10 for batches in per_rank for b in batches)
    assert sorted(torch.cat([torch.cat(b) for b in per_rank]).tolist()) == list(range(103))


def test_datamodule_shards_with_trainer_rank_and_world_size():
    loaders = []
    for rank in range(2):
        dm = DigitsDataModule(per_rank_batch_sizes=[21, 11])
        dm.trainer = SimpleNamespace(global_rank=rank, world_size=2)
        dm.setup("fit")
        loaders.append((dm.train_dataloader(), dm.val_dataloader()))
    assert len(loaders[0][0]) == len(loaders[1][0]) == 1437 // 32
    assert [len(x) for x, _ in loaders[0][0]] == [21] * 44 and [len(x) for x, _ in loaders[1][0]] == [11] * 44
    indices = [torch.cat(list(loader.sampler)).tolist() for loader, _ in loaders]
    assert not set(indices[0]) & set(indices[1]) and len(set(indices[0] + indices[1])) == 44 * 32
    assert sum(len(y) for _, loader in loaders for _, y in loader) == 360
    with pytest.raises(ValueError, match="2 entries for world size 3"):
        dm.trainer = SimpleNamespace(global_rank=0, world_size=3)
        dm.train_dataloader()


def test_digits_split_and_standardisation():
    dm = DigitsDataModule()
    dm.setup("fit")
    x, _y = dm.train_tensors
    assert x.shape == (1437, 1, 8, 8) and len(dm.eval_tensors[1]) == 360
    assert x.mean().item() == pytest.approx(0.0, abs=1e-5) and x.std().item() == pytest.approx(1.0, abs=1e-5)
    counts = torch.bincount(dm.eval_tensors[1], minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37  # stratified: about 360 / 10 per class


def test_synthetic_is_deterministic():
    a, b, c = (SyntheticDataModule(num_samples=32, num_eval_samples=8, seed=s) for s in (1, 1, 2))
    for dm in (a, b, c):
        dm.setup()
    assert a.train_tensors[0].shape == (32, 3, 32, 32) and a.train_tensors[0].dtype == torch.uint8
    assert torch.equal(a.train_tensors[0], b.train_tensors[0]) and torch.equal(
        a.eval_tensors[1], b.eval_tensors[1]
    )
    assert not torch.equal(a.train_tensors[0], c.train_tensors[0])


class Probe(pl.LightningModule):
    """Records what Lightning hands the model: sampler epochs, and how batches were preprocessed."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 10))
        self.epochs, self.train_dtypes, self.val_dtypes = [], set(), set()

    def on_train_epoch_start(self):
        self.epochs.append(self.trainer.datamodule._train_sampler.epoch)

    def training_step(self, batch, batch_idx):
        self.train_dtypes.add(batch[0].dtype)
        return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.val_dtypes.add(batch[0].dtype)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_lightning_drives_epochs_and_preprocessing_with_default_sampler_setting():
    dm = SyntheticDataModule(num_samples=32, num_eval_samples=8, image_shape=(3, 8, 8), batch_size=8)
    probe = Probe()
    trainer = single_cpu_trainer(max_epochs=3)
    trainer.fit(probe, datamodule=dm)
    assert probe.epochs == [0, 1, 2]
    assert probe.train_dtypes == probe.val_dtypes == {torch.float32}
    assert trainer.num_training_batches == 4
