"""CoCoD-SGD as a Lightning strategy."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lightning_cocod.core import CoCoDRound
from lightning_cocod.strategies.base import SyncStrategyBase


def check_period(owner: str, tau: Any) -> int:
    # bool is an int subclass: tau=True would silently mean 1.
    if isinstance(tau, bool) or not isinstance(tau, int) or tau < 1:
        raise ValueError(f"{owner}: tau must be a positive integer (optimizer steps per round), got {tau!r}")
    return tau


class CoCoDStrategy(SyncStrategyBase):
    """Computation and communication decoupled SGD (Shen et al., IJCAI 2019, arXiv:1906.12043).

    Every ``tau`` optimizer steps a round ends and the next begins. At the start of a round each
    worker snapshots its model and launches a non-blocking all-reduce of the snapshot on a
    process group of its own; it then takes ``tau`` local steps with no communication, and only
    then waits and merges: ``x_i <- mean_j snap_j + (x_i - snap_i)``. A partial last round is
    merged when fit ends, followed by a plain average so every rank ends with the same weights.

    The merge happens in ``optimizer_step`` rather than in a callback: it has to happen exactly
    once per optimizer step (not per batch: gradient accumulation, manual optimization), before
    any checkpoint callback dumps the weights, and under the same object that owns the
    in-flight handle and the process group. Communication figures are logged by a callback the
    strategy installs (``CommStatsLogger``).

    Args:
        tau: optimizer steps per round (the paper's k); the all-reduce hides behind them.
        average_buffers: round BatchNorm running statistics (floating-point buffers) with the
            parameters; integer buffers always stay local.
    """

    strategy_name = "cocod"
    strategy_description = "CoCoD-SGD: all-reduce of the round-start model overlapped with tau local steps"

    def __init__(self, tau: int = 4, **kwargs: Any) -> None:
        self.tau = check_period(type(self).__name__, tau)
        super().__init__(**kwargs)
        self._round: CoCoDRound | None = None
        self._launch_step = 0

    def _options(self) -> dict[str, Any]:
        return {"tau": self.tau, **super()._options()}

    def _build(self, tensors: list[Tensor]) -> None:
        assert self._comm is not None
        self._round = CoCoDRound(tensors, self._comm, self.weight)

    def _flat_buffers(self) -> list:
        mine = [self._round.snapshot, self._round.average] if self._round is not None else []
        return mine + super()._flat_buffers()

    def _before_step(self) -> None:
        assert self._round is not None
        if not self._round.pending:
            self._round.weight = self.weight
            self._round.begin()
            self._launch_step = self._steps

    def _after_step(self) -> None:
        if self._steps - self._launch_step >= self.tau:
            self._flush()

    def _flush(self) -> None:
        if self._round is not None and self._round.pending:
            handle = self._round.finish()
            self._record(handle, self._launch_step, self._round.nbytes)

    def _abandon_in_flight(self) -> None:
        if self._round is not None:
            self._round.handle = None
