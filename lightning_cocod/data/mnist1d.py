"""MNIST-1D (Greydanus, "Scaling down deep learning", 2020): a small task on which methods differ.

Digits and CIFAR behave differently on a CPU: digits saturates (every method reaches 99-100%), CIFAR
needs a download. MNIST-1D is generated procedurally by the ``mnist1d`` package (10 one-dimensional
digit templates, padded, sheared, scaled, translated and noised into 40-sample signals), so it needs
no download, and a 1-D CNN reaches about 94% on the published 4,000/1,000 split, leaving room to
see a method lose accuracy. Published test accuracies: logistic regression ~32%, MLP ~68%, CNN ~94%,
GRU ~91%.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from lightning_cocod._files import atomic_write
from lightning_cocod.data.base import InMemoryDataModule, is_int, require

log = logging.getLogger(__name__)

_CACHE_VERSION = 1  # bump when the arrays written to the cache change meaning


def generate_mnist1d(num_samples: int, data_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Signals ``(num_samples, 40)`` float32 and labels ``(num_samples,)`` int64, in the generator's
    own shuffled order, standardised over the whole set as the generator does.

    The generator seeds Python's and numpy's global random state; both are restored, so asking for
    the data does not change what a seeded program draws next.
    """
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed, args.train_split = num_samples, data_seed, 1.0
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        data = make_dataset(args)
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    return data["x"].astype(np.float32), data["y"].astype(np.int64)


class MNIST1DDataModule(InMemoryDataModule):
    """MNIST-1D signals ``(1, 40)`` with train/validation/test splits, rank-sharded like the others.

    ``num_samples`` signals are generated (a multiple of 10: the generator makes the same number of
    each digit) from ``data_seed``, which fixes the data set; ``seed`` fixes only the order of the
    training batches. The last ``test_fraction`` of the generator's (already shuffled) order is the
    test set, the ``val_fraction`` before it the validation set, the rest the training set. The
    default 12,000 gives 8,000 / 2,000 / 2,000.

    Generation takes about 2 s per 10,000 signals; the result is cached in ``cache_dir`` (default
    ``~/.cache/lightning_cocod/mnist1d``, or under ``$XDG_CACHE_HOME``) under a name derived from
    what determines it, written whole or not at all, and regenerated if the file is unreadable or
    does not match. ``prepare_data`` (one process per node) fills the cache before the ranks read it.
    """

    num_classes = 10

    def __init__(
        self,
        num_samples: int = 12_000,
        val_fraction: float = 1 / 6,
        test_fraction: float = 1 / 6,
        batch_size: int = 32,
        per_rank_batch_sizes: Sequence[int] | None = None,
        eval_batch_size: int | None = None,
        seed: int = 0,
        data_seed: int = 42,
        cache_dir: str | os.PathLike | None = None,
    ) -> None:
        owner = "MNIST1DDataModule"
        enough = is_int(num_samples) and num_samples >= 30 and num_samples % 10 == 0
        accepted = "a multiple of 10 (one tenth per digit), at least 30"
        require(enough, owner, "num_samples", num_samples, accepted)
        for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            fraction = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1
            require(fraction, owner, name, value, "a number strictly between 0 and 1")
        held_out = val_fraction + test_fraction
        accepted = "less than 1 (the rest is the training set)"
        require(held_out < 1, owner, "val_fraction + test_fraction", held_out, accepted)
        require(is_int(data_seed), owner, "data_seed", data_seed, "an integer")
        super().__init__(batch_size, per_rank_batch_sizes, eval_batch_size, seed)
        self.num_samples, self.data_seed = int(num_samples), int(data_seed)  # numpy's would not go into JSON
        self.num_test = max(1, round(num_samples * test_fraction))
        self.num_val = max(1, round(num_samples * val_fraction))
        self.num_train_samples = num_samples - self.num_test - self.num_val
        accepted = "enough signals to leave a training set after the validation and test sets"
        require(self.num_train_samples >= 1, owner, "num_samples", num_samples, accepted)
        cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        self.cache_dir = Path(cache_dir) if cache_dir is not None else cache_home / "lightning_cocod/mnist1d"

    @property
    def cache_path(self) -> Path:
        key = json.dumps({"v": _CACHE_VERSION, "num_samples": self.num_samples, "data_seed": self.data_seed})
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        return self.cache_dir / f"mnist1d-{self.num_samples}-seed{self.data_seed}-{digest}.npz"

    def prepare_data(self) -> None:
        self._load_or_generate()

    def _read_cache(self) -> tuple[np.ndarray, np.ndarray] | None:
        path = self.cache_path
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as cached:
                x, y = cached["x"], cached["y"]
        except Exception as err:  # noqa: BLE001 (a damaged or foreign file is regenerated, never trusted)
            log.warning(f"MNIST-1D cache {path} is unreadable ({type(err).__name__}: {err}); regenerating it")
            return None
        if x.shape != (self.num_samples, 40) or y.shape != (self.num_samples,) or x.dtype != np.float32:
            log.warning(f"MNIST-1D cache {path} holds other data (shape {x.shape}); regenerating it")
            return None
        return x, y.astype(np.int64)

    def _load_or_generate(self) -> tuple[np.ndarray, np.ndarray]:
        cached = self._read_cache()
        if cached is not None:
            return cached
        x, y = generate_mnist1d(self.num_samples, self.data_seed)
        buffer = io.BytesIO()
        np.savez(buffer, x=x, y=y)
        try:
            # Whole or absent for a reader (another rank, another run), even with several writers.
            atomic_write(self.cache_path, buffer.getvalue())
        except OSError as err:  # a read-only home still trains, it only regenerates each time
            log.warning(f"MNIST-1D: could not cache the data in {self.cache_dir} ({err}); using it uncached")
        return x, y

    def setup(self, stage: str | None = None) -> None:
        if self.train_tensors is not None:
            return
        x, y = self._load_or_generate()
        signals, labels = torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y)
        n_train = self.num_train_samples
        n_eval = n_train + self.num_val
        self.train_tensors = (signals[:n_train], labels[:n_train])
        self.eval_tensors = (signals[n_train:n_eval], labels[n_train:n_eval])
        self.test_tensors = (signals[n_eval:], labels[n_eval:])
