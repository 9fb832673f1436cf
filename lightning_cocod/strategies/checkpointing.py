"""What a checkpoint needs beyond Lightning's own to resume a run of ours exactly, and how it is
written so that no crash, kill or bad disk ever leaves a file that a run would train from wrongly.

The weights are identical on every rank at a checkpoint (it is a synchronisation point), but
each worker's optimizer state (momentum stays local) and random state are its own: rank 0
gathers them into ``checkpoint[STATE_KEY]["ranks"]`` and each rank takes its own back on resume.

On disk: the file is written under a temporary name and renamed, so a crash mid-write never
leaves a truncated file where the last good one was; a SHA-256 of its bytes goes into
``<file>.sha256`` beside it, and ``verify_checkpoint`` refuses a file whose bytes do not match
(a checksum detects corruption, it does not repair it). The digest file lists the new digest
and the previous one while the rename is under way, so a crash between the two renames leaves
a pair that still verifies.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

STATE_KEY = "lightning_cocod"
DIGEST_SUFFIX = ".sha256"
_TMP_MARK = ".tmp-"


class CheckpointError(ValueError):
    """A checkpoint file that must not be trained from: missing, empty, truncated or corrupt."""


def rng_state() -> dict[str, Any]:
    # torch's generators drive the on-device augmentation. Tensors only, so the checkpoint
    # still loads with torch.load(weights_only=True).
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def gather_to_rank_zero(obj: Any, world_size: int) -> list[Any] | None:
    """Every rank's ``obj`` on rank 0 (None elsewhere); a collective on the default group."""
    if world_size == 1 or not dist.is_initialized():
        return [obj]
    gathered: list[Any] | None = [None] * world_size if dist.get_rank() == 0 else None
    dist.gather_object(obj, gathered, dst=0)
    return gathered


def file_digest(path: str | os.PathLike) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            sha.update(block)
    return sha.hexdigest()


def _digest_path(path: str | os.PathLike) -> Path:
    return Path(f"{path}{DIGEST_SUFFIX}")


def _read_digests(path: str | os.PathLike) -> list[str]:
    try:
        return _digest_path(path).read_text().split()
    except FileNotFoundError:
        return []


def _write_digests(path: str | os.PathLike, digests: list[str]) -> None:
    target = _digest_path(path)
    tmp = Path(f"{target}{_TMP_MARK}{_owner_tag()}")
    tmp.write_text("\n".join(digests) + "\n")
    os.replace(tmp, target)


def _owner_tag() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete ``<file>.tmp-<host>-<pid>`` leftovers of writers on this host that no longer run
    (a writer killed mid-write cannot clean up after itself); returns what was removed."""
    target = Path(path)
    if not target.parent.is_dir():
        return []
    pattern = re.compile(rf"^{re.escape(target.name)}(?:{re.escape(DIGEST_SUFFIX)})?{re.escape(_TMP_MARK)}(.+)-(\d+)$")
    host, removed = socket.gethostname(), []
    for candidate in target.parent.iterdir():
        match = pattern.match(candidate.name)
        if match and match.group(1) == host and not _alive(int(match.group(2))):
            with contextlib.suppress(FileNotFoundError):
                candidate.unlink()
                removed.append(candidate)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def atomic_save(checkpoint_io: Any, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
    """Write ``checkpoint`` to ``filepath`` through ``checkpoint_io``: whole or not at all, with its digest."""
    path = str(filepath)
    if "://" in path:  # remote storage: no rename there, the backend's own semantics apply
        checkpoint_io.save_checkpoint(checkpoint, filepath, storage_options=storage_options)
        return
    remove_stale_temporaries(path)
    # The digest is of the file's bytes: they must be on disk when this returns (a checkpoint is
    # a synchronisation point anyway), so an asynchronous plugin writes through its inner one.
    if type(checkpoint_io).__name__ == "AsyncCheckpointIO":
        checkpoint_io = checkpoint_io.checkpoint_io
    tmp = Path(f"{path}{_TMP_MARK}{_owner_tag()}")
    try:
        checkpoint_io.save_checkpoint(checkpoint, tmp, storage_options=storage_options)
        digest = file_digest(tmp)
        # Either file verifies until the rename is done, whatever earlier crashes left listed.
        previous = _read_digests(path) or ([file_digest(path)] if os.path.isfile(path) else [])
        _write_digests(path, [digest, *previous])
        os.replace(tmp, path)
        _write_digests(path, [digest])
    finally:
        tmp.unlink(missing_ok=True)


def remove_digest(path: str | os.PathLike) -> None:
    """With a checkpoint removed (a top-k file replaced), its digest goes too."""
    if "://" not in str(path):
        _digest_path(path).unlink(missing_ok=True)


def verify_checkpoint(path: str | os.PathLike) -> None:
    """Raise ``CheckpointError`` (one line naming the file) unless ``path`` is a whole checkpoint.

    With a digest file beside it (every checkpoint our strategies write) the bytes must match it;
    without one (a plain Lightning checkpoint) the file must at least be readable as a checkpoint.
    """
    target = Path(path).resolve()  # a "last" link (ModelCheckpoint(save_last="link")) is its target
    if not target.is_file():
        raise CheckpointError(f"checkpoint {target} does not exist or is not a file")
    if target.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {target} is empty (0 bytes): it was never written completely")
    digests = _read_digests(target)
    if digests:
        if file_digest(target) not in digests:
            raise CheckpointError(
                f"checkpoint {target} does not match its checksum in {_digest_path(target).name} "
                "(corrupt or truncated): resume from another checkpoint"
            )
        return
    try:
        torch.load(target, map_location="cpu", weights_only=False, mmap=True)
    except Exception as err:  # noqa: BLE001 - any failure to read means the same thing here
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"checkpoint {target} cannot be read ({first}): resume from another checkpoint") from None
