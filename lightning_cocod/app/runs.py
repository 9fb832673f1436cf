"""The record of a run: the files it writes, and the ``run.json`` records read back.

``workers/job.yaml`` and ``workers/identity.json`` are what the cpu/gpu launchers hand the
ranks. ``resolved.yaml`` (the config, the code on its first line) and ``run.json`` (the record
``fit_run`` computes: identity, condition, final figures) describe a finished run: they are
written when it ends, and at the start only where the folder has none yet, so a resumed run that
fails leaves the records of the run it continued as they were.

No file is shared between runs: a record that cannot be read, or whose fields a run could not have
written, is passed over and named (``skipped``), and costs that record, never the others.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from lightning_cocod._errors import first_line
from lightning_cocod._files import atomic_write, read_regular
from lightning_cocod.app.checks import _SAFE_NAME
from lightning_cocod.app.identity import code_of
from lightning_cocod.app.speedup import GOALS, Record
from lightning_cocod.methods import METHODS

JOB_CONFIG, JOB_IDENTITY = "workers/job.yaml", "workers/identity.json"


def _resolved_yaml(config: dict[str, Any], identity: dict[str, Any]) -> str:
    return f"# code: {code_of(identity)}\n" + OmegaConf.to_yaml(OmegaConf.create(config))


def write_start(job_dir: Path, config: dict[str, Any], identity: dict[str, Any]) -> None:
    """The workers' inputs; ``resolved.yaml`` too when this folder holds no run yet."""
    text = _resolved_yaml(config, identity)
    atomic_write(job_dir / JOB_CONFIG, text)
    atomic_write(job_dir / JOB_IDENTITY, json.dumps(identity, indent=1))
    if not (job_dir / "resolved.yaml").exists():
        atomic_write(job_dir / "resolved.yaml", text)


def read_start(job_dir: Path) -> tuple[Any, dict[str, Any]]:
    return OmegaConf.load(job_dir / JOB_CONFIG), json.loads((job_dir / JOB_IDENTITY).read_text())


def write_finished(job_dir: Path, config: dict[str, Any], record: dict[str, Any]) -> None:
    atomic_write(job_dir / "resolved.yaml", _resolved_yaml(config, record))
    atomic_write(job_dir / "run.json", json.dumps(record, indent=1))


Skipped = Callable[[Path, str], None]
_MAX_RECORD_BYTES = 64 << 20  # a run's record is kilobytes; its timeline one point per validation
_GROUP_LENGTH = 200  # with the report's suffixes, within a file name's 255 bytes
_NUMBERS = ("test_acc", "steady_step_seconds", "finished_at", "hidden_fraction", "time_to_target_seconds")
_NUMBERS += ("bytes_sent_per_round", "codec_seconds")
# The fields the report and the speedup rule compute with, by what they hold (None: null or missing).
_KINDS: list[tuple[str, tuple[type, ...], tuple[str, ...]]] = [
    ("an integer", (int,), ("seed", "workers")),
    ("a name", (str,), ("id",)),
    ("a name", (str, type(None)), ("group", "condition_id", "link", "compression", "comm_hook")),
    ("a name", (str, type(None)), ("outer_optimizer", "outer_scheduler")),
    ("a mapping", (dict, type(None)), ("condition",)),
    ("a period", (int, type(None)), ("tau", "overlap")),  # or "auto" (_AUTO), let through below
    ("a count", (int, type(None)), ("rounds", "tau_max")),
    ("a number", (int, float, type(None)), (*_NUMBERS, "target_accuracy", "speedup_vs_ssgd", "progress")),
]

_AUTO = ("tau", "overlap")  # what may also be "auto", chosen as the run measured


# What the figures a run writes can hold: its accuracies are fractions (the report shows them in
# percent); its times, losses, byte counts and speedups are at least 0 and at most _HUGE, far below
# where the report's sums over seeds and matplotlib's axis limits overflow to inf (a -1e308 loss
# passed the type check and broke the plot of its whole group). None where a field may be null.
_HUGE = 1e100
_FRACTION, _SIZE = (0.0, 1.0, "a fraction in [0, 1]"), (0.0, _HUGE, f"a number in [0, {_HUGE:g}]")
_RANGES = {"test_acc": _FRACTION, "target_accuracy": _FRACTION}
_RANGES |= dict.fromkeys(("steady_step_seconds", "time_to_target_seconds", "bytes_sent_per_round"), _SIZE)
_RANGES |= dict.fromkeys(("codec_seconds", "speedup_vs_ssgd"), _SIZE)
# Counts too: the plots put tau and the workers on a log axis (0 has no place there, and an integer
# past a float's range stops matplotlib); seeds in numpy's range, as the app's preflight asks.
_COUNT = 10**9
_RANGES |= dict.fromkeys(("tau", "tau_max", "workers"), (1, _COUNT, f"a count in [1, {_COUNT:g}]"))
_RANGES |= {"rounds": (0, _COUNT, f"a count in [0, {_COUNT:g}]"), "seed": (0, 2**32 - 1, "in [0, 2^32 - 1]")}
_RANGES |= {"overlap": (0, _COUNT, f"a count in [0, {_COUNT:g}]")}
_POINT = {"seconds": _SIZE, "accuracy": _FRACTION, "loss": _SIZE}  # a timeline point's (loss: or null)


def _shown(value: object) -> str:
    text = repr(value)  # a 400-digit integer is named by its start: the line stays one line
    return text if len(text) <= 40 else text[:40] + "..."


def _outside(value: object, bounds: tuple[float, float, str]) -> bool:
    if value is None or isinstance(value, str):  # null, or tau="auto": the type check let it through
        return False
    return not bounds[0] <= value <= bounds[1]  # type: ignore[operator]  # numbers by now


def _wrong(value: object, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, float) and not math.isfinite(value):  # Python's JSON reads NaN and Infinity
        return True
    return not isinstance(value, kinds) or isinstance(value, bool)  # JSON's true is no number


def _problem(record: object) -> str | None:
    """The first field of ``record`` that a run could not have written, named, or None."""
    if not isinstance(record, dict):
        return f"a record is a JSON object, not {type(record).__name__}"
    if record.get("method") not in tuple(METHODS):  # a tuple: a list or mapping is no key, but no method
        return f"method {record.get('method')!r} is none of {', '.join(METHODS)}"
    if record.get("judged_by", "accuracy") not in tuple(GOALS):
        return f"judged_by {record.get('judged_by')!r} is none of {', '.join(GOALS)}"
    for what, kinds, keys in _KINDS:
        for key in keys:
            if _wrong(record.get(key), kinds) and not (key in _AUTO and record.get(key) == "auto"):
                return f"{key} {record.get(key)!r} is not {what}"
    group = record.get("group")
    # The report's files are named after it: a name the app could not have given may name no file
    # (a NUL, more than a file name holds) or one elsewhere.
    if group is not None and not (_SAFE_NAME.match(group.replace("/", "_")) and len(group) <= _GROUP_LENGTH):
        shown = repr(group[:40]) + ("..." if len(group) > 40 else "")
        return f"group {shown} is not a name of at most {_GROUP_LENGTH} letters, digits and _ . = , + -"
    points = record.get("timeline") or []
    if not isinstance(points, list) or not all(
        isinstance(p, dict)
        and not _wrong(p.get("seconds"), (int, float))
        and not _wrong(p.get("accuracy"), (int, float))
        and (p.get("loss") is None or not _wrong(p["loss"], (int, float)))
        for p in points
    ):
        return "timeline is not a list of {seconds, accuracy[, loss]} points"
    for key, bounds in _RANGES.items():
        if _outside(record.get(key), bounds):
            return f"{key} {_shown(record.get(key))} is not {bounds[2]}"
    for i, point in enumerate(points):
        for key, bounds in _POINT.items():
            if _outside(point.get(key), bounds):
                return f"timeline point {i}: {key} {_shown(point.get(key))} is not {bounds[2]}"
    history = record.get("tau_history") or []
    if not isinstance(history, list) or not all(
        isinstance(e, list) and len(e) == 2 and not any(_wrong(v, (int,)) for v in e) for e in history
    ):
        return "tau_history is not a list of [step, tau] pairs"
    return None


def load_runs(paths: Iterable[Path], skipped: Skipped | None = None) -> list[Record]:
    """The records under ``paths`` (folders, or run.json files), each file once; ``skipped(path,
    why)`` hears of each one passed over."""
    roots = [Path(p) for p in paths]
    files = [p for root in roots for p in ([root] if root.is_file() else sorted(root.rglob("run.json")))]
    records = []
    for path in {p.resolve(): p for p in files}.values():  # a folder and a run inside it: the run once
        try:
            record = json.loads(read_regular(path, _MAX_RECORD_BYTES))
            why = _problem(record)
        except RecursionError:
            why = "its JSON is nested deeper than Python's parser goes"
        except (OSError, ValueError) as err:  # UnicodeDecodeError is a ValueError
            why = first_line(err)
        if why is None:
            records.append(record)
        elif skipped is not None:
            skipped(path, why)
    return records
