"""Requests every rank must act on at the same step, agreed without a per-step rendezvous.

A worker that is told to stop (SIGTERM on one node of a spot cluster) cannot just leave: the
others would wait in their next collective until the timeout. So each optimizer step every rank
launches a tiny non-blocking all-reduce (a sum) of its request flags, and waits on the one it
launched ``lag`` steps earlier. Every rank thus learns the same sums at the same step, and a
worker never waits for a peer more than ``lag`` steps behind it: with ``lag`` = the round's
period this couples the workers no more than the round's own all-reduce already does.
"""

from __future__ import annotations

from collections import deque

import torch
from torch import Tensor

from lightning_cocod.core.comm import Communicator, Handle


class RequestFlags:
    """A pipeline of flag vectors of ``width`` entries, summed over ranks, ``lag`` steps late."""

    def __init__(self, comm: Communicator, width: int) -> None:
        if width < 1:
            raise ValueError(f"RequestFlags needs at least one flag, got width={width}")
        self.comm, self.width = comm, width
        self._pending: deque[tuple[int, Handle, Tensor]] = deque()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def push(self, step: int, flags: list[float]) -> None:
        """Launch this rank's flags of ``step`` (every rank pushes once per step, in step order)."""
        if len(flags) != self.width:
            raise ValueError(f"expected {self.width} flags, got {len(flags)}")
        buffer = torch.tensor(flags, dtype=torch.float64)
        self._pending.append((step, self.comm.start_mean([buffer], 1.0), buffer))

    def due(self, step: int, lag: int) -> Tensor | None:
        """The summed flags of every step at or before ``step - lag`` not yet returned (added
        together), or None when there is none. Blocks only if a peer is more than ``lag`` behind."""
        return self._collect(lambda launched: launched <= step - lag)

    def drain(self) -> Tensor | None:
        """Wait for everything in flight (at a point every rank reaches at the same step)."""
        return self._collect(lambda launched: True)

    def _collect(self, ready) -> Tensor | None:
        total = None
        while self._pending and ready(self._pending[0][0]):
            _, handle, buffer = self._pending.popleft()
            handle.wait()
            total = buffer if total is None else total + buffer
        return total

    def abandon(self) -> None:
        """Forget what is in flight without waiting (a peer may be gone)."""
        self._pending.clear()
