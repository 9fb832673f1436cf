"""A run's folder and the files it reads and writes: who owns the folder, the checkpoint it resumes
from, and whether it can write.

A run folder belongs to one run: the first to create its claim file, ``.cocod-run``.

Without it two runs given the same folder (the same ``run_id``, or two started in the same second
with the clock's default id) wrote over each other's files: both crashed with errors that never
named the cause, or the second silently replaced the first's records. A claim is created with
O_EXCL, so of two runs exactly one gets it; a run that continues the folder's run
(``checkpoint.resume=last|auto``: a resume, a requeue, a torchrun restart) takes the existing claim
over, once no live process holds it (an flock held for the life of the process that claimed it;
the kernel drops it when that process ends, however it ends).
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import re
import socket
import stat
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lightning_cocod._errors import ConfigError, bad, first_line
from lightning_cocod._files import not_regular, read_regular

CLAIM = ".cocod-run"
# Records a fresh run would replace in a folder claimed before claims existed (or made by hand).
_RECORDS = ("run.json", "resolved.yaml")
# Open, locked claim files of this process, by folder: kept open so the lock lasts until it exits.
_HELD: dict[Path, int] = {}


def holder(folder: Path) -> str:
    """Who claimed ``folder``, in words, from its claim file ("" when it says nothing yet)."""
    try:
        info = json.loads(read_regular(folder / CLAIM, 1 << 16))  # a FIFO in its place would block a read
        started = datetime.datetime.fromtimestamp(info["started_at"]).strftime("%Y-%m-%d %H:%M:%S")
        return f"started {started} by pid {info['pid']} on {info['host']}"
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def claim(folder: Path, continuing: bool, key: str) -> None:
    """Claim ``folder`` for this process, or ConfigError in one line naming ``key`` (the setting
    that chose the folder) and what is accepted. ``continuing``: this run continues the folder's
    own run, so an existing claim is taken over when its process has ended."""
    folder = folder.resolve()
    if folder in _HELD:
        return  # the command claimed it before Hydra ran the job
    path = folder / CLAIM
    try:
        folder.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if not continuing:
                raise _taken(folder, key, holder(folder)) from None
            # Without following a link planted in its place: truncating and writing it below
            # would rewrite the link's target, a file of anyone's.
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise not_regular(path)
    except OSError as err:
        if (
            err.errno in (errno.ELOOP, errno.ENXIO) or err.errno is None
        ):  # no file of ours in the claim's place
            accepted = f"another {key}, or a folder whose {CLAIM} is a run's claim file"
            raise ConfigError(
                f"{key}: cannot claim {folder}: {not_regular(path)}; accepted: {accepted}"
            ) from None
        raise ConfigError(
            f"{key}: cannot claim {folder} ({err.strerror}); accepted: a folder this user can write"
        ) from None
    else:
        existing = [name for name in _RECORDS if (folder / name).exists()]
        if existing and not continuing:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise _taken(folder, key, f"it holds {existing[0]}")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        who = holder(folder)
        raise ConfigError(
            f"{key}: {folder} is in use by a run still going ({who or 'its process is alive'}); accepted: "
            f"another {key}, or wait for that run to end"
        ) from None
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": time.time(), "argv": sys.argv}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
    _HELD[folder] = fd


def _taken(folder: Path, key: str, why: str) -> ConfigError:
    return ConfigError(
        f"{key}: {folder} belongs to another run ({why}); accepted: another {key}, or "
        "checkpoint.resume=last (or auto) to continue that run"
    )


def is_rank_zero() -> bool:
    """The process that claims for its run: the launching process of the cpu/gpu launchers, or
    global rank 0 under torchrun (RANK) or srun (SLURM_PROCID): one claim per run, not per rank."""
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) == 0


def claim_run(cfg: DictConfig, multirun: bool) -> None:
    """Claims the folder of the run Hydra is about to make (its sweep folder under ``-m``), given
    its composed config. A run_id from the clock is pinned in ``cfg``, which Hydra then runs: the
    first of ``<time>``, ``<time>-2``, ... whose folder no other run holds."""
    setting = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    given = any(o.startswith(setting + "=") for o in cfg.hydra.overrides.hydra)
    continuing = cfg.checkpoint.resume in ("last", "auto")
    raw = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(raw, dict)
    from_clock = "${now:" in str(
        raw["launcher"]["run_id"] if raw["run_id"] == "${launcher.run_id}" else raw["run_id"]
    )
    if given or not from_clock:
        claim(Path(OmegaConf.select(cfg, setting)), continuing, setting if given else "run_id")
        return
    clock = cfg.run_id
    for n in range(1, 1000):
        cfg.run_id = cfg.launcher.run_id = clock if n == 1 else f"{clock}-{n}"
        try:
            return claim(Path(OmegaConf.select(cfg, setting)), False, "run_id")
        except ConfigError:
            continue  # another run of the same second: the next free id
    raise ConfigError(f"run_id: every id of {clock}-N is taken; accepted: run_id=... of your own")


def resume_checkpoint(cfg: DictConfig, job_dir: Path, verify: bool = True) -> str | None:
    """The checkpoint a run continues from, checked to exist and (``verify``) to be a whole
    checkpoint, or None for a fresh start. ``last``: the ``last*.ckpt`` of ``job_dir`` that got furthest;
    ``auto``: the same when there is one, else a fresh start (what a requeued or restarted job
    wants: the same command either way)."""
    from lightning_cocod.rounds.checkpoint import verify_checkpoint

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
    from lightning_cocod.rounds.checkpoint import saved_step

    def progress(path: Path) -> tuple[bool, int, int]:
        step = saved_step(path)
        version = re.fullmatch(r"last-v(\d+)\.ckpt", path.name)
        return step is not None, -1 if step is None else step, int(version.group(1)) if version else 0

    found = [(progress(p), p) for p in (job_dir / "checkpoints").glob("last*.ckpt")]
    return max(found, key=lambda pair: pair[0])[1] if found else None


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
