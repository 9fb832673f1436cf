"""Local-SGD under the Trainer: ``rounds.LocalSGDRounds`` run from the hooks of ``SyncStrategyBase``."""

from __future__ import annotations

from functools import partial
from typing import Any

from lightning_cocod.rounds.local_sgd import LocalSGDRounds
from lightning_cocod.strategies.base import SyncStrategyBase, of_rounds


class LocalSGDMethod(SyncStrategyBase):
    """Every ``tau`` optimizer steps, ``x_i <- mean_j x_j`` (blocking); momentum stays local.

    The non-overlapped baseline of CoCoD-SGD: the same communication per round, paid in full.
    With ``tau=1`` and plain SGD it equals synchronous SGD.

    Args:
        tau: optimizer steps between two averages.
        average_buffers: average BatchNorm running statistics with the parameters.
        compression: None, "bf16" or "int8": each average sent as encoded deltas from the last
            one (see ``CoCoDMethod``); ``error_feedback`` keeps what encoding dropped for the next.
    """

    tau = of_rounds("tau")

    def __init__(
        self, tau: int = 4, compression: str | None = None, error_feedback: bool = True, **kwargs: Any
    ) -> None:
        rounds = partial(LocalSGDRounds, tau=tau, compression=compression, error_feedback=error_feedback)
        super().__init__(rounds, **kwargs)
