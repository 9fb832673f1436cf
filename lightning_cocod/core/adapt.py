"""Heterogeneous workers and an adaptive period: the arithmetic, kept free of Lightning.

Proportional sampling is this project's reading of the paper's summary (the exact formula was
not recoverable): worker i's batch b_i follows its measured throughput c_i,
b_i = B * c_i / sum_j c_j, as integers summing to B, each >= 1, so that all workers finish
their tau steps at about the same time. Averages are then weighted by p_i = b_i / B.

The adaptive period hides communication when tau * t_step >= t_comm: ``tau="auto"`` takes the
smallest such tau (with a margin), within bounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


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
        raise ValueError(f"capabilities must be positive finite numbers (samples/s), got {list(capabilities)}")
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


def check_period_bounds(tau_min: int, tau_max: int) -> None:
    for name, value in (("tau_min", tau_min), ("tau_max", tau_max)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if tau_min > tau_max:
        raise ValueError(f"tau bounds are in the wrong order: tau_min={tau_min} > tau_max={tau_max}")


class AdaptivePeriod:
    """The smallest period that hides the measured communication time, within bounds.

    ``update`` takes figures every rank agrees on (they are all-reduced with the round), so every
    rank reaches the same period. Measurements are smoothed (exponential moving average) so one
    noisy round does not flip the period back and forth.

    Args:
        tau_min, tau_max: bounds on the period.
        initial: the period of the first round, before anything is measured.
        margin: tau * t_step must exceed margin * t_comm (1.2 leaves 20% slack for jitter).
        smoothing: weight of the newest measurement in the moving average.
    """

    def __init__(
        self, tau_min: int = 1, tau_max: int = 64, initial: int = 4, margin: float = 1.2, smoothing: float = 0.5
    ) -> None:
        check_period_bounds(tau_min, tau_max)
        if not margin >= 1.0:
            raise ValueError(f"margin must be >= 1 (a period that only just hides communication), got {margin!r}")
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing!r}")
        self.tau_min, self.tau_max, self.margin, self.smoothing = tau_min, tau_max, margin, smoothing
        self.tau = min(max(initial, tau_min), tau_max)
        self.comm_seconds: float | None = None
        self.step_seconds: float | None = None

    def _smooth(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.smoothing) * old + self.smoothing * new

    def update(self, comm_seconds: float, step_seconds: float) -> int:
        """Fold in one round's figures; returns the period for the next round."""
        if not (comm_seconds >= 0 and step_seconds > 0 and math.isfinite(comm_seconds + step_seconds)):
            return self.tau  # nothing usable measured (e.g. an empty round)
        self.comm_seconds = self._smooth(self.comm_seconds, comm_seconds)
        self.step_seconds = self._smooth(self.step_seconds, step_seconds)
        needed = math.ceil(self.margin * self.comm_seconds / self.step_seconds - 1e-9)
        self.tau = min(max(needed, self.tau_min), self.tau_max)
        return self.tau
