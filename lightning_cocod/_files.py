"""Writing a file so that a reader, or a machine that loses power, sees the old file or the new one.

Imports nothing beyond the standard library, so any part of the package (the launchers, the app,
the checkpoint saves) can use it without loading torch or Lightning.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def fsync_dir(folder: str | os.PathLike) -> None:
    """Makes a rename (or a new file) in ``folder`` survive a crash: the entry lives in the folder."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return  # a folder that cannot be opened (some network file systems) cannot be synced either
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike) -> None:
    """Makes the bytes of a file written by someone else (a checkpoint plugin) reach the disk before
    it is renamed into place: a rename can otherwise outrun them, and a crash leave a short file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(
    path: str | os.PathLike,
    data: str | bytes | Callable[[Path], None],
    *,
    durable: bool = True,
    tmp: Path | None = None,
) -> None:
    """Replaces ``path`` with ``data`` (text is UTF-8) through a temporary file in the same folder.

    ``data`` may also be a writer that creates the file at the path it is given (a checkpoint
    plugin, a download); ``tmp`` names that temporary file when a reader must know it (the
    default is hidden and carries the pid). ``durable``: the bytes reach the disk before the
    rename and the rename before the return; without it a crash can leave an empty or short file
    under the new name on some file systems (ext4 delalloc). Turn it off only for files nobody
    needs after a crash (a progress line).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp or path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if callable(data):
            data(tmp)
        else:
            tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        if durable:
            fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def unwritable(folder: str | os.PathLike) -> str | None:
    """Why no file can be created in ``folder`` (read-only file system, permissions), or None.
    Probed by creating one: os.access answers for the mode bits, not for a read-only mount."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".cocod-probe-"):
            return None
    except OSError as err:
        return err.strerror or type(err).__name__
