"""What a resume does when the config's schedule differs from the one a checkpoint was written in.

A checkpoint records the run's progress (``progress``: steps done, steps per epoch, ``stop_by``,
``num_epochs``, ``num_steps``). A resume goes on with the schedule the config asks for now, and
says so; what cannot be honoured is refused before any step, naming both values and the fix:

===========================  ===============================================================
the config now has ...       the resume ...
===========================  ===============================================================
another number of steps per  is refused: the saved position (steps done, the place inside the
epoch (another batch size,   epoch, the shuffle order) counts batches of the old size, so no
another dataset)             step of the new loader continues it exactly
a larger ``num_epochs`` /    goes on to the new end (logged)
``num_steps``
a smaller one, not below     stops at the new end (logged); at exactly the saved point it
the steps done               trains no step and ends the run there
a smaller one, below the     is refused: the checkpoint is past the end, nothing can be trained
steps done                   and the run cannot end where the config says
===========================  ===============================================================

Changed optimizer options (``lr``, ``momentum``, ``fused`` ...) are the config's too; they are
applied when the optimizer state is loaded (:mod:`~hat_ignite.checkpoint.optimizer_state`), and
:func:`rebase_schedules` makes the lr (and optimizer-parameter) updaters schedule from the
config's base values rather than the ones restored with their state.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from hat_ignite.errors import CheckpointError

__all__ = ["check_schedule", "rebase_schedules"]

logger = logging.getLogger(__name__)


def _schedule(stop_by: str, num_epochs: Any, num_steps: Any, length: int | None) -> tuple[int | None, str]:
    """``(total steps, description)`` of a schedule; total is ``None`` when it cannot be known."""
    if stop_by == "step":
        return (None if num_steps is None else int(num_steps)), f"num_steps={num_steps}"
    if num_epochs is None or not length:
        return None, f"num_epochs={num_epochs}"
    return int(num_epochs) * length, f"num_epochs={num_epochs} ({int(num_epochs) * length} steps)"


def check_schedule(loop: Any, progress: Mapping[str, Any], data: Any, length: int | None, path: str) -> None:
    """Refuse a resume the config's schedule cannot continue; log how a changed one goes on.

    Args:
        loop: the loop resumed into (its ``stop_by``, ``num_epochs``, ``num_steps``).
        progress: the checkpoint's ``progress`` entry.
        data: the checkpoint's ``data`` entry (its ``epoch_open``: the last epoch's end hooks
            are still to run), or ``None``.
        length: the loop's steps per epoch now (``None``: the loader has no length).
        path: the checkpoint, named in messages.

    Raises:
        CheckpointError: the steps per epoch differ, or the checkpoint is past the new end.
    """
    iteration = int(progress["iteration"])
    saved_length = progress.get("epoch_length")
    if saved_length and length and int(saved_length) != int(length):
        raise CheckpointError(
            f"Checkpoint {path} was written with {int(saved_length)} steps per epoch, but this run's data loader "
            f"has {int(length)} (another batch size or dataset). Its progress ({iteration} steps done), its place "
            f"inside the epoch and its shuffle order count batches of the old size, so the run cannot go on "
            f"exactly. Resume with the data loader that wrote it (the batch size giving {int(saved_length)} steps "
            f"per epoch), or start a new run from its weights only (resume_epoch_or_step=False, or LoadCheckpoint "
            f"in model_convert_pipeline without --resume)."
        )
    stop_by = str(getattr(loop, "stop_by", "epoch"))
    total, wanted = _schedule(stop_by, getattr(loop, "num_epochs", None), getattr(loop, "num_steps", None), length)
    saved_stop_by = progress.get("stop_by")
    if "num_epochs" not in progress and "num_steps" not in progress:
        return  # an older checkpoint: its schedule is not recorded
    saved_total, saved_wanted = _schedule(str(saved_stop_by or stop_by), progress.get("num_epochs"),
                                          progress.get("num_steps"), int(saved_length) if saved_length else length)
    if total is not None and iteration > total:
        raise CheckpointError(
            f"Checkpoint {path} has {iteration} steps done, past the end of this run's schedule ({stop_by}: "
            f"{wanted}); it was written in a run of {saved_wanted}. Nothing is left to train, and the run cannot "
            f"end where the config says. Resume with a schedule of at least {iteration} steps (e.g. the saved "
            f"{saved_wanted}), or evaluate/load the checkpoint as it is."
        )
    if (saved_stop_by or stop_by) == stop_by and saved_wanted == wanted:
        return
    if total is None:
        outcome = "the run goes on under the config's schedule"
    elif saved_total is not None and total > saved_total:
        outcome = f"the run is extended and goes on to step {total}"
    elif iteration == total and not (isinstance(data, Mapping) and data.get("epoch_open")):
        outcome = "the checkpoint is at the new end: no step is trained, the run ends there"
    else:
        outcome = f"the run is shortened and ends after step {total}"
    logger.warning("Resuming from %s with the config's schedule: checkpoint %s %s -> config %s %s (%d steps done): %s.",
                   path, saved_stop_by or stop_by, saved_wanted, stop_by, wanted, iteration, outcome)


def rebase_schedules(callbacks: Iterable[Any], options: set[str]) -> None:
    """Have each updater scheduling one of ``options`` take its base values from the optimizer.

    An lr updater restored from a checkpoint schedules from the base lrs it saved; after a resume
    whose config changed ``lr`` (or, for an optimizer-parameter updater, its ``param_name``), the
    base is the config's value, which the optimizer's groups now hold.
    """
    if not options:
        return
    for cb in callbacks:
        rebase = getattr(cb, "rebase_from_optimizer", None)
        if callable(rebase) and getattr(cb, "param_name", None) in options:
            rebase()
