"""Common datamodule over in-memory tensors: rank-sharded loaders and batch-side preprocessing."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import pytorch_lightning as pl
import torch
from torch import Tensor

from lightning_cocod._options import require  # noqa: F401 - the data modules import it from here
from lightning_cocod.data.augment import normalize, random_crop, random_flip
from lightning_cocod.data.sharding import (
    ShardedBatchSampler,
    TensorLoader,
    check_batch_sizes,
    eval_batches,
    to_device,
)


def is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class InMemoryDataModule(pl.LightningDataModule):
    """Subclasses fill ``train_tensors`` and ``eval_tensors`` (``(x, y)`` pairs) in ``setup``, and set
    ``num_train_samples``, the training set's size known without loading it (the app checks that a
    global batch fits), in ``__init__``.

    ``x`` is either uint8 images, normalised on the device with ``mean``/``std`` after transfer, or
    float tensors already normalised. Training batches are cropped (``crop_padding``) and flipped
    (``flip``) on the device when ``augment`` is set. Validation uses ``eval_tensors``; test uses
    ``test_tensors`` when a subclass fills it (a held-out test split), else ``eval_tensors`` too.

    Rank and world size come from the attached trainer when the loaders are built; without a
    trainer the module behaves as a single process. Fit with ``trainer.fit(model, datamodule=dm)``:
    passing the loaders alone would skip ``on_after_batch_transfer`` and hand the model uint8 images.

    When the trainer's device is an accelerator (a GPU), the tensors move there once, when a
    loader is first built, and every batch is gathered there with an index already on the device:
    a step costs no host gather, no host-to-device copy and no host sync. On the CPU nothing moves.
    """

    def __init__(
        self,
        batch_size: int,
        per_rank_batch_sizes: Sequence[int] | None = None,
        eval_batch_size: int | None = None,
        seed: int = 0,
        augment: bool = False,
        crop_padding: int = 4,
        flip: bool = True,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        check_batch_sizes([batch_size], 1)
        if per_rank_batch_sizes is not None:
            per_rank_batch_sizes = check_batch_sizes(per_rank_batch_sizes, len(per_rank_batch_sizes))
        self.batch_size = batch_size
        self.per_rank_batch_sizes = per_rank_batch_sizes
        self.eval_batch_size = eval_batch_size or 2 * batch_size  # no activations kept for backward
        self.seed, self.augment, self.crop_padding, self.flip = seed, augment, crop_padding, flip
        self.mean, self.std = mean, std
        self.train_tensors: tuple[Tensor, Tensor] | None = None
        self.eval_tensors: tuple[Tensor, Tensor] | None = None
        self.test_tensors: tuple[Tensor, Tensor] | None = None
        self._train_sampler: ShardedBatchSampler | None = None
        self._resume: dict | None = None  # position of a saved run, from load_state_dict
        self._stats_on_device: dict[torch.device, tuple[Tensor, Tensor]] = {}

    def _placed(self, name: str) -> tuple[Tensor, Tensor]:
        """``self.<name>`` where the loaders gather, the trainer's root device unless it is the CPU,
        moved there once (the attribute then holds the copy)."""
        tensors = getattr(self, name)
        if tensors is None:
            raise RuntimeError(f"{type(self).__name__}: call setup() before asking for a dataloader")
        device = getattr(getattr(self.trainer, "strategy", None), "root_device", None)
        if not isinstance(device, torch.device) or device.type == "cpu":
            device = torch.device("cpu")
        if any(t.device != device for t in tensors):
            tensors = tuple(t.to(device) for t in tensors)
            setattr(self, name, tensors)
        return tensors

    def _rank_and_world_size(self) -> tuple[int, int]:
        if self.trainer is None:
            return 0, 1
        return self.trainer.global_rank, self.trainer.world_size

    @property
    def global_batch_size(self) -> int:
        """Samples per step over all ranks: what linear LR scaling should be based on."""
        if self.per_rank_batch_sizes is not None:
            return sum(self.per_rank_batch_sizes)
        return self.batch_size * self._rank_and_world_size()[1]

    def set_per_rank_batch_sizes(self, sizes: Sequence[int]) -> None:
        """Rank ``i`` takes ``sizes[i]`` samples per step from the next epoch on.

        Lightning counts the batches of an epoch once, when it loads the train loader; if
        ``sum(sizes)`` changes the number of steps per epoch, fit with
        ``Trainer(reload_dataloaders_every_n_epochs=1)`` so that it counts again.
        """
        if self._train_sampler is not None:
            self._train_sampler.set_per_rank_batch_sizes(sizes)
            self.per_rank_batch_sizes = self._train_sampler.per_rank_batch_sizes
        else:  # the length is checked against the world size once the loader is built
            self.per_rank_batch_sizes = check_batch_sizes(sizes, len(sizes))

    def train_dataloader(self) -> TensorLoader:
        tensors = self._placed("train_tensors")
        rank, world_size = self._rank_and_world_size()
        sizes = self.per_rank_batch_sizes or [self.batch_size] * world_size
        sizes = check_batch_sizes(sizes, world_size)
        device = tensors[0].device
        sampler = ShardedBatchSampler(len(tensors[0]), sizes, rank, world_size, self.seed, device=device)
        if len(sampler) == 0:
            raise ValueError(
                f"{type(self).__name__}: {len(tensors[0])} training samples are fewer than one "
                f"global batch of {sum(sizes)}"
            )
        if self._resume is not None:
            # Continue where the saved run was, so a resumed run sees the same batches as one
            # that never stopped. Lightning may build this loader (and an iterator) before it
            # restores its own loops, e.g. for trainer.estimated_stepping_batches in
            # configure_optimizers: so the position comes from our own saved state.
            epoch, done = self._resume["epoch"], self._resume["batches_done"]
            if done >= len(sampler):  # saved at the end of an epoch: the next one starts afresh
                epoch, done = epoch + 1, 0
            sampler.set_epoch(epoch)
            sampler.skip_batches(epoch, done)
            self._resume = None
        self._train_sampler = sampler
        return TensorLoader(tensors, sampler)

    def state_dict(self) -> dict:
        trainer = self.trainer
        if trainer is None or not hasattr(trainer, "fit_loop"):
            return {}
        return {
            "epoch": trainer.current_epoch,
            "batches_done": trainer.fit_loop.epoch_loop.batch_progress.current.processed,
            "per_rank_batch_sizes": self.per_rank_batch_sizes,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        # Lightning calls this before it asks for the train loader, when resuming.
        if state_dict:
            self._resume = state_dict
            if state_dict.get("per_rank_batch_sizes") is not None:
                self.per_rank_batch_sizes = list(state_dict["per_rank_batch_sizes"])

    def _eval_loader(self, name: str = "eval_tensors") -> TensorLoader:
        tensors = self._placed(name)
        rank, world_size = self._rank_and_world_size()
        batches = eval_batches(len(tensors[0]), self.eval_batch_size, rank, world_size, tensors[0].device)
        return TensorLoader(tensors, batches)

    def val_dataloader(self) -> TensorLoader:
        return self._eval_loader()

    def test_dataloader(self) -> TensorLoader:
        return self._eval_loader("test_tensors" if self.test_tensors is not None else "eval_tensors")

    def on_after_batch_transfer(
        self, batch: tuple[Tensor, Tensor], dataloader_idx: int
    ) -> tuple[Tensor, Tensor]:
        x, y = batch
        if self.augment and self.trainer is not None and self.trainer.training:
            x = random_crop(x, self.crop_padding)
            if self.flip:
                x = random_flip(x)
        if x.dtype == torch.uint8:
            if self.mean is None or self.std is None:
                raise ValueError(f"{type(self).__name__}: uint8 images need mean and std to be normalised")
            if x.device not in self._stats_on_device:  # once per device, without a host sync
                self._stats_on_device[x.device] = (
                    to_device(torch.tensor(self.mean, dtype=torch.float32), x.device),
                    to_device(torch.tensor(self.std, dtype=torch.float32), x.device),
                )
            x = normalize(x, *self._stats_on_device[x.device])
        return x, y
