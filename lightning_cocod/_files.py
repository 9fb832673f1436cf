"""Writing a file so that a reader, or a machine that loses power, sees the old file or the new one.

Imports nothing beyond the standard library, so any part of the package (the launchers, the app,
the checkpoint saves) can use it without loading torch or Lightning.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
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

    ``data`` may also be a writer that writes the file at the path it is given (a checkpoint
    plugin, a download), where an empty one is made for it; ``tmp`` names that temporary file when a reader must know it (the
    default is hidden and carries the pid). ``durable``: the bytes reach the disk before the
    rename and the rename before the return; without it a crash can leave an empty or short file
    under the new name on some file systems (ext4 delalloc). Turn it off only for files nobody
    needs after a crash (a progress line).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp or path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # The rename replaces whatever is at ``path`` (a symbolic link too: its target is never
    # touched); the temporary is made here, a new regular file, so that neither these bytes nor
    # a writer's go through a link planted under its name, in a folder others can write.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # ours by its pid: a leftover of a process that had it before, or a plant
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            if not callable(data):
                fh.write(data.encode() if isinstance(data, str) else data)
        if callable(data):
            data(tmp)
        if durable:
            fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def open_to_write(path: str | os.PathLike) -> int:
    """A descriptor of ``path`` for writing from its start (a log), created if absent: the file
    itself, never the target of a symbolic link planted under its name, and only a regular file
    (a FIFO would block the writer, a device take the writes); ``OSError`` in one line otherwise."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENXIO):  # a link; a FIFO nobody reads
            raise not_regular(path) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise not_regular(path)
    os.ftruncate(fd, 0)  # only now that it is known to be a file of its own
    os.set_blocking(fd, True)
    return fd


def not_regular(path: str | os.PathLike) -> OSError:
    kind = "a symbolic link, not a file of its own" if os.path.islink(path) else "not a regular file"
    return OSError(f"{path} is {kind}")


_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
    stat.S_IFDIR: "a folder",
}
_KINDS[stat.S_IFSOCK] = "a socket"


def read_regular(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of the regular file at ``path`` (a link to one is followed), at most ``limit`` of
    them, or ``OSError`` in one line: a FIFO would block the reader, and a device (a link to
    /dev/zero) or a huge file would fill its memory."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(
                f"{path} is not a regular file but {_KINDS.get(stat.S_IFMT(mode), 'something else')}"
            )
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(f"{path} is larger than {limit} bytes, more than any file of this package there holds")
    return data


def unwritable(folder: str | os.PathLike) -> str | None:
    """Why no file can be created in ``folder`` (read-only file system, permissions), or None.
    Probed by creating one: os.access answers for the mode bits, not for a read-only mount."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".cocod-probe-"):
            return None
    except OSError as err:
        return err.strerror or type(err).__name__
