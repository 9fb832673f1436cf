"""Rank-sharded batching over in-memory tensors, shared by every datamodule.

Training: all ranks draw the same permutation for an epoch (``seed + epoch``, as
``DistributedSampler`` does) and walk it in global steps of ``sum(b_i)`` consecutive samples, rank
``i`` taking its own ``b_i``-long slice. Shards are therefore disjoint, every rank takes
``N // sum(b_i)`` steps (the remainder is dropped, so no rank waits on a collective another rank
never reaches), and ranks may take different batch sizes (heterogeneous workers).

Evaluation: rank ``i`` takes the contiguous block ``[i*N//W, (i+1)*N//W)`` with no padding, so every
sample is scored exactly once; the blocks are cut into the same number of batches on every rank.

With a ``device`` (a GPU holding the data) the index tensors live there: an epoch's order is drawn
on the host, as everywhere (same seed, same order on every device), and copied over once, so a
step's batch is a gather on the device with no host work or copy of its own.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import Tensor
from torch.utils.data import Sampler


def check_batch_sizes(sizes: Sequence[int], world_size: int) -> list[int]:
    """Validates per-rank batch sizes: positive ints, one per rank."""
    sizes = list(sizes)
    bad = [s for s in sizes if not isinstance(s, numbers.Integral) or isinstance(s, bool) or s < 1]
    if bad:
        raise ValueError(f"per-rank batch sizes must be positive ints, got {sizes}")
    if len(sizes) != world_size:
        raise ValueError(
            f"per-rank batch sizes {sizes} have {len(sizes)} entries for world size {world_size}"
        )
    return [int(s) for s in sizes]


class ShardedBatchSampler(Sampler[Tensor]):
    """Yields this rank's index tensor for each training step of an epoch.

    Lightning calls ``set_epoch`` before each epoch on a loader's ``.sampler``; batch sizes changed
    with ``set_per_rank_batch_sizes`` apply from the next ``__iter__``, i.e. the next epoch.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int | Sequence[int],
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        device: torch.device | str | None = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(
                f"rank={rank} is invalid for world_size={world_size}; accepted: 0..{world_size - 1}"
            )
        sizes = [batch_size] * world_size if isinstance(batch_size, numbers.Integral) else batch_size
        self.per_rank_batch_sizes = check_batch_sizes(sizes, world_size)
        self.num_samples, self.rank, self.world_size = num_samples, rank, world_size
        self.seed, self.epoch = seed, 0
        self.device = torch.device(device) if device is not None else None
        self._skip_epoch, self._skip = -1, 0

    def skip_batches(self, epoch: int, batches: int) -> None:
        """Iterations of ``epoch`` start ``batches`` steps in (resuming mid-epoch); ``len`` stays
        the whole epoch, as Lightning counts the skipped batches as done. Every iteration of that
        epoch skips them: Lightning creates an iterator at set-up and another when the epoch runs."""
        self._skip_epoch, self._skip = epoch, batches

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def set_per_rank_batch_sizes(self, sizes: Sequence[int]) -> None:
        self.per_rank_batch_sizes = check_batch_sizes(sizes, self.world_size)

    def __len__(self) -> int:
        return self.num_samples // sum(self.per_rank_batch_sizes)

    def __iter__(self) -> Iterator[Tensor]:
        # Everything is fixed here, before the first batch is asked for, so a size change made
        # mid-epoch cannot alter the epoch already running.
        sizes = self.per_rank_batch_sizes
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.num_samples, generator=generator)
        step, start = sum(sizes), sum(sizes[: self.rank])
        num_steps = self.num_samples // step
        steps = order[: num_steps * step].view(num_steps, step)
        skip = self._skip if self.epoch == self._skip_epoch else 0
        return iter(to_device(steps[skip:, start : start + sizes[self.rank]].contiguous(), self.device))


def to_device(tensor: Tensor, device: torch.device | None) -> Tensor:
    """``tensor`` on ``device`` (None: where it is), copied from pinned memory without a host sync."""
    if device is None or tensor.device == device:
        return tensor
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def eval_batches(
    num_samples: int,
    batch_size: int,
    rank: int = 0,
    world_size: int = 1,
    device: torch.device | str | None = None,
) -> list[Tensor]:
    """This rank's evaluation batches; equal in number across ranks unless a block has fewer samples
    than that number (only for tiny sets or batch size 1), in which case empty batches are dropped."""
    if batch_size < 1:
        raise ValueError(f"eval batch size must be a positive int, got {batch_size}")
    start, stop = rank * num_samples // world_size, (rank + 1) * num_samples // world_size
    num_batches = max(1, math.ceil(math.ceil(num_samples / world_size) / batch_size))
    return [b for b in torch.arange(start, stop, device=device).tensor_split(num_batches) if len(b)]


class TensorLoader:
    """Iterates ``tuple(t[idx] for t in tensors)`` for each index tensor of ``sampler``, gathered
    where the tensors are (an index elsewhere is moved to them).

    Not a ``torch.utils.data.DataLoader`` on purpose: Lightning only re-wraps DataLoaders with a
    ``DistributedSampler``, so this loader works with the default ``use_distributed_sampler=True``.
    Lightning still finds ``self.sampler.set_epoch`` and calls it before every epoch.
    """

    # Lightning reads ``loader.batch_sampler`` whenever ``loader.sampler`` exists (to warn about
    # shuffled eval loaders), and only calls ``set_epoch`` on ``.sampler`` or ``.batch_sampler.sampler``,
    # so the index batches live in ``.sampler`` and this stays None.
    batch_sampler = None

    def __init__(self, tensors: Sequence[Tensor], sampler: Iterable[Tensor]) -> None:
        if len({len(t) for t in tensors}) != 1:
            raise ValueError(f"tensors differ in length: {[len(t) for t in tensors]}")
        self.tensors, self.sampler = tuple(tensors), sampler

    def __len__(self) -> int:
        return len(self.sampler)

    # Resumable (Lightning checks for this interface): the position within an epoch is not kept
    # here but in the datamodule's state (InMemoryDataModule.state_dict), from Lightning's batch
    # progress; a count of yielded batches would be off by the batch Lightning prefetches.
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        pass

    def __iter__(self) -> Iterator[tuple[Tensor, ...]]:
        for idx in self.sampler:
            yield tuple(t.index_select(0, to_device(idx, t.device)) for t in self.tensors)
