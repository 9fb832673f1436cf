"""Speedup over S-SGD, computed here and nowhere else (the run's end and the report).

The speedup of a run is the steady step time of its baseline divided by its own. The baseline is
the S-SGD run that differs from it only in the method: same group, same condition (model, data,
batch, workers, link, device, threads, precision, ...: ``app.condition``) and same seed, the first
such run to finish if there are several. Without one the speedup is unknown (None), never borrowed
from another condition. The rule reads only the records themselves, so a run's speedup, once its
baseline exists, is the same whoever computes it and whenever; later runs never change it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Record = dict[str, Any]


def _order(record: Record) -> tuple[float, str]:
    return (record.get("finished_at") or float("inf"), str(record.get("id")))


def baseline(record: Record, runs: Iterable[Record]) -> Record | None:
    """The S-SGD run ``record`` is compared with, or None when the group has none like it."""
    if not record.get("condition_id"):
        return None  # recorded before conditions were: nothing to match it on
    matches = [
        r
        for r in runs
        if r.get("method") == "ssgd"
        and r.get("steady_step_seconds")
        and r.get("group") == record.get("group")
        and r.get("condition_id") == record["condition_id"]
        and r.get("seed") == record.get("seed")
    ]
    return min(matches, key=_order) if matches else None


def speedup(record: Record, runs: Iterable[Record]) -> tuple[float | None, str | None]:
    """(speedup over S-SGD, the baseline's id); (None, None) when unknown."""
    base = baseline(record, runs)
    mine = record.get("steady_step_seconds")
    if base is None or not mine:
        return None, None
    return base["steady_step_seconds"] / mine, base["id"]


def describe(value: float | None) -> str:
    """How the console, the report and the logs spell a speedup: 3 decimals, or "unknown"."""
    return "unknown" if value is None else f"{value:.3f}x"
