"""Loading a checkpoint file safely: weights-only unpickling, the format version, the content hash.

A checkpoint is a plain dict saved with :func:`torch.save`; the writer adds the format version
and the content hash (:mod:`~hat_ignite.checkpoint.hashing`). :func:`load_checkpoint` reads a
file with ``torch.load(weights_only=True)`` only (never with arbitrary unpickling), recomputes
the hash and compares: a flipped bit anywhere in the content is an error, not silently different
weights. Every failure is a :class:`~hat_ignite.errors.CheckpointError` naming the absolute path,
what is wrong and what to do, without torch's advice to load unsafely.

>>> import tempfile, torch
>>> from hat_ignite.checkpoint.atomic import atomic_save
>>> from hat_ignite.checkpoint.hashing import with_content_hash
>>> tmp = tempfile.TemporaryDirectory()
>>> path = atomic_save(with_content_hash({"state_dict": {"w": torch.ones(2)}}), f"{tmp.name}/model.pth.tar")
>>> ckpt = load_checkpoint(path)
>>> ckpt["state_dict"]["w"], len(ckpt["content_sha256"])
(tensor([1., 1.]), 64)
>>> tmp.cleanup()
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import zipfile
from collections.abc import Mapping
from typing import Any

import torch

from hat_ignite.checkpoint.atomic import PathLike
from hat_ignite.checkpoint.hashing import FORMAT_KEY, FORMAT_VERSION, HASH_KEY, content_hash
from hat_ignite.errors import CheckpointError

__all__ = ["load_checkpoint", "verify_content_hash", "refused_global", "RESAVE_SAFELY"]

logger = logging.getLogger(__name__)

# "...-epoch-0003-1a2b3c4d.pth.tar" / "...-step-119-1a2b3c4d.pth.tar": the short content hash in a name
_NAMED_HASH = re.compile(r"-(?:epoch|step)-\d+-([0-9a-f]{8})\.pth\.tar$")


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
