"""Finds the records of finished runs under a folder, whatever wrote them.

Sources, all reduced to the flat record ``fit_run`` writes (identity + final figures + timeline):
- ``run.json`` in each job folder and the group ledgers ``groups/*.json`` (always written);
- wandb run folders with ``files/wandb-summary.json`` and ``files/config.yaml`` (online runs or
  downloaded ones; wandb's offline runs keep both only inside their binary .wandb file);
- CSV logs: ``metrics.csv`` with the ``hparams.yaml`` beside it.
Records of one run found in several places are merged; a field missing in one is taken from
another (a CSV log holds numbers only, run.json the whole record).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from lightning_cocod.app.loggers import FINAL_KEYS

Record = dict[str, Any]


def _finished(record: Record) -> bool:
    return isinstance(record.get("id"), str) and "method" in record and "test_acc" in record


def from_run_json(path: Path) -> list[Record]:
    record = json.loads(path.read_text())
    return [record] if _finished(record) else []


def from_ledger(path: Path) -> list[Record]:
    runs = json.loads(path.read_text())
    return (
        [r for r in runs.values() if isinstance(r, dict) and _finished(r)] if isinstance(runs, dict) else []
    )


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
    if root.is_file():  # a ledger or a run.json named directly
        yield root, from_ledger if root.parent.name == "groups" else from_run_json
        return
    for path in sorted(root.rglob("run.json")):
        yield path, from_run_json
    for path in sorted(root.rglob("groups/*.json")):
        yield path, from_ledger
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


def load_runs(roots: Iterable[Path]) -> list[Record]:
    """Every finished run under ``roots`` (folders or files), one merged record per run id."""
    merged: dict[str, Record] = {}
    for root in roots:
        for path, reader in _sources(Path(root)):
            try:
                records = reader(path)
            except (OSError, ValueError, yaml.YAMLError, TypeError, KeyError):
                continue  # a file being written, or someone else's JSON: not a run of ours
            for record in records:
                known = merged.setdefault(record["id"], {})
                for key, value in record.items():
                    if known.get(key) in (None, []) and value not in (None, []):
                        known[key] = value
                    known.setdefault(key, value)
    return list(merged.values())
