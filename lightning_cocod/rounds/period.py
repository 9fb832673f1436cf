"""The period rule: a round is ``tau`` optimizer steps, a positive integer (or, for CoCoD-SGD,
``"auto"``: see ``auto``)."""

from __future__ import annotations

from typing import Any

from lightning_cocod._options import positive_int

PERIOD = "a positive integer (optimizer steps per round)"


def check_period(owner: str, tau: Any, accepted: str = PERIOD, option: str = "tau") -> int:
    return positive_int(owner, option, tau, accepted)
