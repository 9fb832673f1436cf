"""scikit-learn's handwritten digits (1,797 8x8 images): real data that needs no download."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from lightning_cocod.data.base import InMemoryDataModule

NUM_IMAGES = 1797
NUM_TEST = 360  # 1,437 training images; a fixed stratified split so runs are comparable


class DigitsDataModule(InMemoryDataModule):
    """1 x 8 x 8 float images scaled to [0, 1] and standardised with the training mean and std.

    Validation and test both use the 360-image test split: the set is too small to hold out a
    third part, and this module is for demos and tests, not model selection. No augmentation by
    default: flips change what a digit means and 8x8 images leave no room for crops.
    """

    num_classes = 10

    def __init__(
        self,
        batch_size: int = 64,
        per_rank_batch_sizes: Sequence[int] | None = None,
        eval_batch_size: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size, per_rank_batch_sizes, eval_batch_size, seed)
        self.num_train_samples = NUM_IMAGES - NUM_TEST

    def setup(self, stage: str | None = None) -> None:
        if self.train_tensors is not None:
            return
        images, labels = load_digits(return_X_y=True)
        x_train, x_test, y_train, y_test = train_test_split(
            images, labels, test_size=NUM_TEST, stratify=labels, random_state=0
        )
        x_train = torch.tensor(x_train, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
        x_test = torch.tensor(x_test, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
        mean, std = x_train.mean(), x_train.std()
        self.train_tensors = ((x_train - mean) / std, torch.tensor(y_train, dtype=torch.long))
        self.eval_tensors = ((x_test - mean) / std, torch.tensor(y_test, dtype=torch.long))
