"""Speedup over S-SGD, computed here and nowhere else (the run's end and the report).

The speedup of a run is the steady step time of its baseline divided by its own. The baseline is
the S-SGD run that differs from it only in the method: same group, same condition (model, data,
batch, workers, link, device, threads, precision, ...: ``identity.condition``) and same seed, the
first such run to finish if there are several. Without one the speedup is unknown (None), never
borrowed from another condition. The rule reads only the records themselves, so a run's speedup,
once its baseline exists, is the same whoever computes it and whenever; later runs never change it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

Record = dict[str, Any]
# Time to accuracy: the target is S-SGD's final validation accuracy (the mean over its seeds) less
# this margin, so a method that ends half a point short still has a time to target.
TARGET_MARGIN = 0.005


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
    ]


def baseline(record: Record, runs: Iterable[Record]) -> Record | None:
    """The S-SGD run ``record`` is compared with, or None when the group has none like it."""
    like = [r for r in _baselines(record, runs, ("group", "condition_id", "seed")) if r.get("steady_step_seconds")]
    return min(like, key=lambda r: (r.get("finished_at") or float("inf"), str(r.get("id"))), default=None)


def speedup(record: Record, runs: Iterable[Record]) -> tuple[float | None, str | None]:
    """(speedup over S-SGD, the baseline's id); (None, None) when unknown."""
    base, mine = baseline(record, runs), record.get("steady_step_seconds")
    return (base["steady_step_seconds"] / mine, base["id"]) if base and mine else (None, None)


def final_accuracy(record: Record) -> float | None:
    """The run's last validation accuracy (of the workers' averaged model, at the end of fit)."""
    timeline = record.get("timeline") or []
    return timeline[-1]["accuracy"] if timeline else None


def time_to(record: Record, level: float) -> float | None:
    """Wall seconds from the run's first step to its first validation at ``level`` or above."""
    return next((p["seconds"] for p in record.get("timeline") or [] if p["accuracy"] >= level), None)


def ssgd_final(record: Record, runs: Iterable[Record]) -> float | None:
    """S-SGD's final validation accuracy in ``record``'s group and condition, the mean over its
    seeds: what "as accurate as S-SGD" means for every run of that condition."""
    finals = [f for r in _baselines(record, runs, ("group", "condition_id")) if (f := final_accuracy(r)) is not None]
    return statistics.fmean(finals) if finals else None


def median_time(times: list[float | None]) -> float | None:
    """The median over seeds, or None ("never") when a seed never got there: a method is only as
    fast as its seeds that all reach the target."""
    return statistics.median(times) if times and None not in times else None  # type: ignore[type-var]
