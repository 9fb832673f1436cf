"""In-memory datamodules (CIFAR-10/100, MNIST-1D, scikit-learn digits, synthetic, Markov text) with
rank-sharded loaders."""

from lightning_cocod.data.augment import normalize, random_crop, random_flip
from lightning_cocod.data.base import InMemoryDataModule
from lightning_cocod.data.cifar import CIFARDataModule, load_cifar
from lightning_cocod.data.digits import DigitsDataModule
from lightning_cocod.data.markov import MarkovSource, MarkovTextDataModule
from lightning_cocod.data.mnist1d import MNIST1DDataModule
from lightning_cocod.data.sharding import ShardedBatchSampler, TensorLoader, check_batch_sizes, eval_batches
from lightning_cocod.data.synthetic import SyntheticDataModule

__all__ = [
    "CIFARDataModule",
    "DigitsDataModule",
    "InMemoryDataModule",
    "MNIST1DDataModule",
    "MarkovSource",
    "MarkovTextDataModule",
    "ShardedBatchSampler",
    "SyntheticDataModule",
    "TensorLoader",
    "check_batch_sizes",
    "eval_batches",
    "load_cifar",
    "normalize",
    "random_crop",
    "random_flip",
]
