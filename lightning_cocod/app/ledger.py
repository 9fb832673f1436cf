"""A JSON ledger per comparison group: run id -> run record, shared by the runs of the group.

A run that ends adds itself; if the group's S-SGD run with the same number of workers is already
there, its speedup is known at once (S-SGD steady step time / its own). When an S-SGD run ends,
it fills in the speedup of the runs that finished before it. The ledger lives under the output
root, so runs of one group launched by separate commands still meet. Writers on several
processes (or several jobs at once) take an exclusive fcntl lock on a sibling .lock file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

Record = dict[str, Any]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read(path: Path) -> dict[str, Record]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def _write(path: Path, runs: dict[str, Record]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(runs, indent=1, sort_keys=True))
    os.replace(tmp, path)  # readers without the lock (the report) see the old or the new file


def ssgd_step_seconds(runs: dict[str, Record], workers: int) -> float | None:
    """Mean steady step time of the S-SGD runs with ``workers`` workers, None without any."""
    times = [
        r["steady_step_seconds"]
        for r in runs.values()
        if r.get("method") == "ssgd" and r.get("workers") == workers and r.get("steady_step_seconds")
    ]
    return statistics.fmean(times) if times else None


def speedup(base: float | None, mine: float | None) -> float | None:
    return base / mine if base and mine else None


def add_run(path: Path, record: Record) -> tuple[Record, list[str]]:
    """Put ``record`` in the ledger; returns it with ``speedup_vs_ssgd`` set when that is known,
    and the ids of earlier runs whose speedup this S-SGD run made known."""
    with locked(path):
        runs = read(path)
        runs[record["id"]] = record
        base = ssgd_step_seconds(runs, record["workers"])
        filled = []
        if record["method"] == "ssgd":
            for run_id, other in runs.items():
                if other.get("method") != "ssgd" and other.get("workers") == record["workers"]:
                    other["speedup_vs_ssgd"] = speedup(base, other.get("steady_step_seconds"))
                    filled.append(run_id)
        else:
            record["speedup_vs_ssgd"] = speedup(base, record.get("steady_step_seconds"))
        _write(path, runs)
    return record, filled
