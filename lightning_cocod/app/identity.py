"""Who a run is: its id, name, method and sizes, and the code it ran (version, git commit)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lightning_cocod import __version__
from lightning_cocod.methods import PERIODIC, method_of_class

_SOURCE = Path(__file__).resolve().parents[2]


def git_commit(path: Path = _SOURCE) -> tuple[str, bool]:
    """(commit, dirty) of the checkout whose root is ``path``; ("unknown", False) otherwise.

    Only the root counts: an installed package lives in site-packages, often inside a virtualenv
    inside the user's own repository, whose commit says nothing about this code.
    """

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, timeout=10)
        return done.stdout if done.returncode == 0 else ""

    try:
        top, commit = git("rev-parse", "--show-toplevel", "HEAD").splitlines() or ("", "")
    except (OSError, subprocess.SubprocessError, ValueError):
        return "unknown", False
    if not top or Path(top).resolve() != Path(path).resolve():
        return "unknown", False
    return commit, bool(git("status", "--porcelain", "--untracked-files=no").strip())


def code_of(record: dict[str, Any]) -> str:
    """The code a run ran, as the report and resolved.yaml name it: the package's version, and
    its commit when it ran from a checkout (runs recorded before versions were kept: the commit)."""
    commit = record.get("git_commit", "unknown")
    git = None if commit == "unknown" else f"git {commit}{'+dirty' if record.get('git_dirty') else ''}"
    if record.get("version") is None:
        return git or "unknown"
    return f"lightning_cocod {record['version']}" + (f" ({git})" if git else "")


def merge_variant(progress: float | None) -> str | None:
    """A CoCoD merge other than the default as run names and report labels add it: "progress 0.5"."""
    from lightning_cocod.core.averaging import DEFAULT_PROGRESS  # torch: only where a run is named

    return None if progress is None or progress == DEFAULT_PROGRESS else f"progress {progress:g}"


def variant_of(record: dict[str, Any]) -> str | None:
    """What sets a run apart from its method's defaults, as run names and report labels add it:
    a CoCoD merge other than the default ("progress 0.5"), compressed rounds ("int8") or DDP's
    compression hook ("powersgd")."""
    progress = record.get("progress", 1.0) if record.get("method") == "cocod" else None
    parts = [merge_variant(progress), record.get("compression"), record.get("comm_hook")]
    return ", ".join(p for p in parts if p) or None


def run_name(method: str, tau: Any, workers: int, seed: int, variant: str | None = None) -> str:
    """``cocod-tau4-w2-s0``; a variant adds itself: ``cocod-tau4-progress0.5-int8-w2-s0``."""
    period = f"-tau{tau}" if tau is not None else ""
    extra = "-" + variant.replace(", ", "-").replace(" ", "") if variant else ""
    return f"{method}{period}{extra}-w{workers}-s{seed}"


def world_size(cfg: DictConfig) -> int:
    return int(cfg.launcher.devices) * int(cfg.launcher.num_nodes)


def make_identity(cfg: DictConfig, job_dir: Path, run_id: str) -> dict[str, Any]:
    """What every record of this run carries (run.json, logger config); the worker adds the
    condition it measured (``app.condition``)."""
    name = method_of_class(str(cfg.strategy._target_))
    tau = cfg.strategy.get("tau") if name in PERIODIC else None
    progress = float(cfg.strategy.progress) if "progress" in cfg.strategy else None
    options = {
        "method": name,
        "progress": progress,  # CoCoD's merge: x_i <- avg + progress * (x_i - snap_i)
        "compression": cfg.strategy.get("compression"),  # CoCoD's and Local-SGD's codec
        "comm_hook": cfg.strategy.get("comm_hook"),  # S-SGD's DDP hook: then no baseline of speedups
    }
    workers = world_size(cfg)
    commit, dirty = git_commit()
    return {
        "id": os.path.relpath(job_dir, Path(cfg.out_root).resolve()),
        "name": run_name(name, tau, workers, cfg.seed, variant_of(options)),
        "group": cfg.group,
        "run_id": run_id,
        "tau": tau,
        **options,
        "workers": workers,
        "seed": cfg.seed,
        "global_batch_size": cfg.data.batch_size * workers,
        # The link it really ran over is measured on the worker (``app.condition``): without root
        # a rate asked for runs unshaped. Model, data and batch are the condition's.
        "rate_requested": cfg.launcher.get("rate"),
        "version": __version__,
        "git_commit": commit,
        "git_dirty": dirty,
        "dir": str(job_dir),
    }
