"""Checks on the files a run reads and writes: the checkpoint it resumes from, its output root."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lightning_cocod.app.checks import bad, first_line


def resume_checkpoint(cfg: DictConfig, job_dir: Path, verify: bool = True) -> str | None:
    """The checkpoint a run continues from, checked to exist and (``verify``) to be a whole
    checkpoint, or None for a fresh start. ``last``: the ``last*.ckpt`` of ``job_dir`` that got furthest;
    ``auto``: the same when there is one, else a fresh start (what a requeued or restarted job
    wants: the same command either way)."""
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
    if verify:
        problem = checkpoint_problem(path)
        if problem:
            raise bad("checkpoint.resume", resume, f"null, last, auto, or a whole checkpoint file ({problem})")
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


def checkpoint_problem(path: Path) -> str | None:
    """Why ``path`` cannot be resumed from (truncated, empty, altered, not a checkpoint, not plain
    data), or None."""
    from lightning_cocod.strategies.checkpointing import verify_checkpoint

    try:
        verify_checkpoint(path)  # loads it as data and checks its integrity; the message names the file
    except ValueError as err:
        return first_line(err)
    return None


def check_out_root(out_root: Any) -> None:
    """``out_root`` can be made and written: its nearest existing folder is probed."""
    from lightning_cocod._files import unwritable

    if not out_root:  # a string: the schema's type
        raise bad("out_root", out_root, "the path of a folder for the runs' outputs")
    existing = Path(out_root).expanduser().absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise bad("out_root", out_root, f"a folder this user can write ({existing} is a file)")
    problem = unwritable(existing)
    if problem:
        accepted = f"a folder this user can write (cannot create one in {existing}: {problem})"
        raise bad("out_root", out_root, accepted)
