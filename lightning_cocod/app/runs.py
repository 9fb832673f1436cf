"""The records of finished runs: the ``run.json`` each run writes in its own folder (``app.record``).

No file is shared between runs: a record that cannot be read, or whose fields a run could not have
written, is passed over and named (``skipped``), and costs that record, never the others.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from lightning_cocod.app.speedup import Record
from lightning_cocod.methods import METHODS

Skipped = Callable[[Path, str], None]
# Fields the report and the speedup rule compute with: a number or nothing.
_NUMBERS = ("test_acc", "steady_step_seconds", "finished_at", "hidden_fraction", "time_to_target_seconds")
_NUMBERS += ("target_accuracy", "speedup_vs_ssgd", "progress")


def _is(value: Any, kind: type | tuple[type, ...]) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)  # JSON's true is no number


def _problem(record: Any) -> str | None:
    """The first field of ``record`` that a run could not have written, named, or None."""
    if not isinstance(record, dict):
        return f"a record is a JSON object, not {type(record).__name__}"
    if record.get("method") not in METHODS:
        return f"method {record.get('method')!r} is none of {', '.join(METHODS)}"
    for key in _NUMBERS:
        if record.get(key) is not None and not _is(record[key], (int, float)):
            return f"{key} {record[key]!r} is not a number"
    if not (record.get("tau") in (None, "auto") or _is(record["tau"], int)):
        return f"tau {record['tau']!r} is not a period"
    for key in ("seed", "workers"):
        if not _is(record.get(key), int):
            return f"{key} {record.get(key)!r} is not an integer"
    for key, kind in (("id", str), ("group", str), ("condition_id", str), ("link", str), ("condition", dict)):
        if not isinstance(record.get(key), kind) and (key == "id" or record.get(key) is not None):
            return f"{key} {record.get(key)!r} is not {'a mapping' if kind is dict else 'a name'}"
    points = record.get("timeline") or []
    if not isinstance(points, list) or not all(
        isinstance(p, dict) and _is(p.get("seconds"), (int, float)) and _is(p.get("accuracy"), (int, float))
        for p in points
    ):
        return "timeline is not a list of {seconds, accuracy} points"
    return None


def read_record(path: Path) -> Record:
    """The record in ``path``; ValueError (or OSError) saying in one line why it is none."""
    record = json.loads(path.read_text())
    why = _problem(record)
    if why:
        raise ValueError(why)
    return record


def load_runs(paths: Iterable[Path], skipped: Skipped | None = None) -> list[Record]:
    """The records under ``paths`` (folders, or run.json files), each file once; ``skipped(path,
    why)`` hears of each one passed over."""
    roots = [Path(p) for p in paths]
    files = [p for root in roots for p in ([root] if root.is_file() else sorted(root.rglob("run.json")))]
    records = []
    for path in {p.resolve(): p for p in files}.values():  # a folder and a run inside it: the run once
        try:
            records.append(read_record(path))
        except (OSError, ValueError) as err:
            if skipped is not None:
                skipped(path, str(err).strip().partition("\n")[0] or type(err).__name__)
    return records


def group_runs(out_root: Path, group: str, skipped: Skipped | None = None) -> list[Record]:
    """The finished runs of ``group`` under ``out_root``."""
    return [r for r in load_runs([out_root], skipped) if r.get("group") == group]
