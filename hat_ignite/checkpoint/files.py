"""Finding the checkpoint files :class:`~hat_ignite.callbacks.checkpoint.Checkpoint` wrote.

:func:`list_checkpoints` lists the periodic files of a directory; :func:`latest_valid_checkpoint`
picks the newest one that loads and verifies (what ``--resume auto`` needs), skipping corrupt
newer files and saying so. Temporary files of an interrupted write are never considered.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any

import torch

from hat_ignite.checkpoint.atomic import PathLike, is_temp_file
from hat_ignite.checkpoint.hashing import HASH_KEY
from hat_ignite.checkpoint.loading import load_checkpoint
from hat_ignite.errors import CheckpointError

__all__ = [
    "scan_checkpoints", "list_checkpoints", "latest_valid_checkpoint",
    "NAME_HASH", "NAME_NUMBER", "checkpoint_number", "weights_finite", "resume_marks",
]

logger = logging.getLogger(__name__)


def scan_checkpoints(save_dir: PathLike, name_prefix: str = "") -> list[tuple[str, int, str]]:
    """``(kind, number, absolute path)`` of the periodic checkpoints in ``save_dir``, oldest first.

    ``kind`` is ``"epoch"`` or ``"step"``; a missing directory has none.
    """
    save_dir = os.path.abspath(os.fspath(save_dir))
    pattern = re.compile(re.escape(name_prefix) + r"checkpoint-(epoch|step)-(\d+)(?:-[0-9a-f]{8})?\.pth\.tar")
    try:
        names = os.listdir(save_dir)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        match = None if is_temp_file(name) else pattern.fullmatch(name)
        if match:
            found.append((match.group(1), int(match.group(2)), os.path.join(save_dir, name)))
    return sorted(found)


def list_checkpoints(save_dir: PathLike, name_prefix: str = "", kind: str | None = None) -> list[str]:
    """The periodic checkpoint files :class:`Checkpoint` wrote in ``save_dir``, oldest first.

    Temporary files of an interrupted write are never listed; neither are ``last``/``best``.

    Args:
        save_dir: the checkpoint directory.
        name_prefix: the ``name_prefix`` the files were written with.
        kind: ``"epoch"`` or ``"step"`` to list one kind only (``None``: epoch files, then step
            files).

    >>> import tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> for name in ("checkpoint-epoch-0010.pth.tar", "checkpoint-epoch-0002.pth.tar",
    ...              ".checkpoint-epoch-0011.pth.tar.1a2b3c4d.tmp"):
    ...     open(os.path.join(tmp.name, name), "wb").close()
    >>> [os.path.basename(p) for p in list_checkpoints(tmp.name)]
    ['checkpoint-epoch-0002.pth.tar', 'checkpoint-epoch-0010.pth.tar']
    >>> tmp.cleanup()
    """
    return [path for k, _, path in scan_checkpoints(save_dir, name_prefix) if kind is None or k == kind]


def _candidates(save_dir: str, name_prefix: str) -> list[str]:
    """``last`` and every periodic file, newest first (by modification time, ``last`` first on ties)."""
    last = os.path.join(save_dir, f"{name_prefix}checkpoint-last.pth.tar")
    paths = [p for _, _, p in scan_checkpoints(save_dir, name_prefix)]
    if os.path.isfile(last):
        paths.insert(0, last)

    def newest_first(item: tuple[int, str]) -> tuple[float, int]:
        index, path = item
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            mtime = 0
        return (-mtime, 0 if path == last else index + 1)

    return [p for _, p in sorted(enumerate(paths), key=newest_first)]


def latest_valid_checkpoint(save_dir: PathLike, name_prefix: str = "") -> tuple[str, Any] | None:
    """The newest checkpoint in ``save_dir`` that loads and verifies, and its content.

    Candidates are ``{name_prefix}checkpoint-last.pth.tar`` and the periodic files, newest first.
    Each is loaded with :func:`~hat_ignite.checkpoint.loading.load_checkpoint` (weights-only, hash verified);
    a corrupt one is skipped with a warning naming it and the reason, and the previous one is
    tried.

    Returns:
        ``(absolute path, loaded checkpoint)``, or ``None`` when the directory holds no
        checkpoint at all (a fresh run).

    Raises:
        CheckpointError: there are checkpoint files but none is valid; lists each with its reason.

    >>> import tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> latest_valid_checkpoint(tmp.name) is None
    True
    >>> tmp.cleanup()
    """
    save_dir = os.path.abspath(os.fspath(save_dir))
    failures = []
    tried: set[tuple[int, int]] = set()
    for path in _candidates(save_dir, name_prefix):
        try:
            stat = os.stat(path)
        except OSError:
            continue
        if (stat.st_dev, stat.st_ino) in tried:  # "last" is a hard link to a periodic file
            continue
        tried.add((stat.st_dev, stat.st_ino))
        try:
            checkpoint = load_checkpoint(path)
        except CheckpointError as exc:
            failures.append(str(exc))
            logger.warning("Skipping corrupt checkpoint %s and trying the previous one: %s", path, exc)
            continue
        if failures:
            logger.warning("Resuming from %s, the newest valid checkpoint (%d newer file(s) skipped).",
                           path, len(failures))
        return path, checkpoint
    if failures:
        raise CheckpointError(
            f"No valid checkpoint in {save_dir}: all {len(failures)} are corrupt:\n  "
            + "\n  ".join(failures) + "\nStart without resuming, or restore a checkpoint from a backup."
        )
    return None


# -- what rotation must keep ------------------------------------------------------------------
#: A periodic checkpoint name's number and short content hash.
NAME_HASH = re.compile(r"-(\d+)-([0-9a-f]{8})\.pth\.tar$")
#: A periodic checkpoint name's number, with or without a hash.
NAME_NUMBER = re.compile(r"-(\d+)(?:-[0-9a-f]{8})?\.pth\.tar$")


def checkpoint_number(name: str) -> int | None:
    """The epoch/step number in a periodic checkpoint's file name.

    >>> checkpoint_number("float-checkpoint-epoch-0003-1a2b3c4d.pth.tar"), checkpoint_number("checkpoint-step-12.pth.tar")
    (3, 12)
    """
    match = NAME_NUMBER.search(name)
    return int(match.group(1)) if match else None


def weights_finite(weights: Any) -> bool:
    """Whether every floating-point tensor of a state dict is free of NaN/Inf."""
    if not isinstance(weights, Mapping):
        return True
    return all(
        bool(torch.isfinite(t).all()) for t in weights.values()
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())
    )


def resume_marks(checkpoint: Any) -> tuple[set[str], set[tuple[str, int]]]:
    """What identifies the file a run resumed from: its short content hash, and (for names
    without a hash) its epoch/step number."""
    if not isinstance(checkpoint, Mapping):
        return set(), set()
    recorded = checkpoint.get(HASH_KEY)
    hashes = {recorded[:8]} if isinstance(recorded, str) else set()
    numbers = {(kind, checkpoint[kind]) for kind in ("epoch", "step") if isinstance(checkpoint.get(kind), int)}
    return hashes, numbers
