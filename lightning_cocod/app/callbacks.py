"""The callbacks a run's config asks for, by the key that configures each: ``fit`` adds them to the
Trainer, and ``checks`` builds each once so that a bad value stops the command before any worker
starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lightning_cocod.app.identity import world_size


def _checkpoints(cfg: DictConfig, job_dir: Path, resume: str | None, title: str) -> list[Any]:
    from lightning_cocod.callbacks import PeriodicCheckpoint

    ckpt = cfg.checkpoint
    if not (ckpt.every_n_epochs or ckpt.every_n_steps or ckpt.every_n_minutes):
        return []
    periods = {key: ckpt[key] for key in ("every_n_epochs", "every_n_steps", "every_n_minutes")}
    return [PeriodicCheckpoint(job_dir / "checkpoints", **periods, resume_from=resume)]


def _hetero(cfg: DictConfig, job_dir: Path, resume: str | None, title: str) -> list[Any]:
    from lightning_cocod.callbacks import ProportionalSampling, SimulatedSlowdown

    hetero, callbacks = cfg.hetero, []
    if hetero.proportional or hetero.batch_sizes is not None:
        sizes = list(hetero.batch_sizes) if hetero.batch_sizes is not None else None
        total = cfg.data.batch_size * world_size(cfg)
        callbacks.append(ProportionalSampling(total, sizes, every_n_epochs=hetero.every_n_epochs))
    if hetero.slowdown is not None:
        callbacks.append(SimulatedSlowdown(list(hetero.slowdown)))
    return callbacks


def _progress(cfg: DictConfig, job_dir: Path, resume: str | None, title: str) -> list[Any]:
    from lightning_cocod.callbacks import ProgressLine

    if not cfg.progress_every_s:
        return []
    # The cpu/gpu launchers send the ranks' output to files: rank 0 writes the line for them.
    path = progress_path(job_dir) if cfg.launcher.name in ("cpu", "gpu") else None
    return [ProgressLine(title, every_s=cfg.progress_every_s, path=path)]


CALLBACKS = {"checkpoint": _checkpoints, "hetero": _hetero, "progress_every_s": _progress}


def progress_path(job_dir: Path) -> Path:
    return job_dir / "workers" / "progress.txt"
