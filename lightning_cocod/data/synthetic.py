"""Random CIFAR-shaped data for smoke tests and throughput measurements."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lightning_cocod.data.base import InMemoryDataModule, is_int, require


class SyntheticDataModule(InMemoryDataModule):
    """Uniform random uint8 images with random labels, both fixed by ``seed``.

    It takes the same path as CIFAR (uint8 in memory, crop/flip and normalisation on the device), so
    speed measured here is the speed of the real pipeline. The labels carry no signal: accuracy stays
    at chance.
    """

    def __init__(
        self,
        num_samples: int = 4096,
        num_classes: int = 10,
        image_shape: Sequence[int] = (3, 32, 32),
        batch_size: int = 128,
        seed: int = 0,
        num_eval_samples: int = 512,
        per_rank_batch_sizes: Sequence[int] | None = None,
        eval_batch_size: int | None = None,
        augment: bool = True,
    ) -> None:
        for name, value in (
            ("num_samples", num_samples),
            ("num_eval_samples", num_eval_samples),
            ("num_classes", num_classes),
        ):
            require(is_int(value) and value >= 1, "SyntheticDataModule", name, value, "an integer >= 1")
        is_list = isinstance(image_shape, Sequence) and not isinstance(image_shape, str)
        shape = list(image_shape) if is_list else []
        require(
            bool(shape) and all(is_int(d) and d >= 1 for d in shape),
            "SyntheticDataModule",
            "image_shape",
            image_shape,
            "positive integers, channels first, e.g. [3, 32, 32]",
        )
        channels = image_shape[0]
        # Statistics of the uniform distribution on [0, 1]: mean 1/2, std 1/sqrt(12).
        super().__init__(
            batch_size,
            per_rank_batch_sizes,
            eval_batch_size,
            seed,
            augment,
            mean=[0.5] * channels,
            std=[12**-0.5] * channels,
        )
        self.num_samples, self.num_eval_samples = num_samples, num_eval_samples
        self.num_classes, self.image_shape = num_classes, tuple(image_shape)
        self.num_train_samples = num_samples

    def setup(self, stage: str | None = None) -> None:
        if self.train_tensors is not None:
            return
        g = torch.Generator().manual_seed(self.seed)
        n = self.num_samples + self.num_eval_samples
        x = torch.randint(0, 256, (n, *self.image_shape), dtype=torch.uint8, generator=g)
        y = torch.randint(0, self.num_classes, (n,), generator=g)
        self.train_tensors = (x[: self.num_samples], y[: self.num_samples])
        self.eval_tensors = (x[self.num_samples :], y[self.num_samples :])
