"""CIFAR-10/100 from the official "python version" archives, decoded once into uint8 tensors."""

from __future__ import annotations

import hashlib
import os
import pickle
import tarfile
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lightning_cocod._files import atomic_write
from lightning_cocod.data.base import InMemoryDataModule


@dataclass(frozen=True)
class _CifarSpec:
    archive: str
    md5: str
    folder: str
    train_files: tuple[str, ...]
    test_file: str
    label_key: bytes
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @property
    def url(self) -> str:
        return f"https://www.cs.toronto.edu/~kriz/{self.archive}"


NUM_TRAIN = 50_000  # training images, in CIFAR-10 as in CIFAR-100
# Mean and std of all training pixels per channel (x / 255). kuangliu/pytorch-cifar's oft-copied
# std (0.2023, 0.1994, 0.2010) is the mean of per-image stds, not the dataset std; see
# kuangliu/pytorch-cifar issues #19 and #135.
SPECS = {
    "cifar10": _CifarSpec(
        archive="cifar-10-python.tar.gz",
        md5="c58f30108f718f92721af3b95e74349a",
        folder="cifar-10-batches-py",
        train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
        test_file="test_batch",
        label_key=b"labels",
        mean=(0.4914, 0.4822, 0.4465),
        std=(0.2470, 0.2435, 0.2616),
    ),
    "cifar100": _CifarSpec(
        archive="cifar-100-python.tar.gz",
        md5="eb9058c3a382ffc7106e4002c42a8d85",
        folder="cifar-100-python",
        train_files=("train",),
        test_file="test",
        label_key=b"fine_labels",
        mean=(0.5071, 0.4865, 0.4409),
        std=(0.2673, 0.2564, 0.2762),
    ),
}


def _spec(dataset: str) -> _CifarSpec:
    if dataset not in SPECS:
        raise ValueError(f"CIFAR: dataset={dataset!r} is invalid; accepted: {', '.join(map(repr, SPECS))}")
    return SPECS[dataset]


def _md5(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "md5").hexdigest()


def download(spec: _CifarSpec, root: Path) -> None:
    """Fetches the archive into ``root`` unless a copy with the right md5 is there already."""
    target = root / spec.archive
    if target.is_file() and _md5(target) == spec.md5:
        return

    def fetch_and_check(partial: Path) -> None:  # never a truncated or wrong archive under the real name
        urllib.request.urlretrieve(spec.url, partial)
        actual = _md5(partial)
        if actual != spec.md5:
            raise ValueError(f"download of {spec.url} has md5 {actual}, expected {spec.md5}; file removed")

    atomic_write(target, fetch_and_check)


def _decode(entry: dict, label_key: bytes) -> tuple[Tensor, Tensor]:
    # Each row is 3072 bytes: the 1024 red values of the 32x32 image row-major, then green, then blue.
    data = np.asarray(entry[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    return torch.from_numpy(data.copy()), torch.tensor(entry[label_key], dtype=torch.long)


def load_cifar(root: str | os.PathLike, dataset: str = "cifar10") -> dict[str, tuple[Tensor, Tensor]]:
    """``{"train": (x, y), "test": (x, y)}`` with ``x`` uint8 N x 3 x 32 x 32, from the extracted
    folder in ``root`` if it is complete, else from the archive. The files are pickles, which can run
    code: only read archives from the official source (``download`` checks the md5)."""
    spec, root = _spec(dataset), Path(root)
    names = (*spec.train_files, spec.test_file)
    folder, archive = root / spec.folder, root / spec.archive
    if all((folder / n).is_file() for n in names):
        entries = {n: pickle.loads((folder / n).read_bytes(), encoding="bytes") for n in names}
    elif archive.is_file():
        with tarfile.open(archive, "r:gz") as tar:
            entries = {n: pickle.load(tar.extractfile(f"{spec.folder}/{n}"), encoding="bytes") for n in names}
    else:
        raise FileNotFoundError(
            f"{dataset} not found in {root}: expected {spec.archive} or the folder {spec.folder}/ with "
            f"{', '.join(names)}; download=True fetches them"
        )
    train = [_decode(entries[n], spec.label_key) for n in spec.train_files]
    return {
        "train": (torch.cat([x for x, _ in train]), torch.cat([y for _, y in train])),
        "test": _decode(entries[spec.test_file], spec.label_key),
    }


class CIFARDataModule(InMemoryDataModule):
    """CIFAR-10/100 with random crop (4-pixel padding) and horizontal flip on the training device.

    Validation uses the test set, as kuangliu/pytorch-cifar and most CIFAR papers report it; there is
    no held-out part of the training set.
    """

    def __init__(
        self,
        root: str | os.PathLike = "data",
        dataset: str = "cifar10",
        batch_size: int = 128,
        per_rank_batch_sizes: Sequence[int] | None = None,
        eval_batch_size: int | None = None,
        seed: int = 0,
        augment: bool = True,
        download: bool = False,
    ) -> None:
        spec = _spec(dataset)
        super().__init__(
            batch_size, per_rank_batch_sizes, eval_batch_size, seed, augment, mean=spec.mean, std=spec.std
        )
        self.root, self.dataset, self.download = Path(root), dataset, download
        self.num_classes = 100 if dataset == "cifar100" else 10
        self.num_train_samples = NUM_TRAIN

    def prepare_data(self) -> None:
        # Lightning runs this on one process per node, so ranks do not download concurrently.
        if self.download:
            download(_spec(self.dataset), self.root)

    def setup(self, stage: str | None = None) -> None:
        if self.train_tensors is None:
            splits = load_cifar(self.root, self.dataset)
            self.train_tensors, self.eval_tensors = splits["train"], splits["test"]
