"""A run's TensorBoard directory when the run begins: old files removed, or kept with a purge marker.

:class:`~hat_ignite.callbacks.tensorboard.TensorBoard` keeps the event files of the run it
continues and writes a purge marker right after the checkpoint's step, so TensorBoard and
:func:`~hat_ignite.visualize.event_file.read_scalars` drop what the interrupted run wrote after
its checkpoint; a fresh run with ``overwrite`` removes them (:func:`prepare_save_dir`).
"""

from __future__ import annotations

import glob
import logging
import os
from typing import Any

from hat_ignite.callbacks.tensorboard_scalars import StepScalars
from hat_ignite.visualize.event_file import EVENT_FILE_GLOB, event_files, stage_suffix

__all__ = ["prepare_save_dir", "resume_step_of", "write_purge_marker"]

logger = logging.getLogger("hat_ignite.callbacks.tensorboard")


def resume_step_of(loop: Any) -> int | None:
    """The global step a loop that continues a run starts at (``None`` for a fresh run).

    A loop whose state starts past step 0 at loop begin (``hat-train --resume``, ``start_step``)
    continues an earlier run.
    """
    state = getattr(loop, "state", None)
    iteration = int(getattr(state, "iteration", 0) or 0)
    return iteration if iteration > 0 else None


def write_purge_marker(save_dir: str, step: int, stage: str | None = None) -> str:
    """Write an event file holding only a purge marker at ``step`` into ``save_dir``.

    The marker (a ``SessionLog.START`` event, what tensorboardX's ``purge_step`` writes) tells
    TensorBoard, and :func:`~hat_ignite.visualize.event_file.read_scalars`, to drop the points
    at ``step`` and later that the event files before it hold. It has a file of its own, closed
    before the run's files open (so it is on disk before any new point), named to sort after
    the files already there and before the ones the run makes. With ``stage``, the marker is one of
    that stage's files (see :func:`~hat_ignite.visualize.event_file.stage_suffix`): it drops that
    stage's points only, when its files are read apart from the other stages'.

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
    before = set(glob.glob(os.path.join(glob.escape(save_dir), EVENT_FILE_GLOB)))
    StepScalars(save_dir, filename_suffix=".purge" + stage_suffix(stage), purge_step=int(step)).close()
    made = sorted(set(glob.glob(os.path.join(glob.escape(save_dir), EVENT_FILE_GLOB))) - before)
    return made[-1] if made else save_dir


def prepare_save_dir(save_dir: str, overwrite: bool, resume_step: int | None, stage: str | None = None) -> None:
    """Make ``save_dir``; keep its event files with a purge marker (a resumed run) or remove them.

    A resumed run (``resume_step``, the steps its checkpoint holds) never removes them: it writes
    a purge marker right after ``resume_step`` (see :func:`write_purge_marker`), so the points
    the interrupted run wrote after its checkpoint are dropped by TensorBoard and ``hat-curves``
    and replaced by the points the resumed run writes (a point at ``resume_step`` itself is
    replaced when the resumed run writes that step). A fresh run with ``overwrite`` removes the
    event files (only those); without it the run's files are added beside them.

    With ``stage`` (a ``hat-train`` stage, see
    :func:`~hat_ignite.visualize.event_file.stage_suffix`) all of this concerns that stage's files
    only: stages sharing ``save_dir`` never remove nor purge each other's history.
    """
    os.makedirs(save_dir, exist_ok=True)
    old_files = event_files(save_dir, stage)
    if resume_step is not None:
        if old_files:
            # the epoch-end records of the checkpoint's last epoch carry step resume_step (the
            # steps done); later points are the killed run's, after the checkpoint
            write_purge_marker(save_dir, resume_step + 1, stage)
            logger.info("TensorBoard: resuming at global step %d; the history in %s before it is kept.",
                        resume_step, save_dir)
    elif overwrite:
        for old in old_files:
            os.remove(old)
        if old_files:
            logger.info("TensorBoard(overwrite=True): removed %d event file(s) of an earlier run from %s.",
                        len(old_files), save_dir)
