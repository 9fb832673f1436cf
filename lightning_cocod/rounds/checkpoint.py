"""What a checkpoint needs beyond Lightning's own to resume a run of ours exactly, and how it is
written and read so that no crash, kill, bad disk or file of unknown origin ever makes a run train
from something wrong, or run code that came with a file.

The weights are identical on every rank at a checkpoint (it is a synchronisation point), but
each worker's optimizer state (momentum stays local) and random state are its own: rank 0
gathers them into ``checkpoint[STATE_KEY]["ranks"]`` and each rank takes its own back on resume.

Trust: a checkpoint is data. It is unpickled with ``weights_only=True`` (tensors, numbers,
strings, containers and the types registered with ``torch.serialization.add_safe_globals``), so
a file whose pickle would call a function is refused before anything of it runs; a file the
user trusts by name (``TRUST_ENV``, or ``weights_only=False`` given to ``fit`` by hand) is the
only exception.

Integrity: ``atomic_save`` records a SHA-256 of each top-level entry's content (every tensor's
bytes, every plain value) inside the file, under ``INTEGRITY_KEY``; ``read_checkpoint`` recomputes
it after loading and refuses a file whose content differs, naming the entry. The record travels
with the file (a copy, a sync tool), and no file beside it confuses Lightning's own look-ups (HPC
checkpoints are found by the digits of every file name in the folder). A ``<file>.sha256`` of
the bytes, what earlier versions wrote beside the file, is still checked for a file that has no
record inside. The file is written under a hidden temporary name, flushed to disk and renamed, so
a crash never leaves a truncated file where the last good one was.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lightning_cocod._files import atomic_write

log = logging.getLogger(__name__)

STATE_KEY = "lightning_cocod"
INTEGRITY_KEY = "lightning_cocod_integrity"
TRUST_ENV = "LIGHTNING_COCOD_TRUSTED_CHECKPOINTS"
DIGEST_SUFFIX = ".sha256"  # what earlier versions wrote beside a checkpoint
_TMP_PREFIX = ".cocod-partial-"
_SHA256 = re.compile(r"[0-9a-f]{64}")


class CheckpointError(ValueError):
    """A checkpoint that must not be trained from: missing, empty, truncated, altered, or not plain data."""


def rng_state() -> dict[str, Any]:
    # torch's generators drive the on-device augmentation. Tensors only: the checkpoint stays data.
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


# -- integrity -------------------------------------------------------------------------------------


# How far a digest may walk beyond the objects a value holds. A pickle can hold one object at many
# places (a 300 KB file can reach one list by 2**40 paths), and the digest walks each place; our
# checkpoints and Lightning's share little, so a value past this is no checkpoint of theirs.
_MAX_PATHS_OVER_OBJECTS = 1_000_000
_MAX_DEPTH = 100  # the digest recurses, and Python's limit (1000 frames, a fit's stack included) would end it


def content_digest(value: Any) -> str:
    """SHA-256 of ``value`` as a checkpoint holds it: the same before saving and after loading,
    on any device and whatever storage a tensor shares, and different if one byte of a tensor
    or one plain value changes. ``ValueError`` in one line for a value that contains itself, is
    nested too deep, or reaches its objects by so many paths that digesting it would not end."""
    _check_walkable(value)
    return _digest(value)


def _digest(value: Any) -> str:
    sha = hashlib.sha256()
    _feed(sha, value)
    return sha.hexdigest()


def _check_walkable(value: Any) -> None:
    """Counts the paths ``_feed`` would take through ``value`` by visiting each container once
    (memoised by id), iteratively, so that the count itself cannot hang or overflow the stack."""
    paths: dict[int, int] = {}  # id -> paths through it and below, once finished
    on_path: set[int] = set()
    stack: list[tuple[Any, int, bool]] = [(value, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        children = _children(node)
        if children is None:
            continue
        if done:
            on_path.discard(id(node))
            paths[id(node)] = 1 + sum(paths.get(id(c), 1) for c in children)
            continue
        if id(node) in on_path:
            raise ValueError(f"it contains itself (a {type(node).__name__} inside its own content)")
        if id(node) in paths:
            continue
        if depth > _MAX_DEPTH:
            raise ValueError(f"it is nested more than {_MAX_DEPTH} containers deep")
        on_path.add(id(node))
        stack.append((node, depth, True))
        stack.extend((c, depth + 1, False) for c in children)
    walked = paths.get(id(value), 1)
    if walked > len(paths) + _MAX_PATHS_OVER_OBJECTS:
        raise ValueError(
            f"its {len(paths)} containers are reached by {walked:.3g} paths (objects shared over and over)"
        )


def _children(value: Any) -> list[Any] | None:
    """The values ``_feed`` descends into, or None for a leaf."""
    if isinstance(value, dict):
        return [item for pair in value.items() for item in pair]
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value)
    return None


def _feed(sha: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        if tensor.layout != torch.strided:
            tensor = tensor.to_dense()
        tensor = tensor.cpu().contiguous()
        sha.update(f"tensor {tensor.dtype} {tuple(tensor.shape)}\n".encode())
        sha.update(tensor.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(value, dict):
        sha.update(f"{type(value).__qualname__} {len(value)}\n".encode())
        for key, item in value.items():  # insertion order survives pickling
            _feed(sha, key)
            _feed(sha, item)
    elif isinstance(value, (list, tuple)):
        sha.update(f"{type(value).__qualname__} {len(value)}\n".encode())
        for item in value:
            _feed(sha, item)
    elif isinstance(value, (set, frozenset)):  # iteration order differs between processes
        sha.update(f"{type(value).__qualname__} {sorted(_digest(v) for v in value)}\n".encode())
    elif value is None or isinstance(value, (str, bytes, int, float, complex, torch.dtype, torch.device)):
        # repr: unambiguous (a string's newlines are escaped), and exact for floats
        sha.update(f"{type(value).__qualname__} {value!r}\n".encode())
    else:
        # Only a trusted load reads other objects back; their type is what can be compared reliably.
        sha.update(f"object {type(value).__module__}.{type(value).__qualname__}\n".encode())


def _check_integrity(where: str, checkpoint: dict[str, Any]) -> bool:
    """Raise ``CheckpointError`` if ``checkpoint`` differs from the record in it; False if it has none.
    Removes the record: what is returned is what was saved."""
    if not isinstance(checkpoint, dict) or INTEGRITY_KEY not in checkpoint:
        return False
    record = checkpoint.pop(INTEGRITY_KEY)
    digests = record.get("sha256") if isinstance(record, dict) else None
    readable = isinstance(digests, dict) and all(
        isinstance(d, str) and _SHA256.fullmatch(d) for d in digests.values()
    )
    if not readable:
        raise CheckpointError(
            f"checkpoint {where} is damaged: its integrity record ({INTEGRITY_KEY}) is unreadable"
        )
    for key in [*digests, *(k for k in checkpoint if k not in digests)]:
        if key not in checkpoint:
            problem = f"its entry {key!r} is missing"
        elif key not in digests:
            problem = f"it has an entry {key!r} that was not there when it was written"
        elif _digest(checkpoint[key]) != digests[key]:  # walkable: read_checkpoint checked it
            problem = f"its entry {key!r} does not match the SHA-256 recorded when it was written"
        else:
            continue
        raise CheckpointError(f"checkpoint {where} is damaged: {problem}; resume from another checkpoint")
    return True


# -- reading ---------------------------------------------------------------------------------------


def trusted(path: str | os.PathLike) -> bool:
    """Whether the user named ``path`` in ``TRUST_ENV`` (``os.pathsep``-separated paths): a file
    whose code, if its pickle holds any, may run when it loads."""
    named = [p for p in os.environ.get(TRUST_ENV, "").split(os.pathsep) if p]
    return any(os.path.realpath(os.path.expanduser(p)) == os.path.realpath(path) for p in named)


def read_checkpoint(
    path: str | os.PathLike,
    load: Callable[[bool], Any] | None = None,
    *,
    trust: bool = False,
    warn_unverified: bool = True,
) -> dict[str, Any]:
    """The checkpoint at ``path``, loaded as data and checked whole, or ``CheckpointError`` in one
    line naming the file and what is wrong.

    ``load(weights_only)`` reads it (the strategy's checkpoint IO); by default torch.load on the
    CPU, memory-mapped. ``trust`` (or the path named in ``TRUST_ENV``) lets its pickle run code.
    Its integrity record must match; a file without one is checked against a ``.sha256`` beside it
    if there is one, and otherwise loads with a warning (``warn_unverified``) that nothing vouches
    for its content (a plain Lightning checkpoint, or one written before the record existed).
    """
    local = "://" not in str(path)
    where = str(Path(path).resolve()) if local else str(path)  # a "last" link is its target
    if local:
        target = Path(where)
        if not target.is_file():
            raise CheckpointError(f"checkpoint {where} does not exist or is not a file")
        if target.stat().st_size == 0:
            raise CheckpointError(f"checkpoint {where} is empty (0 bytes): it was never written completely")
    as_data = not (trust or (local and trusted(where)))
    try:
        checkpoint = load(as_data) if load is not None else _torch_load(where, as_data)
    except Exception as err:  # noqa: BLE001 - any failure to read means the file cannot be used
        raise CheckpointError(_unreadable(where, err)) from None
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"checkpoint {where} holds a {type(checkpoint).__name__}, not a checkpoint")
    try:  # before anything walks it: the digest, Lightning's loading, the caller's code
        _check_walkable(checkpoint)
    except ValueError as err:
        raise CheckpointError(
            f"checkpoint {where} is no checkpoint of ours or Lightning's: {err}; refused"
        ) from None
    verified = _check_integrity(where, checkpoint) or (local and _check_legacy_digest(where))
    if not verified and warn_unverified:
        log.warning(
            f"checkpoint {where} carries no integrity record (written by Lightning itself or by an older "
            "lightning_cocod): it loaded, but nothing shows that its content is what was saved"
        )
    return checkpoint


def _torch_load(path: str | os.PathLike, weights_only: bool) -> Any:
    # Memory-mapped: tensors are read when used, so reading only the pickle costs only the pickle.
    return torch.load(path, map_location="cpu", weights_only=weights_only, mmap=True)


def verify_checkpoint(path: str | os.PathLike) -> None:
    """Raise ``CheckpointError`` (one line naming the file) unless ``path`` loads as data and whole."""
    read_checkpoint(path)


def _unreadable(where: str, err: BaseException) -> str:
    text = " ".join(str(err).split())
    # torch names the callable two ways: "Unsupported global: GLOBAL x.f" for a module it allows
    # in general, "unsupported GLOBAL x.f whose module x is blocked" for os, posix, subprocess, ...
    code = re.search(r"[Uu]nsupported (?:global: )?GLOBAL (\S+)", text)
    if code:
        return (
            f"checkpoint {where} is not plain data: loading it would call {code.group(1)}; refused, as "
            f"checkpoints load as data only (if you trust this file and what it runs, name it in {TRUST_ENV})"
        )
    detail = text.partition("WeightsUnpickler error: ")[2] or text
    detail = re.split(r"(?<=\.) ", detail, maxsplit=1)[0] if detail else type(err).__name__
    return f"checkpoint {where} cannot be read ({detail}): resume from another checkpoint"


def _check_legacy_digest(where: str) -> bool:
    """Check a checkpoint without a record against the ``.sha256`` of its bytes beside it, if any."""
    listed = Path(f"{where}{DIGEST_SUFFIX}")
    try:
        digests = listed.read_text().split()
    except FileNotFoundError:
        return False
    except (OSError, UnicodeDecodeError):
        digests = []
    if not digests or not all(_SHA256.fullmatch(d) for d in digests):
        raise CheckpointError(
            f"checksum file {listed} is damaged (it holds no SHA-256 digest), so checkpoint {where} cannot "
            "be checked against it: delete the checksum file to load the checkpoint unchecked, or resume "
            "from another checkpoint"
        )
    if file_digest(where) not in digests:
        raise CheckpointError(
            f"checkpoint {where} does not match its checksum in {listed.name} (corrupt or truncated): "
            "resume from another checkpoint"
        )
    return True


def file_digest(path: str | os.PathLike) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def saved_step(path: str | os.PathLike) -> int | None:
    """The ``global_step`` a checkpoint file records, or None if it cannot be read as data."""
    try:
        checkpoint = _torch_load(path, weights_only=True)
    except Exception:  # noqa: BLE001 - an unreadable file has no step to offer
        return None
    step = checkpoint.get("global_step") if isinstance(checkpoint, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


# -- writing ---------------------------------------------------------------------------------------


def _temporary(path: str | os.PathLike) -> Path:
    # Hidden, and without the file's name in it: Lightning reads a version from the digits of every
    # file name that contains "ckpt_" (HPC checkpoints), a half-written one included.
    target = Path(path)
    return target.parent / f"{_TMP_PREFIX}{_name_tag(target.name)}-{socket.gethostname()}-{os.getpid()}"


def _name_tag(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:12]


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporaries of writers of ``path`` on this host that no longer run (a writer
    killed mid-write cannot clean up after itself), earlier versions' names included; returns
    what was removed."""
    target = Path(path)
    if not target.parent.is_dir():
        return []
    ours = re.escape(f"{_TMP_PREFIX}{_name_tag(target.name)}")
    older = rf"{re.escape(target.name)}(?:{re.escape(DIGEST_SUFFIX)})?\.tmp"
    pattern = re.compile(rf"^(?:{ours}|{older})-(.+)-(\d+)$")
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


def atomic_save(
    checkpoint_io: Any, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None
) -> None:
    """Write ``checkpoint`` with its integrity record to ``filepath`` through ``checkpoint_io``:
    whole, on disk, or not at all. The temporary name hides from Lightning's HPC look-up and
    carries host and pid, so that a killed writer's leftover is told from a live one's
    (``remove_stale_temporaries``)."""
    content = {k: v for k, v in checkpoint.items() if k != INTEGRITY_KEY}
    checkpoint = {**content, INTEGRITY_KEY: {"sha256": {k: content_digest(v) for k, v in content.items()}}}
    path = str(filepath)
    if "://" in path:  # remote storage: no rename there, the backend's own semantics apply
        checkpoint_io.save_checkpoint(checkpoint, filepath, storage_options=storage_options)
        return
    remove_stale_temporaries(path)
    # The file must be on disk when this returns (a checkpoint is a synchronisation point, and
    # the rename must not outrun the bytes), so an asynchronous plugin writes through its inner one.
    if type(checkpoint_io).__name__ == "AsyncCheckpointIO":
        checkpoint_io = checkpoint_io.checkpoint_io
    writer = lambda tmp: checkpoint_io.save_checkpoint(checkpoint, tmp, storage_options=storage_options)
    atomic_write(path, writer, tmp=_temporary(path))
    # An earlier version's checksum would describe the file this one replaced (the new file's own
    # record is what a load checks, so a crash before this line misleads nobody).
    remove_digest(path)


def remove_digest(path: str | os.PathLike) -> None:
    """Remove the ``.sha256`` an earlier version wrote beside ``path`` (a top-k file removed, or rewritten)."""
    if "://" not in str(path):
        Path(f"{path}{DIGEST_SUFFIX}").unlink(missing_ok=True)
