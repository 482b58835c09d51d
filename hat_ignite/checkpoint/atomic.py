"""Crash-safe writes of checkpoint files (and of any file written the same way).

:func:`atomic_save` / :func:`atomic_write` put the data in a hidden temporary file in the
destination directory, flush and fsync it, rename it over the destination with
:func:`os.replace`, and fsync the directory; only then may the caller delete older files.
A crash at any point leaves the previous file intact plus, at worst, a ``.*.tmp`` file that no
checkpoint listing matches (:func:`is_temp_file`). :func:`atomic_link` makes a second name for a
finished file the same way. A failed write is a :class:`~hat_ignite.errors.CheckpointError`
naming the file (and a full disk as such, :func:`disk_full`), with the temporary file removed.

>>> import tempfile, torch
>>> tmp = tempfile.TemporaryDirectory()
>>> path = atomic_save({"w": torch.ones(2)}, f"{tmp.name}/model.pth.tar")
>>> sorted(os.listdir(tmp.name)), is_temp_file(".model.pth.tar.1a2b3c4d.tmp")
(['model.pth.tar'], True)
>>> tmp.cleanup()
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import uuid
from typing import Any, BinaryIO, Callable, Iterator, Union

import torch

from hat_ignite.errors import CheckpointError

__all__ = ["PathLike", "atomic_save", "atomic_write", "atomic_link", "is_temp_file", "disk_full"]

PathLike = Union[str, "os.PathLike[str]"]

_TEMP_SUFFIX = ".tmp"


def is_temp_file(name: str) -> bool:
    """Whether a file name is one of the temporary files :func:`atomic_save` writes.

    >>> is_temp_file(".checkpoint-last.pth.tar.1a2b3c4d.tmp"), is_temp_file("checkpoint-last.pth.tar")
    (True, False)
    """
    return os.path.basename(name).startswith(".") and name.endswith(_TEMP_SUFFIX)


def _temp_path(path: str) -> str:
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name}.{uuid.uuid4().hex[:8]}{_TEMP_SUFFIX}")


def _fsync_dir(directory: str) -> None:
    """Make a rename inside ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


#: A file system with less free space than this when a write failed is taken to be full.
_FULL_BELOW = 1 << 20


def disk_full(directory: str, exc: BaseException) -> bool:
    """Whether a write into ``directory`` failed for want of space.

    ``ENOSPC`` / ``EDQUOT`` say so; other errors count when the file system has less than 1 MiB
    free for this user at the time (call it before removing what the write left): torch's zip
    writer turns a short write on a full disk into ``RuntimeError: ... unexpected pos``.
    """
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:
        info = os.statvfs(directory)
    except OSError:
        return False
    return info.f_bavail * info.f_frsize < _FULL_BELOW


def _write_error(path: str, exc: BaseException, full: bool = False) -> CheckpointError:
    directory = os.path.dirname(path)
    if full:
        return CheckpointError(
            f"Could not write checkpoint {path}: no space left on the device ({type(exc).__name__}: "
            f"{exc}). Previously written checkpoints are untouched. Free space on {directory}, or "
            f"choose another save_dir."
        )
    return CheckpointError(
        f"Could not write checkpoint {path}: {type(exc).__name__}: {exc}. Previously written "
        f"checkpoints are untouched. Check free disk space and write permission on "
        f"{directory}, or choose another save_dir."
    )


@contextlib.contextmanager
def _replaced_atomically(path: str) -> Iterator[str]:
    """Yield a temporary path beside ``path``; once the block has filled it, rename it over
    ``path`` and fsync the directory. On any failure the temporary file is removed and an
    ``Exception`` becomes a :class:`CheckpointError` naming ``path``."""
    tmp = _temp_path(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as exc:
        full = isinstance(exc, Exception) and disk_full(os.path.dirname(path), exc)  # before freeing tmp
        _remove_quietly(tmp)
        if isinstance(exc, Exception):
            raise _write_error(path, exc, full) from exc
        raise
    _fsync_dir(os.path.dirname(path))


def atomic_save(obj: Any, path: PathLike) -> str:
    """Save ``obj`` with :func:`torch.save` so that ``path`` is either old or complete.

    Writes a hidden temporary file next to ``path``, flushes and fsyncs it, renames it over
    ``path`` and fsyncs the directory. On any failure the temporary file is removed and ``path``
    keeps its previous content.

    Args:
        obj: what to save.
        path: the destination file; its directory must exist.

    Returns:
        The absolute path written.

    Raises:
        CheckpointError: the write failed (disk full, no permission...); names the path.
    """
    return atomic_write(path, lambda f: torch.save(obj, f))


def atomic_write(path: PathLike, write: Callable[[BinaryIO], Any]) -> str:
    """Write ``path`` through ``write(file)`` so that ``path`` is either old or complete.

    The crash-safe write of :func:`atomic_save` for any serializer that writes to a binary file
    object (``torch.jit.save``, ``torch.export.save``, ``f.write(data)``).

    Args:
        path: the destination file; its directory must exist.
        write: called once with the open temporary file.

    Returns:
        The absolute path written.

    Raises:
        CheckpointError: the write failed (disk full, no permission...); names the path.

    >>> import tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = atomic_write(f"{tmp.name}/data.bin", lambda f: f.write(b"abc"))
    >>> open(path, "rb").read(), sorted(os.listdir(tmp.name))
    (b'abc', ['data.bin'])
    >>> tmp.cleanup()
    """
    path = os.path.abspath(os.fspath(path))
    with _replaced_atomically(path) as tmp, open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    return path


def atomic_link(src: PathLike, dst: PathLike) -> str:
    """Make ``dst`` a complete copy of the finished file ``src``, atomically.

    A hard link costs no space or time; where the file system has none, the bytes are copied
    and fsync'ed. Either way ``dst`` appears through one :func:`os.replace`, and removing ``src``
    later leaves ``dst`` intact.

    Returns:
        The absolute path of ``dst``.

    Raises:
        CheckpointError: neither linking nor copying worked; names both paths.
    """
    src = os.path.abspath(os.fspath(src))
    dst = os.path.abspath(os.fspath(dst))
    with _replaced_atomically(dst) as tmp:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
    return dst
