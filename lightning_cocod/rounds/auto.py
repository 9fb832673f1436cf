"""``tau="auto"``: the controller that CoCoD-SGD's rounds consult for their period.

The rule itself is ``core.adapt.AdaptivePeriod`` (the shortest period that hides the round's
communication and amortises its own cost). This adds what a run needs around it: the figures a
rank sends with a round (and reads back, summed over the ranks, with the next), the history of
periods, the one warning when ``tau_max`` keeps a round exposed, and the state a checkpoint keeps.
Why the default ``tau_max`` is what it is: ``core.adapt.SAFE_TAU_MAX`` and docs/methods.md.
"""

from __future__ import annotations

import logging
from typing import Any

from lightning_cocod._options import count, invalid, is_int, is_number, positive_int
from lightning_cocod.core import CommStats, Handle
from lightning_cocod.core.adapt import AdaptivePeriod, safe_tau_max

log = logging.getLogger(__name__)

# What a rank sends for the period: an earlier round's communication seconds, seconds per step and
# seconds of the round's own work, then 1 (so the sum over ranks counts the ranks that sent any).
FIGURES = 3
MEASURED = ("comm_seconds", "step_seconds", "round_seconds", "round_samples", "shorter_asks")


class AutoPeriod:
    """The period of CoCoD-SGD's next round, from figures every rank agrees on. ``rule``: more of
    ``AdaptivePeriod``'s arguments (the outer round's ``overlap="auto"`` chooses its overlap with
    this, within [1, tau], from where it starts and by hiding alone)."""

    def __init__(self, owner: str, tau_min: Any, tau_max: Any, progress: float, **rule: Any) -> None:
        self.owner = owner
        tau_min = 1 if tau_min is None else positive_int(owner, "tau_min", tau_min)
        if tau_max is None:  # the safe bound, or the shortest period asked for if that is longer
            tau_max = max(safe_tau_max(progress), tau_min)
        tau_max = positive_int(owner, "tau_max", tau_max)
        if tau_min > tau_max:
            raise invalid(owner, "tau_min", tau_min, f"a period no longer than tau_max={tau_max}")
        self.period = AdaptivePeriod(tau_min, tau_max, **rule)
        self.start()

    @property
    def tau(self) -> int:
        return self.period.tau

    def start(self) -> None:
        """A fit begins: nothing of this fit is measured yet."""
        # The last timed round: its handle (communication time, once readable), seconds per step,
        # seconds of own work. Figures carried over from a checkpoint until then.
        self._timing: tuple[Handle, float, float] | None = None
        self._measured: tuple[float, ...] | None = None
        self._rounds_finished = 0
        self._bound_told = False  # the hiding period above tau_max is said once a fit
        self.last: tuple[float, ...] = (0.0,) * FIGURES  # the figures of the last update, as received

    def abandon(self) -> None:
        self._timing = None

    def figures_to_send(self) -> tuple[float, ...]:
        """The newest readable figures and a 1, or zeros when nothing is measured yet."""
        if self._timing is not None and self._timing[0].figures_ready():
            handle, step_seconds, round_seconds = self._timing
            self._measured = (handle.comm_seconds, step_seconds, round_seconds)
        return (*self._measured, 1.0) if self._measured is not None else (0.0,) * (FIGURES + 1)

    def after_round(
        self, received: list[float], handle: Handle, steps: int, compute: float, cost: float
    ) -> int:
        """A round is merged: fold in the figures ``received`` with it (summed over the ranks),
        time this one for a later round (``steps`` taken in ``compute`` seconds, ``cost`` seconds
        of its own work); returns the period of the next round."""
        ranks = received[FIGURES]
        if ranks > 0:  # the mean over the ranks that had figures to send
            self.last = tuple(figure / ranks for figure in received[:FIGURES])
            self.period.update(*self.last)
        # A fit's first round pays one-time costs (allocations, the group's first collective): it
        # is not timed.
        if self._rounds_finished > 0 and steps > 0:
            self._timing = (handle, compute / steps, cost)
        self._rounds_finished += 1
        return self.period.tau

    def warn_if_bound_binds(self, stats: CommStats, compression: str | None) -> None:
        """Once a fit, on rank 0 (the caller's test): the link needs a longer period to hide a round
        than ``tau_max`` allows, and communication stays exposed. The exposure quoted is the run's
        own figure, ``stats`` (what ``stats.summary()`` reports), never an estimate beside it."""
        hiding, bound = self.period.hiding_period(), self.period.tau_max
        exposed, comm = stats.exposed_seconds, stats.comm_seconds
        if self._bound_told or hiding is None or hiding <= bound or exposed <= 0.0 or comm <= 0.0:
            return
        self._bound_told = True
        step = self.period.step_seconds or 0.0
        codec = f"compression={compression!r} rounds" if compression is not None else "fp32 rounds"
        fewer = "" if compression == "int8" else "send fewer bytes (compression='int8'), "
        log.warning(
            f"CoCoD-SGD tau='auto': hiding a round of this link ({self.period.comm_seconds or 0.0:.3f} s of "
            f"communication with {codec}, {step:.3f} s per step) takes tau={hiding}, above tau_max={bound}: "
            f"{exposed:.3f} s of the {comm:.3f} s of communication so far stayed exposed "
            f"({1.0 - stats.hidden_fraction:.0%}); {fewer}allow tau_max={hiding} at the accuracy a longer "
            "period costs, or use Local-SGD, which loses less accuracy at long periods"
        )

    # -- what a checkpoint keeps ---------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        self.figures_to_send()  # the newest readable figures
        adaptive = {k: list(v) if isinstance(v, list) else v for k, v in vars(self.period).items()}
        return {"adaptive": adaptive, "measured": self._measured}

    def load_state(self, state: dict[str, Any], tau: int) -> int:
        """What was measured carries over (checked as strictly as options: a state may have been
        edited); the bounds and rules are this fit's. Returns the saved period ``tau`` within them."""
        saved = state["adaptive"]
        if not isinstance(saved, dict):
            raise invalid(self.owner, "the state's adaptive", saved, "a dict of the figures measured")
        measured = {key: _checked_figure(self.owner, key, saved[key]) for key in MEASURED if key in saved}
        figures = state.get("measured")
        # Older checkpoints sent zeros for "nothing measured", and had no round cost.
        if figures is not None and (
            not isinstance(figures, (list, tuple))
            or len(figures) not in (2, 3)
            or not all(_seconds(f) for f in figures)
        ):
            raise invalid(
                self.owner, "the state's measured", figures, "None or 2 or 3 numbers of seconds >= 0"
            )
        for key, value in measured.items():
            setattr(self.period, key, value)
        self.period.tau = min(max(tau, self.period.tau_min), self.period.tau_max)
        if figures is not None and any(figures):
            self._measured = tuple((*figures, 0.0)[:FIGURES])
        return self.period.tau


def _seconds(value: Any) -> bool:
    return is_number(value) and value >= 0


def _checked_figure(owner: str, key: str, value: Any) -> Any:
    option = f"the state's adaptive.{key}"
    if key == "round_samples":
        return count(owner, option, value)
    if key == "shorter_asks":
        if not isinstance(value, list) or not all(is_int(v) and v >= 1 for v in value):
            raise invalid(owner, option, value, "a list of positive integers (periods)")
        return list(value)
    if value is not None and not (_seconds(value) and (key != "step_seconds" or value > 0)):
        accepted = "None or a number of seconds " + ("> 0" if key == "step_seconds" else ">= 0")
        raise invalid(owner, option, value, accepted)
    return value
