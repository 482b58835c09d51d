"""``hat-curves WORK_DIR [--stage STAGE] [--out PNG]``: redraw a run's training curves.

Reads the TensorBoard event files under ``WORK_DIR`` (the ones the ``TensorBoard`` callback
wrote; the most recently written directory when there are several) and draws the loss,
learning rate and metrics into ``WORK_DIR/training_curves.png`` (when the files are of several
``hat-train`` stages, those of the latest stage, into ``WORK_DIR/STAGE_training_curves.png``).
With ``--stage``, only the
files that ``hat-train`` stage wrote are read, into ``WORK_DIR/STAGE_training_curves.png``: the
picture ``hat-train`` leaves at the end of each stage, which stays that stage's own when several
stages write into one TensorBoard directory. See :mod:`hat_ignite.visualize.curves` for the panels.
Drawing needs matplotlib, which ``pip install 'hat-ignite[curves]'`` installs.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from typing import Any, Sequence

from hat_ignite.cli.common import CliError, run_main, setup_logging

__all__ = ["main", "label_stage", "write_run_curves"]

logger = logging.getLogger("hat_ignite.cli.curves")

#: A write that failed for want of space or permission: the run reports it as an error.
_WRITE_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EDQUOT, errno.EPERM)

DESCRIPTION = """Draw a run's training curves (loss, learning rate, metrics) into a PNG.

WORK_DIR is the work dir of a run (or a TensorBoard save_dir, or one event file); the run must
have had a TensorBoard callback. The PNG goes to WORK_DIR/training_curves.png (with --stage,
WORK_DIR/STAGE_training_curves.png) unless --out is given. Needs matplotlib:
pip install 'hat-ignite[curves]'."""


def _boards(trainer: Any) -> list[Any]:
    from hat_ignite.callbacks.tensorboard import TensorBoard

    return [cb for cb in getattr(trainer, "callbacks", []) if isinstance(cb, TensorBoard)]


def label_stage(trainer: Any, stage: str) -> None:
    """Tell ``trainer``'s ``TensorBoard`` callbacks the stage they write for.

    Their event files then carry the stage in their names, so stages sharing a TensorBoard
    directory (HAT's ``ckpt_dir/tensorboard``) keep their own histories and curves (see
    :func:`hat_ignite.visualize.event_file.stage_suffix`).
    """
    for board in _boards(trainer):
        board.stage = stage


def write_run_curves(trainer: Any, work_dir: str, stage: str | None = None) -> str | None:
    """Draw ``<work_dir>/<stage>_training_curves.png`` from the event files of ``trainer``'s
    TensorBoard callback (those of ``stage``; ``training_curves.png`` and all files without one).

    Called by ``hat-train`` when a run ends (rank 0). A trainer without a ``TensorBoard``
    callback has nothing to draw. Without matplotlib (an optional dependency: the ``curves``
    extra) one log line says so and names the extra; the event files hold the same values. A
    failure to draw (no event file, corrupt data) is logged as a warning. A failure to write the PNG (a full or read-only disk) is an error naming the file;
    the PNG is drawn into a temporary file and renamed, so it is never left half written.

    Raises:
        CliError: the PNG cannot be written.

    Returns:
        The PNG's path, or ``None`` when nothing was drawn.
    """
    import ignite.distributed as idist

    from hat_ignite.errors import MissingExtraError
    from hat_ignite.visualize.curves import curves_file, draw_training_curves, require_matplotlib

    if idist.get_rank() != 0:
        return None
    name = curves_file(stage)
    boards = _boards(trainer)
    if not boards:
        logger.info("no TensorBoard callback in the trainer, so no %s", name)
        return None
    try:
        require_matplotlib()
    except MissingExtraError as exc:
        logger.info("no %s: %s is not installed (pip install 'hat-ignite[%s]'); the TensorBoard event files in "
                    "%s hold the same values", name, exc.package, exc.extra, boards[0].save_dir)
        return None
    path = os.path.join(work_dir, name)
    tmp = os.path.join(work_dir, f".tmp{os.getpid()}.{name}")  # written whole, then renamed
    title = f"{os.path.basename(os.path.abspath(work_dir))}: {stage}" if stage else None
    try:
        curves = draw_training_curves(boards[0].save_dir, tmp, title=title, stage=stage)
        os.replace(tmp, path)
    except OSError as exc:
        _remove(tmp)
        if exc.errno in _WRITE_ERRNOS:
            raise CliError(f"cannot write the training curves {path}: {exc.strerror or exc}. Check the free "
                           f"space and permissions of {work_dir}.") from exc
        logger.warning("could not draw the training curves %s: %s", path, exc)
        return None
    except (ValueError, ImportError) as exc:
        _remove(tmp)
        logger.warning("could not draw the training curves %s: %s", path, exc)
        return None
    logger.info("training curves: %s (%d panels)", path, len(curves.panels))
    return path


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _curves(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="hat-curves", description=DESCRIPTION)
    parser.add_argument("work_dir", metavar="WORK_DIR", help="work dir of a run, a TensorBoard save_dir, or an event file")
    parser.add_argument("--out", help="PNG to write (default: WORK_DIR/training_curves.png, or "
                                      "WORK_DIR/STAGE_training_curves.png with --stage)")
    parser.add_argument("--stage", "-s", help="draw only the event files this hat-train stage wrote (stages may "
                                              "share a TensorBoard directory); default: all, or the latest stage's "
                                              "when the files are of several stages")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug log lines")
    args = parser.parse_args(argv)
    setup_logging(args.debug)
    from hat_ignite.visualize.curves import draw_training_curves

    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        raise CliError(f"--out {args.out}: the directory {os.path.dirname(os.path.abspath(args.out))} does not exist.")
    try:
        curves = draw_training_curves(args.work_dir, args.out, stage=args.stage)
    except (FileNotFoundError, ValueError) as exc:
        raise CliError(str(exc)) from exc
    titles = ", ".join(panel.title for panel in curves.panels)
    print(f"{curves.path} ({titles}; from {curves.source})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``hat-curves``; returns the process exit code.

    Args:
        argv: the arguments after the program name (default: ``sys.argv[1:]``).
    """
    return run_main("hat-curves", _curves, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
