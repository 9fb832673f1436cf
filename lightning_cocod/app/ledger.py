"""A JSON ledger per comparison group: run id -> run record, shared by the runs of the group.

A run that ends adds itself and reads its speedup over S-SGD off the runs already there. The
ledger lives under the output root, so runs of one group launched by separate commands still
meet. Writers on several processes (or several jobs at once) take an exclusive fcntl lock on a
sibling .lock file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lightning_cocod.app.speedup import speedup

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


def add_run(path: Path, record: Record) -> Record:
    """Put ``record`` in the ledger with its speedup over S-SGD (``app.speedup``) as known now.

    Only this run's own entry is written: a later run never rewrites an earlier run's figures. An
    earlier run whose S-SGD baseline finished after it keeps "unknown" in its own record; the
    report, which applies the same rule to all records, shows its figure and says why they differ.
    """
    with locked(path):
        runs = read(path)
        runs[record["id"]] = record
        value, base = speedup(record, runs.values())
        record.update(speedup_vs_ssgd=value, speedup_baseline=base)
        _write(path, runs)
    return record
