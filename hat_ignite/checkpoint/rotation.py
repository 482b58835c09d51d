"""Checkpoint rotation: which periodic files a new save point supersedes, and their removal."""

from __future__ import annotations

import logging
import os
from typing import Callable

from hat_ignite.checkpoint.files import scan_checkpoints

__all__ = ["rotate"]

logger = logging.getLogger("hat_ignite.callbacks.checkpoint")  # the lines read as Checkpoint's own


def rotate(save_dir: str, name_prefix: str, kind: str, number: int, keep: str, keep_n: int | None,
           keep_reason: Callable[[str, str], str | None]) -> None:
    """Delete the files the save point ``(kind, number)``, written to ``keep``, supersedes.

    Those are the files of the same number with another content hash and, with ``keep_n``, the
    oldest files of that kind up to this one (newer files of an abandoned run stay). A file
    ``keep_reason(kind, path)`` gives a reason for is kept, and the reason logged.
    """
    entries = [(n, p) for k, n, p in scan_checkpoints(save_dir, name_prefix) if k == kind and n <= number]
    doomed = [p for n, p in entries if n == number and p != keep]
    same = len(doomed)
    if keep_n is not None:
        older = sorted({n for n, _ in entries if n < number})
        dropped = set(older[: max(len(older) - (keep_n - 1), 0)])
        doomed += [p for n, p in entries if n in dropped]
    for p in doomed:
        reason = keep_reason(kind, p)
        if reason:
            logger.info("Rotation keeps %s: %s.", p, reason)
            continue
        try:
            os.remove(p)
        except OSError as exc:
            logger.warning("Could not remove old checkpoint %s: %s", p, exc)
        else:
            why = f"keep_n={keep_n}" if p not in doomed[:same] else "superseded by the file of the same number"
            logger.info("Removed old checkpoint %s (%s).", p, why)
