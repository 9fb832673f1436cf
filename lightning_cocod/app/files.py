"""Checks on the files a run reads and writes: the checkpoint it resumes from, its output root."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lightning_cocod.app.checks import bad, first_line


def resume_checkpoint(cfg: DictConfig, job_dir: Path, verify: bool = True) -> str | None:
    """The checkpoint a run continues from, checked to exist and (``verify``) to be a whole
    checkpoint, or None for a fresh start. ``last``: the newest ``last*.ckpt`` of ``job_dir``;
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
    """The run folder's most recently written ``last*.ckpt`` (a fresh run beside an old one
    writes last-v1.ckpt), or None."""
    found = sorted((job_dir / "checkpoints").glob("last*.ckpt"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def checkpoint_problem(path: Path) -> str | None:
    """Why ``path`` cannot be resumed from (truncated, empty, not a checkpoint), or None."""
    try:
        from lightning_cocod.strategies.checkpointing import verify_checkpoint
    except ImportError:
        verify_checkpoint = None
    if verify_checkpoint is not None:
        try:
            verify_checkpoint(path)  # its checksum, then that it loads; the message names the file
        except ValueError as err:
            return first_line(err)
        return None
    import torch

    try:
        torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as err:  # noqa: BLE001 - whatever a bad file raises, it cannot be resumed from
        return f"{path}: {first_line(err)}"
    return None


def check_out_root(out_root: Any) -> None:
    """``out_root`` can be made and written: probed with a folder that is removed at once."""
    if not isinstance(out_root, str) or not out_root:
        raise bad("out_root", out_root, "the path of a folder for the runs' outputs")
    existing = Path(out_root).expanduser().absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise bad("out_root", out_root, f"a folder this user can write ({existing} is a file)")
    try:
        with tempfile.TemporaryDirectory(dir=existing, prefix=".cocod-probe-"):
            pass
    except OSError as err:
        raise bad(
            "out_root",
            out_root,
            f"a folder this user can write (cannot create one in {existing}: {err.strerror})",
        ) from None
