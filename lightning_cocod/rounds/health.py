"""NaN/Inf on any worker is caught before it reaches another worker's average.

Every rank learns which ranks went bad at the same point (a flag per rank, summed by an
all-reduce), then all raise ``NonFiniteError``, or with ``on_nonfinite="skip"`` the pending update
is dropped and the bad workers restart from a healthy worker's model. ``on_nonfinite="allow"``
does what DDPStrategy does: the values are averaged and saved as they are. The checks are methods
of ``Rounds`` (``base``); what they compute is here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.optim import Optimizer

from lightning_cocod.core import Communicator, FlatBuffer

# What a round does with NaN/Inf on a worker: stop every rank, drop the update and restart the bad
# workers from a healthy one, or average and save them as DDPStrategy does.
ON_NONFINITE = ("raise", "skip", "allow")


class NonFiniteError(FloatingPointError):
    """A worker's model or gradients hold NaN or Inf; raised on every rank alike."""


def health_flags(rank: int, world_size: int, bad: bool, device: torch.device) -> Tensor:
    """One flag per rank, this rank's set if ``bad``: summed over the ranks, every rank reads who is bad."""
    flags = torch.zeros(world_size, dtype=torch.float64, device=device)
    flags[rank] = float(bad)
    return flags


def bad_ranks(flags: Tensor) -> list[int]:
    return [rank for rank, flag in enumerate(flags.tolist()) if flag > 0]


def nonfinite_error(owner: str, bad: list[int], step: int, what: str) -> NonFiniteError:
    return NonFiniteError(
        f"{owner}: non-finite values (NaN/Inf) on rank {', '.join(map(str, bad))} at optimizer step {step} "
        f"({what}); stopped before they reached any other worker's model, and no checkpoint was written from them"
    )


def restart_from_healthy(
    comm: Communicator,
    buffer: FlatBuffer,
    tensors: Sequence[Tensor],
    optimizers: Sequence[Optimizer],
    rank: int,
    bad: list[int],
) -> int:
    """``on_nonfinite="skip"``: the workers that went non-finite take the model of the lowest healthy
    rank and restart their optimizer state (momentum would carry the NaN on); the healthy keep
    theirs. A collective: every rank calls it. Returns the rank the model came from."""
    source = min(set(range(comm.world_size)) - set(bad))
    buffer.pack(tensors)
    comm.broadcast(buffer.buckets, source)
    if rank in bad:
        buffer.unpack(tensors)
        for optimizer in optimizers:
            optimizer.state.clear()
    return source
