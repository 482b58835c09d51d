"""Making ``last`` and ``best`` agree with the checkpoint a run resumes from.

A save point writes the periodic file, then ``last``, then ``best``; the state inside the
periodic file already records the new best value and the step it was reached at. A process
killed between these writes leaves ``last`` or ``best`` behind that state. When a run resumes,
:func:`reconcile` compares what the resumed checkpoint records with what the two files hold
(read from the files' headers, no tensor data is loaded) and rewrites the one that is behind,
so no kill leaves a stale ``best`` for good.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, Callable

import torch

from hat_ignite.checkpoint.atomic import atomic_link, atomic_save
from hat_ignite.checkpoint.files import NAME_HASH, scan_checkpoints
from hat_ignite.checkpoint.hashing import HASH_KEY
from hat_ignite.regular_files import is_regular_file

__all__ = ["saved_identity", "checkpoint_file", "reconcile"]

logger = logging.getLogger(__name__)


def saved_identity(path: str) -> tuple[str | None, int | None]:
    """``(content hash, steps done)`` recorded in the checkpoint file ``path``.

    The file is opened memory-mapped, so its tensors are not read. ``(None, None)`` when the
    file is missing or unreadable.

    >>> saved_identity("no/such/file.pth.tar")
    (None, None)
    """
    if not is_regular_file(path):  # a FIFO would block torch.load forever
        return None, None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - missing, truncated or foreign: "holds nothing we know"
        return None, None
    if not isinstance(saved, Mapping):
        return None, None
    progress = saved.get("progress")
    iteration = progress.get("iteration") if isinstance(progress, Mapping) else None
    recorded = saved.get(HASH_KEY)
    return (recorded if isinstance(recorded, str) else None), (int(iteration) if iteration is not None else None)


def checkpoint_file(save_dir: str, name_prefix: str, last_path: str, checkpoint: Mapping[str, Any]) -> str | None:
    """The file in ``save_dir`` that holds ``checkpoint`` (a periodic file by the hash in its
    name, else ``last`` when it holds it), or ``None``."""
    recorded = checkpoint.get(HASH_KEY)
    if not isinstance(recorded, str):
        return None
    for _kind, _number, path in reversed(scan_checkpoints(save_dir, name_prefix)):
        match = NAME_HASH.search(os.path.basename(path))
        if match and recorded.startswith(match.group(2)) and saved_identity(path)[0] == recorded:
            return path
    return last_path if saved_identity(last_path)[0] == recorded else None


def _file_at(save_dir: str, name_prefix: str, iteration: int) -> str | None:
    """A periodic file of ``save_dir`` holding the state after ``iteration`` steps, or ``None``."""
    for _kind, _number, path in reversed(scan_checkpoints(save_dir, name_prefix)):
        if saved_identity(path)[1] == iteration:
            return path
    return None


def reconcile(
    save_dir: str,
    name_prefix: str,
    last_path: str,
    best_path: str | None,
    checkpoint: Mapping[str, Any],
    best_iteration: int | None,
    write_best: Callable[[Mapping[str, Any], str | None], None],
) -> list[str]:
    """Bring ``last`` (and ``best``) up to the checkpoint a run resumes from.

    Args:
        save_dir: the checkpoint directory.
        name_prefix: the files' prefix.
        last_path: the ``last`` file.
        best_path: the ``best`` file (``None``: no best is kept).
        checkpoint: the loaded checkpoint the run resumes from.
        best_iteration: the steps done at the save point that reached the best value, as the
            checkpoint records it (``None``: none recorded).
        write_best: ``write_best(payload, path_of_payload_or_None)`` writes ``best`` the way a
            save point does (a link to the file, or the EMA weights).

    Returns:
        The files rewritten (for the log and the tests).
    """
    progress = checkpoint.get("progress")
    if not isinstance(progress, Mapping) or progress.get("iteration") is None:
        return []
    iteration = int(progress["iteration"])
    source = checkpoint_file(save_dir, name_prefix, last_path, checkpoint)
    fixed: list[str] = []
    if saved_identity(last_path)[0] != checkpoint.get(HASH_KEY):
        if source is not None:
            atomic_link(source, last_path)
        else:
            atomic_save(dict(checkpoint), last_path)
        fixed.append(last_path)
        logger.warning("Checkpoint: %s did not hold the checkpoint this run resumes from (the run that wrote it "
                       "was stopped between two writes); it does now.", last_path)
    if best_path is None or best_iteration is None or saved_identity(best_path)[1] == best_iteration:
        return fixed
    if best_iteration == iteration:
        write_best(checkpoint, source)
    else:
        found = _file_at(save_dir, name_prefix, best_iteration)
        if found is None:
            logger.warning(
                "Checkpoint: %s does not hold the best checkpoint this run recorded (after %d steps), and no "
                "checkpoint file of that step is left in %s; it is replaced at the next new best.",
                best_path, best_iteration, save_dir,
            )
            return fixed
        from hat_ignite.checkpoint.loading import load_checkpoint

        write_best(load_checkpoint(found), found)
    fixed.append(best_path)
    logger.warning("Checkpoint: %s was behind the best value the checkpoint records (the run that wrote it was "
                   "stopped before writing it); it now holds the checkpoint of step %d.", best_path, best_iteration)
    return fixed
