"""Local-SGD: local steps, and a blocking average of the models every ``tau`` steps."""

from __future__ import annotations

from functools import partial
from typing import Any

from lightning_cocod.strategies.base import SyncStrategyBase, of_rounds
from lightning_cocod.strategies.cocod import check_period
from lightning_cocod.strategies.rounds import Rounds


class LocalSGDRounds(Rounds):
    """Local-SGD's rounds (see ``LocalSGDMethod``)."""

    def __init__(self, owner: str, tau: int = 4, **common: Any) -> None:
        self.tau = check_period(owner, tau)
        super().__init__(owner, **common)

    def options(self) -> dict[str, Any]:
        return {"tau": self.tau, **super().options()}

    def request_lag(self) -> int:
        return self.tau  # the blocking average couples the workers every tau steps anyway

    def figures(self) -> dict[str, float]:
        return {**super().figures(), "comm/tau": float(self.tau)}

    def end_step(self) -> None:
        if self.steps % self.tau == 0:
            handle = self.average_now("round", comm=self.round_comm)
            self.record(handle, self.steps, self.scratch_buffer().nbytes)


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
