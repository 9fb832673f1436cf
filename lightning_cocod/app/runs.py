"""Finds the records of finished runs under a folder, whatever wrote them.

Sources, all reduced to the flat record ``fit_run`` writes (identity + final figures + timeline):
- ``run.json`` in each job folder (always written; a run finds its S-SGD baseline among them);
- wandb run folders with ``files/wandb-summary.json`` and ``files/config.yaml`` (online runs or
  downloaded ones; wandb's offline runs keep both only inside their binary .wandb file);
- CSV logs: ``metrics.csv`` with the ``hparams.yaml`` beside it.
Records of one run found in several places are merged; a field missing in one is taken from
another (a CSV log holds numbers only, run.json the whole record). A file that cannot be read, or
a record whose fields have the wrong types, is passed over and named (``skipped``): one damaged
record costs that record, never the others.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from lightning_cocod.app.loggers import FINAL_KEYS

Record = dict[str, Any]
Skipped = Callable[[Path, str], None]
METHODS = ("ssgd", "pipe_sgd", "local_sgd", "cocod")
# Fields the report and the speedup rule compute with: a number or nothing.
_NUMBERS = (
    "test_acc",
    "steady_step_seconds",
    "finished_at",
    "hidden_fraction",
    "time_to_target_seconds",
    "target_accuracy",
    "speedup_vs_ssgd",
    "progress",
)


class Malformed(ValueError):
    """A record of ours whose fields cannot be what a run writes."""


def _number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _check(record: Record) -> None:
    """Raises Malformed naming the first field a run could not have written."""
    if record.get("method") not in METHODS:
        raise Malformed(f"method {record.get('method')!r} is none of {', '.join(METHODS)}")
    for key in _NUMBERS:
        if not _number(record.get(key)):
            raise Malformed(f"{key} {record[key]!r} is not a number")
    tau = record.get("tau")
    if not (tau is None or tau == "auto" or (isinstance(tau, int) and not isinstance(tau, bool))):
        raise Malformed(f"tau {tau!r} is not a period")
    for key in ("seed", "workers"):
        if not isinstance(record.get(key), int) or isinstance(record[key], bool):
            raise Malformed(f"{key} {record.get(key)!r} is not an integer")
    for key in ("group", "condition_id", "link"):
        if record.get(key) is not None and not isinstance(record[key], str):
            raise Malformed(f"{key} {record[key]!r} is not a name")
    if record.get("condition") is not None and not isinstance(record["condition"], dict):
        raise Malformed(f"condition {record['condition']!r} is not a mapping")
    timeline = record.get("timeline") or []
    if not isinstance(timeline, list) or not all(
        isinstance(p, dict) and _number(p.get("seconds")) and _number(p.get("accuracy")) for p in timeline
    ):
        raise Malformed("timeline is not a list of {seconds, accuracy} points")


def _finished(record: Any) -> bool:
    """A whole record of a finished run (Malformed if it is ours but damaged)."""
    if not isinstance(record, dict):
        raise Malformed(f"a record is a JSON object, not {type(record).__name__}")
    if not (isinstance(record.get("id"), str) and "method" in record and record.get("test_acc") is not None):
        return False
    _check(record)
    return True


def from_run_json(path: Path) -> list[Record]:
    record = json.loads(path.read_text())
    return [record] if _finished(record) else []


def _wandb_value(entry: Any) -> Any:
    # config.yaml holds each top-level key as {value: ..., desc: ...}
    return entry.get("value") if isinstance(entry, dict) and "value" in entry else entry


def from_wandb(files: Path) -> list[Record]:
    config = yaml.safe_load((files / "config.yaml").read_text()) or {}
    summary = json.loads((files / "wandb-summary.json").read_text())
    identity = _wandb_value(config.get("run"))
    if not isinstance(identity, dict):
        return []
    record = {**identity, **{k: summary.get(f"final/{k}") for k in FINAL_KEYS}}
    record["timeline"] = [{"seconds": s, "accuracy": a} for s, a in summary.get("final/timeline", [])]
    return [record] if _finished(record) else []


def from_csv(metrics: Path) -> list[Record]:
    hparams = metrics.with_name("hparams.yaml")
    if not hparams.is_file():
        return []
    identity = (yaml.safe_load(hparams.read_text()) or {}).get("run")
    if not isinstance(identity, dict):
        return []
    record: Record = {**identity, **{k: None for k in FINAL_KEYS}, "timeline": []}
    with open(metrics, newline="") as fh:
        for row in csv.DictReader(fh):
            for key in FINAL_KEYS:
                if row.get(f"final/{key}"):
                    record[key] = float(row[f"final/{key}"])
            if row.get("curve/accuracy"):
                record["timeline"].append(
                    {"seconds": float(row["curve/seconds"]), "accuracy": float(row["curve/accuracy"])}
                )
    return [record] if _finished(record) and record["test_acc"] is not None else []


def _sources(root: Path) -> Iterable[tuple[Path, Any]]:
    if root.is_file():  # a run.json named directly
        yield root, from_run_json
        return
    for path in sorted(root.rglob("run.json")):
        yield path, from_run_json
    for path in sorted(root.rglob("wandb-summary.json")):
        # "latest-run" is a link to one of the run folders: read each run once.
        run_folder = path.parent.parent.name
        if (
            path.parent.name == "files"
            and run_folder.startswith(("run-", "offline-run-"))
            and (path.parent / "config.yaml").is_file()
        ):
            yield path.parent, from_wandb
    for path in sorted(root.rglob("metrics.csv")):
        yield path, from_csv


def _read(path: Path, reader: Callable[[Path], list[Record]], skipped: Skipped | None) -> list[Record]:
    try:
        return reader(path)
    except (OSError, ValueError, yaml.YAMLError, TypeError, KeyError, AttributeError) as err:
        if skipped is not None:
            skipped(path, str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__)
        return []


def load_runs(roots: Iterable[Path], skipped: Skipped | None = None) -> list[Record]:
    """Every finished run under ``roots`` (folders or files), one merged record per run id;
    ``skipped(path, why)`` hears of each file passed over because it cannot be read."""
    merged: dict[str, Record] = {}
    for root in roots:
        for path, reader in _sources(Path(root)):
            records = _read(path, reader, skipped)
            for record in records:
                known = merged.setdefault(record["id"], {})
                for key, value in record.items():
                    if known.get(key) in (None, []) and value not in (None, []):
                        known[key] = value
                    known.setdefault(key, value)
    return list(merged.values())


def group_runs(out_root: Path, group: str, skipped: Skipped | None = None) -> list[Record]:
    """The finished runs of ``group`` under ``out_root``, from their run.json files: each run
    writes its own, so no file is shared between runs and a damaged one costs only itself."""
    found = (_read(path, from_run_json, skipped) for path in sorted(Path(out_root).rglob("run.json")))
    return [record for records in found for record in records if record.get("group") == group]
