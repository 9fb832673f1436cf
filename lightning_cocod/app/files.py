"""Checks on the files a run reads and writes: the checkpoint it resumes from, its folders."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lightning_cocod.app.checks import ConfigError, bad, first_line


def resume_checkpoint(cfg: DictConfig, job_dir: Path, verify: bool = True) -> str | None:
    """The checkpoint a run continues from, checked to exist and (``verify``) to be a whole
    checkpoint, or None for a fresh start. ``last``: the ``last*.ckpt`` of ``job_dir`` that got furthest;
    ``auto``: the same when there is one, else a fresh start (what a requeued or restarted job
    wants: the same command either way)."""
    from lightning_cocod.strategies.checkpointing import verify_checkpoint

    resume = cfg.checkpoint.resume
    if resume is None:
        return None
    if resume in ("last", "auto"):
        newest = newest_checkpoint(job_dir)
        if newest is None and resume == "auto":
            return None
        path = newest or job_dir / "checkpoints" / "last.ckpt"
    else:
        path = Path(resume).expanduser()
    if not path.is_file():
        where = (
            f"no {path}: pass the run_id of the run to continue" if resume == "last" else f"no file {path}"
        )
        raise bad("checkpoint.resume", resume, f"null, last, auto, or the path of a .ckpt file ({where})")
    try:
        if verify:
            verify_checkpoint(path)  # loads it as data and checks its integrity; the message names the file
    except ValueError as err:
        accepted = f"null, last, auto, or a whole checkpoint file ({first_line(err)})"
        raise bad("checkpoint.resume", resume, accepted) from None
    return str(path)


def newest_checkpoint(job_dir: Path) -> Path | None:
    """The run folder's ``last*.ckpt`` that got furthest, by the step recorded in it (a file's
    time says nothing: a ``touch``, a ``cp`` or a sync tool changes it), the later version
    (``last-v1.ckpt`` beside ``last.ckpt``) on a tie; files that cannot be read come last, so
    that one is chosen only when no other is there, to be refused by name. None without any."""
    from lightning_cocod.strategies.checkpointing import saved_step

    def progress(path: Path) -> tuple[bool, int, int]:
        step = saved_step(path)
        version = re.fullmatch(r"last-v(\d+)\.ckpt", path.name)
        return step is not None, -1 if step is None else step, int(version.group(1)) if version else 0

    found = [(progress(p), p) for p in (job_dir / "checkpoints").glob("last*.ckpt")]
    return max(found, key=lambda pair: pair[0])[1] if found else None


def check_out_root(out_root: Any) -> None:
    """``out_root`` can be made and written: its nearest existing folder is probed."""
    from lightning_cocod._files import unwritable

    existing = Path(out_root).expanduser().absolute()
    while not existing.exists():
        existing = existing.parent
    problem = f"{existing} is a file" if not existing.is_dir() else unwritable(existing)
    if not out_root or problem:
        raise bad("out_root", out_root, f"a folder this user can write ({problem or 'the path of one'})")


def check_run_folder(cfg: DictConfig, folder: Path) -> None:
    """The folders of an existing run that it will write to can be written (a read-only
    checkpoints/ would otherwise fail at the first save, an epoch in)."""
    from lightning_cocod._files import unwritable

    saves = cfg.checkpoint.every_n_epochs or cfg.checkpoint.every_n_steps or cfg.checkpoint.every_n_minutes
    for path in (folder, *([folder / "checkpoints"] if saves else [])):
        problem = path.is_dir() and unwritable(path)
        if problem:
            what = "checkpoints" if path.name == "checkpoints" else "records"
            raise ConfigError(
                f"cannot write in {path} ({problem}), where this run writes its {what}; accepted: a folder "
                "this user can write (another run_id, or out_root=...)"
            )
