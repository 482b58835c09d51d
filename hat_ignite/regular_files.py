"""Reading only regular files: a FIFO, socket or device in a work dir never blocks a run.

Opening a FIFO for reading waits until something writes to it, forever if nothing does; a
checkpoint, lock or metrics path that someone replaced with one would hang ``--resume auto`` (and
the wait cannot be interrupted by the signal handlers, which only run between Python bytecodes).
So every file hat-ignite reads from a work dir is opened with :func:`open_regular`, which opens
without blocking, checks that the file is a regular one (after following symbolic links), and
only then reads; or checked with :func:`is_regular_file` where a library opens the path itself.

>>> import tempfile
>>> folder = tempfile.mkdtemp()
>>> fifo = os.path.join(folder, "last.pth.tar")
>>> os.mkfifo(fifo)
>>> is_regular_file(fifo)
False
>>> open_regular(fifo)
Traceback (most recent call last):
...
hat_ignite.regular_files.NotRegularFileError: .../last.pth.tar is a FIFO (named pipe), not a regular file: ...
"""

from __future__ import annotations

import errno
import os
import stat
from typing import IO, Any

__all__ = ["NotRegularFileError", "is_regular_file", "open_regular"]

_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
)


def _kind(mode: int) -> str:
    return next((label for test, label in _KINDS if test(mode)), "not a regular file")


class NotRegularFileError(OSError):
    """A path to read is a FIFO, socket, device or directory (an ``OSError``, ``EINVAL``)."""

    def __init__(self, path: str, mode: int) -> None:
        self.kind = _kind(mode)
        super().__init__(
            errno.EINVAL,
            f"{path} is {self.kind}, not a regular file: hat-ignite reads only regular files. "
            f"Remove it or put the real file in its place",
        )
        self.filename = path

    def __str__(self) -> str:
        return str(self.strerror)


def is_regular_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a regular file (following symbolic links); never opens it."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def open_regular(path: str | os.PathLike, mode: str = "r", encoding: str | None = None) -> IO[Any]:
    """``open(path, mode)`` for reading, refusing anything but a regular file without blocking.

    Args:
        path: the file to read.
        mode: ``"r"`` or ``"rb"``.
        encoding: the text encoding (text mode only; default UTF-8).

    Raises:
        NotRegularFileError: ``path`` is a FIFO, socket, device or directory.
        OSError: as :func:`open` (missing file, no permission).
    """
    if mode not in ("r", "rb"):
        raise ValueError(f"open_regular reads only: mode must be 'r' or 'rb', got {mode!r}")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFileError(os.fspath(path), info.st_mode)
        os.set_blocking(fd, True)
        if mode == "rb":
            return os.fdopen(fd, "rb")
        return os.fdopen(fd, "r", encoding=encoding or "utf-8")
    except BaseException:
        os.close(fd)
        raise
