"""A resumed run's TensorBoard history: where it resumes, and the purge marker it writes there.

:class:`~hat_ignite.callbacks.tensorboard.TensorBoard` keeps the event files of the run it
continues and writes a purge marker right after the checkpoint's step, so TensorBoard and
:func:`~hat_ignite.visualize.event_file.read_scalars` drop what the interrupted run wrote after
its checkpoint.
"""

from __future__ import annotations

import glob
import os
import time
from typing import Any

from hat_ignite.visualize.event_file import EVENT_FILE_GLOB

__all__ = ["resume_step_of", "write_purge_marker"]


def resume_step_of(loop: Any) -> int | None:
    """The global step a loop that continues a run starts at (``None`` for a fresh run).

    A loop whose state starts past step 0 at loop begin (``hat-train --resume``, ``start_step``)
    continues an earlier run.
    """
    state = getattr(loop, "state", None)
    iteration = int(getattr(state, "iteration", 0) or 0)
    return iteration if iteration > 0 else None


def write_purge_marker(save_dir: str, step: int) -> str:
    """Write an event file holding only a purge marker at ``step`` into ``save_dir``.

    The marker (a ``SessionLog.START`` event, what tensorboardX's ``purge_step`` writes) tells
    TensorBoard, and :func:`~hat_ignite.visualize.event_file.read_scalars`, to drop the points
    at ``step`` and later that the event files before it hold. It has a file of its own, closed
    before the run's writer opens, so it is on disk before any new point and the run's writer
    keeps its fast path.

    Returns:
        The marker file's path.

    >>> import tempfile
    >>> from hat_ignite.visualize.event_file import event_files, read_scalars
    >>> from tensorboardX import SummaryWriter
    >>> tmp = tempfile.mkdtemp()
    >>> with SummaryWriter(tmp, filename_suffix=".0") as w:
    ...     for step in range(5):
    ...         w.add_scalar("loss", float(step), step)
    >>> _ = write_purge_marker(tmp, 3)
    >>> read_scalars(tmp)["loss"]
    [(0, 0.0), (1, 1.0), (2, 2.0)]
    """
    from tensorboardX import SummaryWriter

    before = set(glob.glob(os.path.join(glob.escape(save_dir), EVENT_FILE_GLOB)))
    marker = SummaryWriter(logdir=save_dir, purge_step=int(step), filename_suffix=f".{time.time_ns()}.purge")
    marker.close()
    made = sorted(set(glob.glob(os.path.join(glob.escape(save_dir), EVENT_FILE_GLOB))) - before)
    return made[-1] if made else save_dir
