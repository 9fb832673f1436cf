"""A run folder belongs to one run: the first to create its claim file, ``.cocod-run``.

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
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lightning_cocod.app.checks import ConfigError

CLAIM = ".cocod-run"
# Records a fresh run would replace in a folder claimed before claims existed (or made by hand).
_RECORDS = ("run.json", "resolved.yaml")
# Open, locked claim files of this process, by folder: kept open so the lock lasts until it exits.
_HELD: dict[Path, int] = {}


def holder(folder: Path) -> str:
    """Who claimed ``folder``, in words, from its claim file ("" when it says nothing yet)."""
    try:
        info = json.loads((folder / CLAIM).read_text())
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
            fd = os.open(path, os.O_RDWR)
    except OSError as err:
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


def is_rank_zero(env: dict[str, str] | os._Environ = os.environ) -> bool:
    """The process that claims for its run: the launching process of the cpu/gpu launchers, or
    global rank 0 under torchrun (RANK) or srun (SLURM_PROCID): one claim per run, not per rank."""
    return int(env.get("RANK", env.get("SLURM_PROCID", "0"))) == 0


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
