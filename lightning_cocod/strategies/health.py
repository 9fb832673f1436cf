"""NaN/Inf on any worker is caught before it reaches another worker's average.

Every rank learns which ranks went bad at the same point (a flag per rank, summed by an
all-reduce), then all raise ``NonFiniteError``, or with ``on_nonfinite="skip"`` the pending update
is dropped and the bad workers restart from a healthy worker's model.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from lightning_cocod.strategies.rounds import Rounds

log = logging.getLogger(__name__)


class NonFiniteError(FloatingPointError):
    """A worker's model or gradients hold NaN or Inf; raised on every rank alike."""


class NonFinitePolicy:
    """Mixin of ``Rounds``: the non-finite checks its rounds and averages call."""

    def health_flags(self: Rounds, bad: bool, device: torch.device | None = None) -> Tensor:
        flags = torch.zeros(self.world_size, dtype=torch.float64, device=device or self.device)
        flags[self.rank] = float(bad)
        return flags

    def agree_finite(self: Rounds, bad: bool, what: str) -> None:
        assert self.comm is not None
        flags = self.health_flags(bad)
        self.comm.start_mean([flags], 1.0).wait()  # weight 1: the sum of everyone's flags
        if self.raise_if_nonfinite(flags, what):
            # Recovered (on_nonfinite="skip"): what was packed for the average is stale.
            self.scratch_buffer().pack(self.tensors)

    def raise_if_nonfinite(self: Rounds, flags: Tensor, what: str) -> bool:
        """Raise naming the bad ranks; with ``on_nonfinite="skip"`` recover instead and return True
        (the caller then drops the pending update)."""
        bad = [rank for rank, flag in enumerate(flags.tolist()) if flag > 0]
        if not bad:
            return False
        if self.on_nonfinite == "skip" and len(bad) < self.world_size:
            self._recover_from(min(set(range(self.world_size)) - set(bad)), bad, what)
            return True
        raise NonFiniteError(
            f"{self.owner}: non-finite values (NaN/Inf) on rank {', '.join(map(str, bad))} at "
            f"optimizer step {self.steps} ({what}); stopped before they reached any other worker's "
            "model, and no checkpoint was written from them"
        )

    def _recover_from(self: Rounds, source: int, bad: list[int], what: str) -> None:
        """Workers that went non-finite take the model of a healthy one and restart their optimizer
        state (momentum would carry the NaN on); the healthy keep theirs."""
        assert self.comm is not None
        buffer = self.scratch_buffer()
        buffer.pack(self.tensors)
        self.comm.broadcast(buffer.buckets, source)
        if self.rank in bad:
            buffer.unpack(self.tensors)
            for optimizer in self.optimizers:
                optimizer.state.clear()
        self.skipped.append((self.steps, bad))
        if self.rank == 0:
            log.warning(
                f"non-finite values on rank {bad} at optimizer step {self.steps} ({what}): update skipped, "
                f"rank(s) {bad} restarted from rank {source}'s model (on_nonfinite='skip')"
            )
