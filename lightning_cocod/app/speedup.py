"""Speedup over S-SGD, computed here and nowhere else (the run's end and the report).

The speedup of a run is the steady step time of its baseline divided by its own. The baseline is
the S-SGD run that differs from it only in the method: same group, same condition (model, data,
batch, workers, link, device, threads, precision, ...: ``identity.condition``), same goal
(``judged_by``) and same seed, the first such run to finish if there are several. Learning rate
and length of run (``identity.RECIPE``) set no step time, so they may differ: a tuned method is
measured against S-SGD at its own best settings in the group. Without one the speedup is unknown
(None), never borrowed from another condition. The rule reads only the records themselves, so a run's speedup,
once its baseline exists, is the same whoever computes it and whenever; later runs never change it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lightning_cocod.app.identity import speed_key

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


def _baselines(record: Record, runs: Iterable[Record]) -> list[Record]:
    """The plain S-SGD runs of ``record``'s group that step under its condition, whatever their
    learning rate or length (``identity.speed_key``); none for a record from before conditions
    were recorded (nothing to match it on)."""
    if not record.get("condition_id"):
        return []
    key = speed_key(record)
    return [
        r
        for r in runs
        if r.get("method") == "ssgd"
        and not r.get("comm_hook")  # S-SGD compressing its gradients is a method compared, not the baseline
        and r.get("group") == record.get("group")
        and r.get("condition_id")
        and speed_key(r) == key
        # The goal is part of the condition, matched here rather than in condition_id so that the
        # records from before there was a choice keep theirs: a loss-judged S-SGD run's final loss
        # is no accuracy target, and runs judged apart are compared apart.
        and goal_of(r) == goal_of(record)
    ]


def _best_settings(record: Record, runs: Iterable[Record]) -> tuple[str | None, float | None]:
    """(condition_id, final figure: the mean over its seeds) of S-SGD at its best settings among
    those its group ran under ``record``'s condition: the S-SGD a tuned method has to match. One
    S-SGD setting (the usual study) is that one; ties go to ``record``'s own settings."""
    finals: dict[str, list[float]] = {}
    for r in _baselines(record, runs):
        if (f := final_value(r)) is not None:
            finals.setdefault(r["condition_id"], []).append(f)
    if not finals:
        return None, None
    sign = 1 if goal_of(record).higher_is_better else -1
    best = max(
        finals,
        key=lambda cid: (sign * statistics.fmean(finals[cid]), cid == record.get("condition_id"), cid),
    )
    return best, statistics.fmean(finals[best])


def baseline(record: Record, runs: Iterable[Record]) -> Record | None:
    """The S-SGD run ``record`` is compared with, or None when the group has none like it: one of
    its own settings if there is one (learning rate and length set no step time)."""
    like = [
        r
        for r in _baselines(record, runs)
        if r.get("seed") == record.get("seed") and r.get("steady_step_seconds")
    ]
    return min(
        like,
        key=lambda r: (
            r.get("condition_id") != record.get("condition_id"),
            r.get("finished_at") or float("inf"),
            str(r.get("id")),
        ),
        default=None,
    )


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
    """S-SGD's final validation figure for ``record``'s group, condition and goal, the mean over
    its seeds, at S-SGD's best settings (``_best_settings``): what "as good as S-SGD" means."""
    return _best_settings(record, runs)[1]


def ssgd_settings(record: Record, runs: Iterable[Record]) -> str | None:
    """The condition_id of the S-SGD runs that ``ssgd_final`` reads: whose time to target is the
    one a row's speedup to target divides."""
    return _best_settings(record, runs)[0]


def median_time(times: list[float | None]) -> float | None:
    """The median over seeds of the time to a level, a seed that never got there counting as
    never (later than any time): None ("never") when half the seeds or more missed it."""
    if not times:
        return None
    median = statistics.median(math.inf if t is None else t for t in times)
    return None if math.isinf(median) else median
