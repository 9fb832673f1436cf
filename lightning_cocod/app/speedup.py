"""Speedup over S-SGD, computed here and nowhere else (the run's end and the report).

The speedup of a run is the steady step time of its baseline divided by its own. The baseline is
the S-SGD run that differs from it only in the method: same group, same condition (model, data,
batch, workers, link, device, threads, precision, ...: ``identity.condition``), same goal
(``judged_by``) and same seed, the first such run to finish if there are several. Without one the speedup is unknown (None), never
borrowed from another condition. The rule reads only the records themselves, so a run's speedup,
once its baseline exists, is the same whoever computes it and whenever; later runs never change it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

Record = dict[str, Any]


@dataclass(frozen=True)
class Goal:
    """What time to accuracy reads in a run's validation timeline: the target is S-SGD's final
    value (the mean over its seeds) made worse by ``margin``, so that a method that ends a little
    short of S-SGD still has a time to target."""

    key: str  # of a timeline point
    higher_is_better: bool
    margin: float

    def target(self, ssgd_final: float) -> float:
        return ssgd_final - self.margin if self.higher_is_better else ssgd_final + self.margin

    def reached(self, value: float | None, level: float) -> bool:
        if value is None:  # a diverged run's loss
            return False
        return value >= level if self.higher_is_better else value <= level


# A run's ``judged_by``: classifiers by validation accuracy, half a point short of S-SGD's; language
# models by validation loss, 0.01 nats (1% of perplexity) above S-SGD's.
GOALS = {"accuracy": Goal("accuracy", True, 0.005), "loss": Goal("loss", False, 0.01)}


def goal_of(record: Record) -> Goal:
    """The goal ``record`` is judged by (records from before there was a choice: accuracy)."""
    return GOALS[record.get("judged_by") or "accuracy"]


def _baselines(record: Record, runs: Iterable[Record], keys: tuple[str, ...]) -> list[Record]:
    """The plain S-SGD runs that agree with ``record`` on ``keys``; none for a record from before
    conditions were recorded (nothing to match it on)."""
    if not record.get("condition_id"):
        return []
    return [
        r
        for r in runs
        if r.get("method") == "ssgd"
        and not r.get("comm_hook")  # S-SGD compressing its gradients is a method compared, not the baseline
        and all(r.get(key) == record.get(key) for key in keys)
        # The goal is part of the condition, matched here rather than in condition_id so that the
        # records from before there was a choice keep theirs: a loss-judged S-SGD run's final loss
        # is no accuracy target, and runs judged apart are compared apart.
        and goal_of(r) == goal_of(record)
    ]


def baseline(record: Record, runs: Iterable[Record]) -> Record | None:
    """The S-SGD run ``record`` is compared with, or None when the group has none like it."""
    like = [
        r for r in _baselines(record, runs, ("group", "condition_id", "seed")) if r.get("steady_step_seconds")
    ]
    return min(like, key=lambda r: (r.get("finished_at") or float("inf"), str(r.get("id"))), default=None)


def speedup(record: Record, runs: Iterable[Record]) -> tuple[float | None, str | None]:
    """(speedup over S-SGD, the baseline's id); (None, None) when unknown."""
    base, mine = baseline(record, runs), record.get("steady_step_seconds")
    return (base["steady_step_seconds"] / mine, base["id"]) if base and mine else (None, None)


def final_value(record: Record) -> float | None:
    """The run's last validation figure that it is judged by (of the workers' averaged model, at
    the end of fit); None for a diverged loss."""
    timeline = record.get("timeline") or []
    return timeline[-1].get(goal_of(record).key) if timeline else None


def time_to(record: Record, level: float) -> float | None:
    """Wall seconds from the run's first step to its first validation at ``level`` or better."""
    goal = goal_of(record)
    return next(
        (p["seconds"] for p in record.get("timeline") or [] if goal.reached(p.get(goal.key), level)), None
    )


def ssgd_final(record: Record, runs: Iterable[Record]) -> float | None:
    """S-SGD's final validation figure in ``record``'s group, condition and goal, the mean over its
    seeds: what "as good as S-SGD" means for every run of that condition."""
    finals = [
        f for r in _baselines(record, runs, ("group", "condition_id")) if (f := final_value(r)) is not None
    ]
    return statistics.fmean(finals) if finals else None


def median_time(times: list[float | None]) -> float | None:
    """The median over seeds of the time to a level, a seed that never got there counting as
    never (later than any time): None ("never") when half the seeds or more missed it."""
    if not times:
        return None
    median = statistics.median(math.inf if t is None else t for t in times)
    return None if math.isinf(median) else median
