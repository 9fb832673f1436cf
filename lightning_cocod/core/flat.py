"""Persistent flat buffers over a list of tensors.

A round packs the whole model into one contiguous buffer so that a single collective moves it
(gloo runs per-tensor collectives one after another, with a per-message cost: one flat buffer
per round measured 1.5x faster than 62 per-tensor all-reduces for ResNet18 at 300 Mbit/s).
The buffer is allocated once; every tensor gets a view into it, so packing and merging are
``torch._foreach_*`` ops over the views, never a ``torch.cat`` per round, and the model's own
storage is never rebound (unlike ``torch.distributed.algorithms.model_averaging.utils``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


class FlatBuffer:
    """One contiguous buffer per (device, dtype) group, with one view per tensor.

    Tensors of mixed dtypes (e.g. a bf16 embedding next to fp32 weights) get one bucket each,
    so nothing is up-cast; ``views[i]`` always has the shape and dtype of ``tensors[i]``.
    """

    def __init__(self, tensors: Sequence[Tensor]) -> None:
        if not tensors:
            raise ValueError("FlatBuffer needs at least one tensor, got an empty list")
        groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for index, tensor in enumerate(tensors):
            groups.setdefault((tensor.device, tensor.dtype), []).append(index)
        self.buckets: list[Tensor] = []
        self.views: list[Tensor] = [torch.empty(0)] * len(tensors)
        for (device, dtype), indices in groups.items():
            bucket = torch.zeros(sum(tensors[i].numel() for i in indices), dtype=dtype, device=device)
            offset = 0
            for i in indices:
                numel = tensors[i].numel()
                self.views[i] = bucket[offset : offset + numel].view(tensors[i].shape)
                offset += numel
            self.buckets.append(bucket)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buckets)

    def pack(self, tensors: Sequence[Tensor]) -> None:
        """Copy ``tensors`` into the buffer."""
        torch._foreach_copy_(self.views, list(tensors))

    def unpack(self, tensors: Sequence[Tensor]) -> None:
        """Copy the buffer into ``tensors`` (in place: the model keeps its own storage)."""
        torch._foreach_copy_(list(tensors), self.views)

    def copy_(self, other: FlatBuffer) -> None:
        for mine, theirs in zip(self.buckets, other.buckets, strict=True):
            mine.copy_(theirs, non_blocking=True)

    def swap(self, tensors: Sequence[Tensor]) -> None:
        """Exchange the contents of the buffer and ``tensors`` one tensor at a time.

        Evaluation on the averaged model uses this to park the live weights without a third
        full copy of the model: the transient memory is one tensor, not one model.
        """
        for view, tensor in zip(self.views, tensors, strict=True):
            parked = tensor.clone()
            tensor.copy_(view)
            view.copy_(parked)
