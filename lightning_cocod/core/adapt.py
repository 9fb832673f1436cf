"""Heterogeneous workers and an adaptive period: the arithmetic, kept free of Lightning.

Proportional sampling is this project's reading of the paper's summary (the exact formula was
not recoverable): worker i's batch b_i follows its measured throughput c_i,
b_i = B * c_i / sum_j c_j, as integers summing to B, each >= 1, so that all workers finish
their tau steps at about the same time. Averages are then weighted by p_i = b_i / B.

The adaptive period hides communication when tau * t_step >= t_comm: ``tau="auto"`` takes the
smallest such tau (with a margin) that also spreads the round's own cost thinly enough over its
steps, within bounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from lightning_cocod._options import number, positive_int, require

# The longest period at which CoCoD-SGD kept S-SGD's accuracy on the package's accuracy studies
# (docs/accuracy/): CoCoDStrategy(tau="auto") stays at or below it unless its tau_max is raised.
# The rule below knows nothing of accuracy; it only hides time, so a link that needs a longer
# period to hide a round is told so once (``AdaptivePeriod.hiding_period``) and the round's excess waits.
SAFE_TAU_MAX = 2
# With an outer step (CoCoD's ``progress`` above 1, which moves the mean further than the workers
# went) only tau=1 kept S-SGD's loss on the GPT study (docs/accuracy/language-model.md): the step
# doubles each worker's own deviation too, and at tau=2 that cost 0.25 nats.
OUTER_STEP_TAU_MAX = 1


def safe_tau_max(progress: float = 1.0) -> int:
    """tau="auto"'s default bound for a CoCoD merge that keeps ``progress`` of a round's progress."""
    return SAFE_TAU_MAX if progress <= 1.0 else OUTER_STEP_TAU_MAX


def proportional_split(global_batch: int, capabilities: Sequence[float]) -> list[int]:
    """Integers b_i >= 1 summing to ``global_batch``, proportional to ``capabilities``.

    Largest-remainder rounding, ties to the lower rank, so every rank computes the same split
    from the same (gathered) capabilities.
    """
    n = len(capabilities)
    if n == 0:
        raise ValueError("proportional_split needs at least one worker's capability")
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < n:
        raise ValueError(
            f"global batch {global_batch!r} cannot give each of {n} workers at least one sample: "
            f"use an integer >= {n}"
        )
    bad = [c for c in capabilities if not (isinstance(c, (int, float)) and math.isfinite(c) and c > 0)]
    if bad:
        raise ValueError(
            f"capabilities must be positive finite numbers (samples/s), got {list(capabilities)}"
        )
    total = float(sum(capabilities))
    exact = [global_batch * c / total for c in capabilities]
    sizes = [math.floor(e) for e in exact]
    order = sorted(range(n), key=lambda i: (-(exact[i] - sizes[i]), i))
    for i in order[: global_batch - sum(sizes)]:
        sizes[i] += 1
    # A worker rounded down to nothing still gets one sample, taken from the largest batch.
    for i in range(n):
        if sizes[i] == 0:
            sizes[max(range(n), key=lambda j: (sizes[j], -j))] -= 1
            sizes[i] = 1
    return sizes


class AdaptivePeriod:
    """The smallest period that hides the measured communication and amortises the round's cost.

    Two conditions, each a lower bound on tau, within ``[tau_min, tau_max]``:

    * hide: ``tau * t_step >= margin * t_comm``, so the all-reduce lands before the round ends;
    * amortise: ``t_round <= overhead * tau * t_step``, where ``t_round`` is what a round costs
      the worker besides its steps (snapshot, finite check, launch, merge). On a fast link the
      first condition alone gives tau=1, and every step would pay a whole round. The budget is
      small because ``t_round`` is only the part of the cost a worker can time: the all-reduce
      also takes CPU and memory traffic from a CPU worker's steps, and on the benchmark machine
      that was about as much again (ResNet18: ~0.03 s of own work, ~0.05 s of gloo CPU per round).

    The period grows at once (exposed communication costs time now) but shrinks only after
    ``patience`` rounds in a row have asked for less, and then to the largest of those asks, so
    noise in the measurements does not flip it back and forth.

    ``update`` takes figures every rank agrees on (they are all-reduced with the round), so every
    rank reaches the same period. Communication and step times are smoothed (exponential moving
    average); the round's own work is its least measured value.

    Args:
        tau_min, tau_max: bounds on the period.
        initial: the period of the first round, before anything is measured.
        margin: tau * t_step must exceed margin * t_comm (1.2 leaves 20% slack for jitter).
        overhead: the share of a round's step time its own work may take (0.01: 1%); None drops
            the second condition, for a choice that leaves what a round costs unchanged (its
            overlap: the period, and so how often the round is paid, is fixed).
        smoothing: weight of the newest measurement in the moving average.
        patience: rounds in a row asking for a shorter period before it shrinks.
    """

    def __init__(
        self,
        tau_min: int = 1,
        tau_max: int = 64,
        initial: int = 4,
        margin: float = 1.2,
        overhead: float | None = 0.01,
        smoothing: float = 0.5,
        patience: int = 2,
    ) -> None:
        owner = type(self).__name__
        positive_int(owner, "tau_min", tau_min)
        positive_int(owner, "tau_max", tau_max)
        require(tau_min <= tau_max, owner, "tau_min", tau_min, f"a period no longer than tau_max={tau_max}")
        number(
            owner,
            "margin",
            margin,
            "a number >= 1 (a period that only just hides communication)",
            at_least=1.0,
        )
        if overhead is not None:
            accepted = "None or a share of the step time in (0, 1)"
            number(owner, "overhead", overhead, accepted, above=0.0)
            require(overhead < 1.0, owner, "overhead", overhead, accepted)
        number(owner, "smoothing", smoothing, "a number in (0, 1]", above=0.0, at_most=1.0)
        positive_int(owner, "patience", patience, "a positive integer (rounds)")
        self.tau_min, self.tau_max, self.margin, self.overhead = tau_min, tau_max, margin, overhead
        self.smoothing, self.patience = smoothing, patience
        self.tau = min(max(initial, tau_min), tau_max)
        self.comm_seconds: float | None = None
        self.step_seconds: float | None = None
        self.round_seconds: float | None = None
        self.round_samples = 0
        self.shorter_asks: list[int] = []

    def _smooth(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.smoothing) * old + self.smoothing * new

    def hiding_period(self) -> int | None:
        """The period that hides the smoothed round, whatever the bounds; None before any figures."""
        if self.comm_seconds is None or self.step_seconds is None:
            return None
        return max(1, math.ceil(self.margin * self.comm_seconds / self.step_seconds - 1e-9))

    def needed(self) -> int:
        """The period the smoothed figures ask for, within bounds."""
        assert (
            self.comm_seconds is not None and self.step_seconds is not None and self.round_seconds is not None
        )
        hide = self.hiding_period()
        assert hide is not None
        # The round's own work counts once two rounds have measured it: their least value, so a
        # preempted first round cannot set the period either.
        amortise = (
            math.ceil(self.round_seconds / (self.overhead * self.step_seconds) - 1e-9)
            if self.round_samples >= 2 and self.overhead is not None
            else 1
        )
        return min(max(hide, amortise, self.tau_min), self.tau_max)

    def update(self, comm_seconds: float, step_seconds: float, round_seconds: float = 0.0) -> int:
        """Fold in one round's figures; returns the period for the next round."""
        figures = comm_seconds + step_seconds + round_seconds
        if not (comm_seconds >= 0 and round_seconds >= 0 and step_seconds > 0 and math.isfinite(figures)):
            return self.tau  # nothing usable measured (e.g. an empty round)
        self.comm_seconds = self._smooth(self.comm_seconds, comm_seconds)
        self.step_seconds = self._smooth(self.step_seconds, step_seconds)
        # A round's own work is fixed work that interference (a preempted worker) only lengthens:
        # its least measured value is the estimate, so one slow round does not raise the period.
        self.round_seconds = (
            round_seconds if self.round_seconds is None else min(self.round_seconds, round_seconds)
        )
        self.round_samples += 1
        needed = self.needed()
        if needed >= self.tau:
            self.tau, self.shorter_asks = needed, []
        else:
            self.shorter_asks.append(needed)
            if len(self.shorter_asks) >= self.patience:
                self.tau, self.shorter_asks = max(self.shorter_asks), []
        return self.tau
