"""Local-SGD: local steps, and a blocking average of the models every ``tau`` steps."""

from __future__ import annotations

from typing import Any

from lightning_cocod.strategies.base import SyncStrategyBase
from lightning_cocod.strategies.cocod import check_period


class LocalSGDMethod(SyncStrategyBase):
    """Every ``tau`` optimizer steps, ``x_i <- mean_j x_j`` (blocking); momentum stays local.

    The non-overlapped baseline of CoCoD-SGD: the same communication per round, paid in full.
    With ``tau=1`` and plain SGD it equals synchronous SGD.

    Args:
        tau: optimizer steps between two averages.
        average_buffers: average BatchNorm running statistics with the parameters.
    """

    def __init__(self, tau: int = 4, **kwargs: Any) -> None:
        self.tau = check_period(type(self).__name__, tau)
        super().__init__(**kwargs)

    def _options(self) -> dict[str, Any]:
        return {"tau": self.tau, **super()._options()}

    def _request_lag(self) -> int:
        return self.tau  # the blocking average couples the workers every tau steps anyway

    def _after_step(self) -> None:
        if self._steps % self.tau == 0:
            handle = self._average_now("round")
            assert self._scratch is not None
            self._record(handle, self._steps, self._scratch.nbytes)
