"""``hat-curves WORK_DIR [--out PNG]``: redraw a run's training curves.

Reads the TensorBoard event files under ``WORK_DIR`` (the ones the ``TensorBoard`` callback
wrote; the most recently written directory when there are several) and draws the loss,
learning rate and metrics into ``WORK_DIR/training_curves.png``, the same picture ``hat-train``
leaves at the end of a run. See :mod:`hat_ignite.visualize.curves` for the panels.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from typing import Any, Sequence

from hat_ignite.cli.common import CliError, run_main, setup_logging

__all__ = ["main", "write_run_curves"]

logger = logging.getLogger("hat_ignite.cli.curves")

#: A write that failed for want of space or permission: the run reports it as an error.
_WRITE_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EDQUOT, errno.EPERM)

DESCRIPTION = """Draw a run's training curves (loss, learning rate, metrics) into a PNG.

WORK_DIR is the work dir of a run (or a TensorBoard save_dir, or one event file); the run must
have had a TensorBoard callback. The PNG goes to WORK_DIR/training_curves.png unless --out is given."""


def write_run_curves(trainer: Any, work_dir: str) -> str | None:
    """Draw ``<work_dir>/training_curves.png`` from the event files of ``trainer``'s TensorBoard callback.

    Called by ``hat-train`` when a run ends (rank 0). A trainer without a ``TensorBoard``
    callback has nothing to draw; a failure to draw (no event file, no matplotlib) is logged as
    a warning. A failure to write the PNG (a full or read-only disk) is an error naming the file;
    the PNG is drawn into a temporary file and renamed, so it is never left half written.

    Raises:
        CliError: the PNG cannot be written.

    Returns:
        The PNG's path, or ``None`` when nothing was drawn.
    """
    import ignite.distributed as idist

    from hat_ignite.callbacks.tensorboard import TensorBoard

    if idist.get_rank() != 0:
        return None
    boards = [cb for cb in getattr(trainer, "callbacks", []) if isinstance(cb, TensorBoard)]
    if not boards:
        logger.info("no TensorBoard callback in the trainer, so no training_curves.png")
        return None
    from hat_ignite.visualize.curves import CURVES_FILE, draw_training_curves

    path = os.path.join(work_dir, CURVES_FILE)
    tmp = os.path.join(work_dir, f".tmp{os.getpid()}.{CURVES_FILE}")  # written whole, then renamed
    try:
        curves = draw_training_curves(boards[0].save_dir, tmp)
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
    parser.add_argument("--out", help="PNG to write (default: WORK_DIR/training_curves.png)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug log lines")
    args = parser.parse_args(argv)
    setup_logging(args.debug)
    from hat_ignite.visualize.curves import draw_training_curves

    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        raise CliError(f"--out {args.out}: the directory {os.path.dirname(os.path.abspath(args.out))} does not exist.")
    try:
        curves = draw_training_curves(args.work_dir, args.out)
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
