"""Speedup over S-SGD, computed here and nowhere else (the run's end and the report).

The speedup of a run is the steady step time of its baseline divided by its own. The baseline is
the S-SGD run that differs from it only in the method: same group, same condition (model, data,
batch, workers, link, device, threads, precision, ...: ``identity.condition``) and same seed, the
first such run to finish if there are several. Without one the speedup is unknown (None), never
borrowed from another condition. The rule reads only the records themselves, so a run's speedup,
once its baseline exists, is the same whoever computes it and whenever; later runs never change it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Record = dict[str, Any]


def baseline(record: Record, runs: Iterable[Record]) -> Record | None:
    """The S-SGD run ``record`` is compared with, or None when the group has none like it (or the
    record is from before conditions were recorded: nothing to match it on)."""
    if not record.get("condition_id"):
        return None
    like = [
        r
        for r in runs
        if r.get("method") == "ssgd"
        and not r.get("comm_hook")  # S-SGD compressing its gradients is a method compared, not the baseline
        and r.get("steady_step_seconds")
        and all(r.get(key) == record.get(key) for key in ("group", "condition_id", "seed"))
    ]
    return min(like, key=lambda r: (r.get("finished_at") or float("inf"), str(r.get("id"))), default=None)


def speedup(record: Record, runs: Iterable[Record]) -> tuple[float | None, str | None]:
    """(speedup over S-SGD, the baseline's id); (None, None) when unknown."""
    base, mine = baseline(record, runs), record.get("steady_step_seconds")
    return (base["steady_step_seconds"] / mine, base["id"]) if base and mine else (None, None)
