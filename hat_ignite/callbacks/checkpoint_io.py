"""Checkpoint files on disk: content hashing, crash-safe writes and verified loading.

A checkpoint is a plain dict saved with :func:`torch.save`. The writer adds two keys:

* ``"hat_ignite_format"`` — the format version (:data:`FORMAT_VERSION`);
* ``"content_sha256"`` — the SHA-256 of everything else in the dict (:func:`content_hash`): the
  raw bytes, dtype and shape of every tensor plus the keys, values and nesting around them.

:func:`load_checkpoint` reads a file with ``torch.load(weights_only=True)`` only (never with
arbitrary unpickling), recomputes the hash and compares: a flipped bit anywhere in the content is
an error, not silently different weights. Every failure is a
:class:`~hat_ignite.errors.CheckpointError` naming the absolute path, what is wrong and what to do.

Writes are crash-safe (:func:`atomic_save`): the data goes to a hidden temporary file in the
destination directory, is flushed and fsync'ed, renamed over the destination with
:func:`os.replace`, and the directory is fsync'ed; only then may the caller delete older files.
A crash at any point leaves the previous file intact plus, at worst, a ``.*.tmp`` file that no
checkpoint listing matches (:func:`is_temp_file`).

>>> import tempfile, torch
>>> tmp = tempfile.TemporaryDirectory()
>>> path = atomic_save(with_content_hash({"state_dict": {"w": torch.ones(2)}}), f"{tmp.name}/model.pth.tar")
>>> ckpt = load_checkpoint(path)
>>> ckpt["state_dict"]["w"], len(ckpt["content_sha256"])
(tensor([1., 1.]), 64)
>>> tmp.cleanup()
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import pickle
import re
import shutil
import uuid
import zipfile
from collections.abc import Mapping
from typing import Any, BinaryIO, Callable, Iterator, Union

import torch

from hat_ignite.callbacks.checkpoint_hash import FORMAT_KEY, FORMAT_VERSION, HASH_KEY, content_hash, with_content_hash
from hat_ignite.errors import CheckpointError

__all__ = [
    "FORMAT_VERSION",
    "FORMAT_KEY",
    "HASH_KEY",
    "content_hash",
    "with_content_hash",
    "atomic_save",
    "atomic_write",
    "atomic_link",
    "is_temp_file",
    "load_checkpoint",
    "verify_content_hash",
    "refused_global",
]

logger = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]


_TEMP_SUFFIX = ".tmp"
# "...-epoch-0003-1a2b3c4d.pth.tar" / "...-step-119-1a2b3c4d.pth.tar": the short content hash in a name
_NAMED_HASH = re.compile(r"-(?:epoch|step)-\d+-([0-9a-f]{8})\.pth\.tar$")



# -- crash-safe writing ----------------------------------------------------------------------
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


# -- verified loading ------------------------------------------------------------------------
def _torch_detail(exc: Exception) -> str:
    """The substance of a ``torch.load`` error, without torch's advice to load unsafely.

    torch's weights-only refusal starts with a paragraph suggesting ``weights_only=False``;
    for a file that is not a checkpoint that advice is wrong and for any file it is unsafe.

    >>> _torch_detail(ValueError("Weights only load failed. Re-running `torch.load` with `weights_only` "
    ...     "set to `False` will likely succeed.\\nPlease file an issue: WeightsUnpickler error: \\n\\n"
    ...     "Unsupported operand 16\\n\\nCheck the documentation."))
    'Unsupported operand 16'
    >>> _torch_detail(RuntimeError("PytorchStreamReader failed reading zip archive\\nmore"))
    'PytorchStreamReader failed reading zip archive'
    """
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    advice = re.compile(r"\s*(Please use `torch\.serialization|Re-running `torch\.load`|to allowlist).*$", re.IGNORECASE)
    lines = [advice.sub("", line) or line for line in lines]
    if "weights only load failed" in lines[0].lower():
        marker = next((i for i, line in enumerate(lines) if "WeightsUnpickler error:" in line), None)
        if marker is not None:
            inline = lines[marker].split("WeightsUnpickler error:", 1)[1].strip()
            rest = lines[marker + 1:marker + 2]
            return inline or (rest[0] if rest else "refused by the weights-only unpickler")
        return "refused by the weights-only unpickler"
    return lines[0]


_REFUSED_GLOBAL = re.compile(r"unsupported\s+(?:global:\s*)?GLOBAL\s+([\w.]+)", re.IGNORECASE)


def refused_global(exc: Exception) -> str | None:
    """The global a weights-only load refused (``posix.system``), without torch's advice.

    torch's message goes on to advise ``add_safe_globals([...])`` for that global: for a refused
    file that would let its code run, so it is never repeated.

    >>> refused_global(pickle.UnpicklingError("WeightsUnpickler error: Unsupported global: GLOBAL eval was "
    ...     "not an allowed global by default. Please use `torch.serialization.add_safe_globals([eval])`"))
    'eval'
    >>> refused_global(pickle.UnpicklingError("Trying to load unsupported GLOBAL posix.system whose module "
    ...     "posix is blocked."))
    'posix.system'
    """
    if not isinstance(exc, pickle.UnpicklingError):
        return None
    found = _REFUSED_GLOBAL.search(str(exc))
    return found.group(1) if found else None


#: How to turn a refused pickle into a checkpoint that loads, without running its code here.
RESAVE_SAFELY = (
    "Only if you trust the file's source: convert it in a separate, throw-away environment (a "
    "container or a virtual machine without your credentials or data), where "
    "obj = torch.load(path, weights_only=False) runs whatever the file holds; keep only tensors, "
    "numbers, strings and dicts/lists of them, e.g. torch.save({'state_dict': "
    "{k: v.detach().clone() for k, v in obj['state_dict'].items()}}, 'clean.pth.tar'); and load "
    "clean.pth.tar here. Do not load the original here with unpickling turned on or extra globals allowed"
)


def _is_program_archive(path: str) -> bool:
    """Whether ``path`` is a ``torch.export`` archive (its zip holds ``<root>/archive_format``)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.split("/", 1)[-1] == "archive_format" for name in archive.namelist())
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def _load_error(path: str, exc: Exception) -> CheckpointError:
    detail = _torch_detail(exc)
    refused = refused_global(exc)
    if refused:
        reason = (
            f"it holds Python objects that a weights-only load refuses (the global {refused}); "
            f"checkpoints are never unpickled with weights_only=False. {RESAVE_SAFELY}"
        )
    elif _is_program_archive(path):
        reason = (
            "it is a torch.export program (.pt2, such as the int8 model the int_infer stage writes), "
            "not a checkpoint of weights. Use it as the model instead: dict(type=\"load_quantized_model\", "
            "path=...) in the config, or hat_ignite.quantization.load_quantized_model(path)"
        )
    elif not zipfile.is_zipfile(path):
        reason = (
            f"it is not a complete torch.save archive ({type(exc).__name__}: {detail}). The file "
            f"is truncated (an interrupted write or copy) or is not a checkpoint at all. Use an "
            f"older checkpoint or copy the file again"
        )
    else:
        reason = (
            f"its content is corrupt ({type(exc).__name__}: {detail}). Use an older checkpoint "
            f"or copy the file again"
        )
    return CheckpointError(f"Cannot load checkpoint {path}: {reason}.")


def load_checkpoint(path: PathLike, map_location: Any = "cpu", check_hash: bool = True) -> Any:
    """Load a checkpoint safely and verify its content hash.

    Only ``torch.load(weights_only=True)`` is used; a file that needs arbitrary unpickling is
    refused, never retried unsafely. When the file carries a content hash (every checkpoint this
    package writes does) it is recomputed and must match; when the file name carries a short
    hash (``...-1a2b3c4d.pth.tar``) it must agree with the recorded one. Files written elsewhere
    (a plain ``state_dict``) load without verification, which is logged.

    Args:
        path: the checkpoint file.
        map_location: where tensors are loaded, as in :func:`torch.load` (default the CPU).
        check_hash: verify the recorded content hash (default). ``False`` skips the check.

    Returns:
        The loaded object, usually a dict.

    Raises:
        CheckpointError: the file is missing, empty, truncated, not a checkpoint, holds objects
            a weights-only load refuses, has a newer format version, or its content does not
            match its hash. The message names the absolute path and the reason.

    >>> load_checkpoint("no/such/dir/nope.pth.tar")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    hat_ignite.errors.CheckpointError: Checkpoint /.../no/such/dir/nope.pth.tar does not exist...
    """
    path = os.path.abspath(os.fspath(path))
    if not os.path.exists(path):
        raise CheckpointError(
            f"Checkpoint {path} does not exist. Check the path (and the save_dir / name_prefix "
            f"that produced it)."
        )
    if not os.path.isfile(path):
        raise CheckpointError(f"Checkpoint {path} is not a regular file. Give the path of a checkpoint file.")
    if os.path.getsize(path) == 0:
        raise CheckpointError(
            f"Cannot load checkpoint {path}: the file is empty (0 bytes), so the write that "
            f"created it never finished (a crash or a full disk). Delete it and use an older "
            f"checkpoint."
        )
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises many types for bad files; each becomes one clear error
        raise _load_error(path, exc) from exc
    _check_format(obj, path)
    if check_hash:
        verify_content_hash(obj, path)
    return obj


def _check_format(obj: Any, path: str) -> None:
    """Refuse a checkpoint whose format version this package does not know (a newer one)."""
    if not isinstance(obj, Mapping) or FORMAT_KEY not in obj:
        return
    fmt = obj[FORMAT_KEY]
    if isinstance(fmt, bool) or not isinstance(fmt, int) or fmt < 1:
        raise CheckpointError(
            f"Cannot load checkpoint {path}: its {FORMAT_KEY!r} entry is {fmt!r}, not a format "
            f"version. The file was not written by hat_ignite or was altered; use another checkpoint."
        )
    if fmt > FORMAT_VERSION:
        versions = obj.get("versions")
        writer = versions.get("hat_ignite") if isinstance(versions, Mapping) else None
        by = f" (written by hat_ignite {writer})" if writer else ""
        raise CheckpointError(
            f"Cannot load checkpoint {path}: it uses checkpoint format {fmt}{by}, newer than format "
            f"{FORMAT_VERSION}, the newest this hat_ignite reads. Upgrade hat_ignite to load it."
        )


def verify_content_hash(obj: Any, path: str) -> None:
    """Check a loaded checkpoint against its recorded hash (and its file name's short hash).

    Raises:
        CheckpointError: the content or the name does not match; names ``path``.
    """
    recorded = obj.get(HASH_KEY) if isinstance(obj, Mapping) else None
    if recorded is None:
        logger.info("Checkpoint %s has no recorded content hash (not written by hat_ignite); not verified.", path)
        return
    try:
        actual = content_hash(obj)
    except TypeError as exc:
        raise CheckpointError(f"Cannot load checkpoint {path}: {exc}") from exc
    if not isinstance(recorded, str) or actual != recorded:
        raise CheckpointError(
            f"Checkpoint {path} is corrupt: its content hash is {actual}, but {recorded!r} was "
            f"recorded when it was written, so some bytes changed on disk or in transfer. Use an "
            f"older checkpoint or copy the file again."
        )
    named = _NAMED_HASH.search(os.path.basename(path))
    short = named.group(1) if named else ""
    if short and not recorded.startswith(short):
        raise CheckpointError(
            f"Checkpoint {path} does not match its name: the name carries hash {short}, the "
            f"content hashes to {recorded[:8]}. The file was replaced or renamed; use the file "
            f"the name refers to."
        )
