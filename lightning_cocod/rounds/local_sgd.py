"""Local-SGD's rounds: local steps, and a blocking average of the models every ``tau`` steps."""

from __future__ import annotations

from typing import Any

from lightning_cocod.rounds.base import Rounds
from lightning_cocod.rounds.period import check_period


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
