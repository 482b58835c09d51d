"""``hat-train --resume [PATH|auto]`` and the SIGTERM/SIGINT handlers of ``hat-train``.

Resuming: ``auto`` takes the newest checkpoint of the trainer's ``Checkpoint`` callback that
loads and verifies (a corrupt newer file is skipped with a warning naming it); a path takes that
file. The trainer restores it when ``fit()`` starts and logs what was and was not restored.
``--resume`` turns ``resume_optimizer`` and ``resume_epoch_or_step`` on unless the stage's config
sets them. A run that is already finished (its checkpoint is at the end of the schedule the config
asks for, and ``metrics.json`` records that end) is left alone: ``hat-train`` says so, changes no
file and exits 0 (see :func:`finished_run`).

Signals: the handler only asks the trainer to stop (``request_stop``); a trainer waiting for a
batch stops waiting at once (``interrupt_data_wait``). The trainer finishes the running step, the ``Checkpoint`` callback writes a resumable checkpoint (a step file, and
``last`` pointing at it), and ``hat-train`` exits with 128 + the signal number (143 for SIGTERM,
130 for SIGINT) after printing the command that resumes. A second signal exits at once.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import sys
import threading
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Sequence

from hat_ignite.regular_files import open_regular

__all__ = [
    "add_resume_argument", "apply_resume", "checkpoint_dirs", "find_resume", "finished_run", "install_stop_signals",
    "resume_command", "saved_at", "stop_report",
]

logger = logging.getLogger("hat_ignite.cli.train")

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def add_resume_argument(parser: Any) -> None:
    """Add ``--resume [PATH|auto]`` (``--resume`` alone means ``auto``)."""
    parser.add_argument(
        "--resume", nargs="?", const="auto", default=None, metavar="PATH|auto",
        help="continue a run: 'auto' (the default when no value is given) takes the newest valid "
             "checkpoint in the Checkpoint callback's save_dir, or give a checkpoint file",
    )


def checkpoint_dirs(trainer: Any, work_path: str) -> list[tuple[str, str]]:
    """``(save_dir, name_prefix)`` of the trainer's checkpoint writers (else work_dir/checkpoints)."""
    dirs = [
        (os.path.abspath(cb.save_dir), getattr(cb, "name_prefix", "") or "")
        for cb in getattr(trainer, "callbacks", [])
        if callable(getattr(cb, "save_resume_point", None)) and isinstance(getattr(cb, "save_dir", None), str)
    ]
    return dirs or [(os.path.join(work_path, "checkpoints"), "")]


def previous_run_note(trainer: Any, work_path: str, stage: str, argv: Sequence[str]) -> str | None:
    """What a fresh run (no ``--resume``) is about to replace in ``work_path``, or ``None`` when nothing.

    An earlier run of ``stage`` left its log (``{stage}_train.log``), its ``metrics.json`` entry
    (``{stage}_train``) or checkpoints of the trainer's ``Checkpoint`` callbacks there; a fresh run
    writes the same checkpoint names, the same entry and curves again, and a
    ``TensorBoard(overwrite=True)`` removes the stage's event files. The note says so, and how to
    continue that run (``--resume``) or keep it (another ``--work-dir``).
    """
    found: list[str] = []
    log = os.path.join(work_path, f"{stage}_train.log")
    if os.path.isfile(log):
        found.append(os.path.basename(log))
    try:
        with open_regular(os.path.join(work_path, "metrics.json")) as f:
            if f"{stage}_train" in json.load(f):
                found.append(f"metrics.json ({stage}_train)")
    except (OSError, ValueError, TypeError):
        pass
    checkpoints = 0
    for save_dir, prefix in checkpoint_dirs(trainer, work_path):
        if prefix and os.path.isdir(save_dir):  # without a prefix, other stages' files may be there too
            checkpoints += sum(1 for name in os.listdir(save_dir) if name.startswith(prefix) and ".pth" in name)
    if checkpoints:
        found.append(f"{checkpoints} checkpoint file(s)")
    if not found:
        return None
    overwrites = [
        os.path.abspath(cb.save_dir) for cb in getattr(trainer, "callbacks", [])
        if type(cb).__name__ == "TensorBoard" and getattr(cb, "overwrite", False) is True
        and isinstance(getattr(cb, "save_dir", None), str)
    ]
    history = f", TensorBoard(overwrite=True) removes its event files in {', '.join(overwrites)}" if overwrites else ""
    return (
        f"{work_path} holds an earlier {stage} run ({', '.join(found)}). This run starts afresh: it "
        f"replaces that run's checkpoints, metrics.json entry and curves{history}, and appends to its "
        f"log. To continue that run instead: {resume_command(argv)}; to keep it, give another --work-dir."
    )


class _Resume:
    """Restores a loaded checkpoint into the loop when ``fit()`` starts (``loop.schedule_resume``)."""

    def __init__(self, path: str, checkpoint: Mapping[str, Any]) -> None:
        self.path = path
        self.checkpoint = checkpoint

    def resume(self, loop: Any) -> dict[str, list[str]]:
        from hat_ignite.checkpoint.restore import restore_training_state

        return restore_training_state(loop, self.checkpoint, self.path)


def find_resume(trainer: Any, resume: str, work_path: str) -> tuple[str, Mapping[str, Any]] | None:
    """The checkpoint ``--resume`` names, loaded and verified: ``(path, checkpoint)``.

    Returns:
        ``None`` when ``auto`` found no checkpoint (a fresh start).

    Raises:
        CheckpointError: the named file, or every candidate of ``auto``, is unreadable or corrupt.
    """
    from hat_ignite.checkpoint.files import latest_valid_checkpoint
    from hat_ignite.checkpoint.loading import load_checkpoint

    if resume != "auto":
        path = os.path.abspath(resume)
        return path, load_checkpoint(path)
    for save_dir, prefix in checkpoint_dirs(trainer, work_path):
        found = latest_valid_checkpoint(save_dir, prefix)
        if found is not None:
            return found
    return None


def finished_run(trainer: Any, checkpoint: Mapping[str, Any], stage_cfg: Mapping[str, Any], work_path: str,
                 stage: str) -> str | None:
    """Why resuming from ``checkpoint`` has nothing left to do, or ``None`` when it has.

    A run is finished when the checkpoint continues its progress (``resume_epoch_or_step`` is not
    turned off in the config), was taken exactly at the end of the schedule the trainer has now
    (``num_epochs`` epochs of the data loader, with the steps per epoch it was written with, or
    ``num_steps`` steps) with every epoch-end hook run, and ``metrics.json`` in the work dir
    records that end for the stage (written after the last step, not after a stop on a signal).
    A longer schedule given on the command line (``--opts float_trainer.num_epochs=30``) is not
    finished and resumes as usual; a shorter one, or another batch size, is refused by the resume
    (:mod:`hat_ignite.checkpoint.progress`).
    """
    if stage_cfg.get("resume_epoch_or_step", True) is False:
        return None
    progress, data = checkpoint.get("progress"), checkpoint.get("data")
    if not isinstance(progress, Mapping) or progress.get("iteration") is None:
        return None
    iteration = int(progress["iteration"])
    if isinstance(data, Mapping) and data.get("epoch_open"):
        return None  # the last epoch's end hooks have not run
    if getattr(trainer, "stop_by", "epoch") == "epoch":
        try:
            length = len(trainer.data_loader)
        except TypeError:
            return None
        saved_length = progress.get("epoch_length")
        if saved_length and int(saved_length) != length:
            return None  # another batch size: the resume refuses it, naming both
        total = int(trainer.num_epochs or 0) * length
        schedule = f"{trainer.num_epochs} epochs of {length} steps"
    else:
        total = int(trainer.num_steps or 0)
        schedule = f"{total} steps"
    if iteration != total:
        return None  # not at the end; past it, the resume refuses (the config asks for a shorter run)
    path = os.path.join(work_path, "metrics.json")
    try:
        with open_regular(path) as f:
            record = json.load(f).get(f"{stage}_train")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(record, Mapping) or record.get("steps") != iteration or record.get("stopped_by_signal"):
        return None
    return f"all {schedule} are done and {path} records its end"


def apply_resume(trainer: Any, resume: str, stage_cfg: Mapping[str, Any], work_path: str,
                 found: tuple[str, Mapping[str, Any]] | None = None) -> str | None:
    """Find the checkpoint ``--resume`` names and schedule its restoring into ``trainer``.

    Args:
        trainer: the built trainer.
        resume: ``"auto"`` or a checkpoint path.
        stage_cfg: the stage's config node (its explicit ``resume_*`` keys are kept).
        work_path: the run's work dir (searched when the trainer has no Checkpoint callback).
        found: what :func:`find_resume` returned already (``None``: it is called here).

    Returns:
        The checkpoint path, or ``None`` when ``auto`` found no checkpoint (a fresh start).

    Raises:
        CheckpointError: the named file, or every candidate of ``auto``, is unreadable or corrupt.
    """
    if found is None:
        found = find_resume(trainer, resume, work_path)
    if found is None:
        where = ", ".join(d for d, _ in checkpoint_dirs(trainer, work_path))
        logger.info("--resume auto: no checkpoint in %s; starting from the beginning.", where)
        return None
    path, checkpoint = found
    for flag in ("resume_optimizer", "resume_epoch_or_step"):
        if flag in stage_cfg:
            logger.info("--resume: keeping %s=%s from the config.", flag, stage_cfg[flag])
        else:
            setattr(trainer, flag, True)
    trainer.schedule_resume(_Resume(path, checkpoint))
    logger.info("Resuming from %s (%s).", path, saved_at(checkpoint))
    return path


def saved_at(checkpoint: Mapping[str, Any]) -> str:
    """Where a checkpoint was saved, in the 0-based global step ids the log uses.

    The ``step`` entry is the ``global_step_id`` the saving hook received, which at an epoch end
    (and at the end of training) already counts the epoch's last step; ``progress.iteration``
    is the number of steps done.

    >>> saved_at({"step": 69, "progress": {"iteration": 69}})
    'saved after global step 68, 69 steps done'
    >>> saved_at({"step": 5})
    'saved at global step 5'
    """
    progress = checkpoint.get("progress")
    if isinstance(progress, Mapping) and isinstance(progress.get("iteration"), int):
        done = int(progress["iteration"])
        if done == 0:
            return "saved before the first step"
        return f"saved after global step {done - 1}, {done} steps done"
    return f"saved at global step {checkpoint.get('step')}"


def resume_command(argv: Sequence[str]) -> str:
    """The ``hat-train`` command line that resumes the run started with ``argv``.

    >>> resume_command(["cfg.py", "--opts", "a=1", "--resume", "x.pth.tar", "--work-dir", "w d"])
    "hat-train cfg.py --opts a=1 --work-dir 'w d' --resume auto"
    """
    kept: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--resume":
            i += 2 if i + 1 < len(args) and not args[i + 1].startswith("-") else 1
            continue
        if arg.startswith("--resume="):
            i += 1
            continue
        kept.append(arg)
        i += 1
    return " ".join(["hat-train", *map(shlex.quote, kept), "--resume", "auto"])


def install_stop_signals(trainer: Any) -> tuple[list[int], Callable[[], None]]:
    """Make SIGTERM and SIGINT stop ``trainer`` at the next step boundary; a second one exits.

    Returns:
        The list the received signal numbers are appended to, and a function restoring the
        previous handlers. Outside the main thread nothing is installed.
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        return received, lambda: None
    # Weakly: after a stop the handler stays until the process ends, and a trainer it held would
    # keep a DDP model, and with it the process group and its threads, alive into the
    # interpreter's shutdown (see hat_ignite.engine.launcher._release_run_objects).
    trainer_ref = weakref.ref(trainer)

    def on_signal(signum: int, _frame: Any) -> None:
        live = trainer_ref()
        if received or live is None:  # the second signal (or one after the run): no more waiting
            saved = [p for p in getattr(live, "resume_points", None) or [] if p]
            done = (f"the resumable checkpoint {saved[-1]} was already written" if saved
                    else "after the run ended" if live is None else "without saving")
            os.write(2, f"hat-train: {'second ' if received else ''}{signal.Signals(signum).name}: "
                        f"exiting now {done}\n".encode())
            _end_worker_processes()
            os._exit(128 + signum)
        received.append(signum)
        live.request_stop(f"received {signal.Signals(signum).name}", code=signum)
        # a loop waiting for a batch (a slow or stuck data loader) stops now: this raises inside
        # that wait, and the loop writes the checkpoint of its last finished step
        interrupt = getattr(live, "interrupt_data_wait", None)
        if interrupt is not None:
            interrupt()

    previous = {sig: signal.signal(sig, on_signal) for sig in _SIGNALS}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return received, restore


def _end_worker_processes() -> None:
    """Terminate this process's daemonic children (data-loader workers) before ``os._exit``.

    ``os._exit`` skips the exit hook that ends them; a worker stuck in a dataset would otherwise
    outlive the run.
    """
    import multiprocessing

    for child in multiprocessing.active_children():
        if child.daemon:
            try:
                child.terminate()
            except OSError:
                pass


def stop_report(trainer: Any, signum: int, argv: Sequence[str], work_path: str) -> int:
    """Log how the run stopped and how to resume it; return the exit code (128 + ``signum``)."""
    name = signal.Signals(signum).name if signum in set(signal.Signals) else f"stop request {signum}"
    saved = [p for p in getattr(trainer, "resume_points", []) if p]
    state = trainer.state
    if getattr(trainer, "stopped_by", None) is None:
        logger.warning("%s arrived after the last training step; the run is complete (work dir %s).", name, work_path)
    elif saved:
        logger.warning(
            "stopped by %s after global step %d; resumable checkpoint: %s. Resume with: %s",
            name, state.iteration - 1, ", ".join(saved), resume_command(argv),
        )
    else:
        logger.warning(
            "stopped by %s after global step %d, but the config has no Checkpoint callback: nothing "
            "was saved and the run cannot be resumed.", name, state.iteration - 1,
        )
    sys.stderr.flush()
    return 128 + signum
