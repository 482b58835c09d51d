"""Bridge handlers: Ignite's own events drive HAT's events.

Module-level functions (Ignite passes the engine through a weak reference), so registering them on
an engine creates no reference cycle. :class:`~hat_ignite.engine.loop.LoopBase` registers them,
each before any other handler of its Ignite event:

=============================  =======================================================
Ignite event                   HAT events fired
=============================  =======================================================
``STARTED``                    ``LOOP_BEGIN`` (after the model mode is set and the attached
                               Ignite handlers are adopted: ``ignite_handlers.py``)
``EPOCH_STARTED``              ``EPOCH_BEGIN`` (after ``sampler.set_epoch``; a trainer's
                               model modes are noted after it)
``ITERATION_STARTED``          ``STEP_BEGIN`` (registered once ``STEP_BEGIN`` has a handler)
the process function           the batch processor, then ``STEP_END`` (then a requested
(:func:`run_step`)             stop is honoured), all before ``ITERATION_COMPLETED``
``EPOCH_COMPLETED``            ``EPOCH_END`` (after the batch processor's ``finish_epoch``)
``COMPLETED``                  ``EPOCH_END`` of an epoch a step limit cut short, then ``LOOP_END``
=============================  =======================================================

A step costs no Ignite handler call of the engine's own unless ``STEP_BEGIN`` is listened to:
``STEP_END`` is fired by the process function, which Ignite calls right before the
``ITERATION_COMPLETED`` handlers, so it keeps its place before them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

import torch

from hat_ignite.engine.dispatch import fire_hat_event
from hat_ignite.engine.events import HatEvents
from hat_ignite.engine.ignite_handlers import adopt_ignite_handlers
from hat_ignite.engine.processors.nonfinite import in_distributed_run
from hat_ignite.engine.state import EventStorage
from hat_ignite.errors import DataError

if TYPE_CHECKING:
    from hat_ignite.engine.loop import LoopBase

_STEP_BEGIN, _STEP_END = HatEvents.STEP_BEGIN.hat_index, HatEvents.STEP_END.hat_index


def loader_length(data_loader: Iterable) -> int | None:
    try:
        return len(data_loader)  # type: ignore[arg-type]
    except TypeError:
        return None


def set_sampler_epoch(data_loader: Iterable, epoch_id: int) -> None:
    """Call ``set_epoch`` on the loader's sampler(s), as DistributedSampler needs each epoch.

    A loader with its own ``set_epoch`` (a multitask loader, reaching each task's sampler) gets
    that call instead.
    """
    own = getattr(data_loader, "set_epoch", None)
    if callable(own):
        own(epoch_id)
        return
    for owner in (data_loader, getattr(data_loader, "batch_sampler", None)):
        sampler = getattr(owner, "sampler", None)
        set_epoch = getattr(sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch_id)
            return


def on_started(engine: LoopBase) -> None:
    engine.multi_process = in_distributed_run()  # read once a run by the per-step checks
    engine.state.storage = EventStorage()
    engine.state.hat_batch_count = 0
    engine.state.epoch_open = False
    engine.set_model_mode()
    adopt_ignite_handlers(engine)
    engine.fire_event(HatEvents.LOOP_BEGIN)
    engine._after_loop_begin(close_epoch)


def on_epoch_started(engine: LoopBase) -> None:
    state = engine.state
    model = engine.train_mode_model
    if model is not None and not model.training:  # e.g. a stock Ignite evaluator ran at EPOCH_COMPLETED
        engine.restore_train_mode()
    engine._before_epoch_begin()
    set_sampler_epoch(engine.data_loader, state.epoch - 1)
    if state.epoch_length:
        state.epoch_first_step = (state.epoch - 1) * state.epoch_length
    else:
        state.epoch_first_step = state.iteration
    state.epoch_open = True
    engine.fire_event(HatEvents.EPOCH_BEGIN)
    if model is not None:
        engine.note_train_modes()  # after the on_epoch_begin hooks (FreezeModule ...) set theirs


def on_iteration_started(engine: LoopBase) -> None:
    model = engine.train_mode_model
    if model is not None and not model.training:  # before the on_step_begin hooks set any mode
        engine.restore_train_mode()
    if engine.hat_handlers[_STEP_BEGIN]:
        fire_hat_event(engine, HatEvents.STEP_BEGIN)


def run_step(engine: LoopBase, batch: Any) -> Any:
    """The engine's process function: the step processor, then ``STEP_END`` and the stop check.

    With ``engine.step_clock`` set, the clock is read first, into ``state.step_start_time``.
    A trainer's model found out of training mode (a stock Ignite evaluator or ``EarlyStopping``
    handler left it in ``eval()``) is put back first, as Ignite's own trainer sets ``train()``
    each step; the check reads one flag.

    Ignite stores the returned value as ``engine.state.output``: the model outputs, or what the
    loop's ``state_output`` makes of them; the model outputs are stored there before
    ``STEP_END`` too, for its hooks' ``model_outs``.
    """
    clock = engine.step_clock
    if clock is not None:
        engine.state.step_start_time = clock()
    model = engine.train_mode_model
    if model is not None and not model.training:
        engine.restore_train_mode()
    output = engine.step_processor(engine, batch)
    if engine.hat_handlers[_STEP_END]:
        engine.state.output = output
        fire_hat_event(engine, HatEvents.STEP_END)
    if engine.stop_requested is not None or engine._stop_vote is not None:  # several processes vote each step
        engine._stop_if_requested()
    transform = engine.output_function  # state_output=: what Ignite handlers find in state.output
    return output if transform is None else transform(output)


def empty_loader_error(engine: LoopBase) -> DataError:
    return DataError(
        f"{type(engine).__name__}: the data_loader ({type(engine.data_loader).__name__}) yields no "
        f"batch, so stop_by={engine.stop_by!r} can never complete an "
        f"{'epoch' if engine.stop_by == 'epoch' else 'step'}. Check the dataset (is it empty? does "
        f"drop_last=True drop its only, incomplete batch?) and the sampler."
    )


def close_epoch(engine: LoopBase) -> None:
    if engine.state.epoch_length == 0:  # an iterable without len() that yielded nothing
        raise empty_loader_error(engine)
    finish = getattr(engine.batch_processor, "finish_epoch", None)
    if finish is not None:
        finish(engine)
    engine.state.epoch_open = False
    engine.fire_event(HatEvents.EPOCH_END)


def on_completed(engine: LoopBase) -> None:
    if engine._data_wait is not None:
        engine._data_wait.stop()  # the data-loader watchdog: no batch is awaited any more
    if engine._stop_vote is not None:
        engine._stop_vote.close()  # the last step's vote: no step is left to act on it
    if engine.state.epoch_open and engine.stopped_by is None:  # a step limit or terminate() stopped it partway
        close_epoch(engine)
    engine.fire_event(HatEvents.LOOP_END)


def check_log_interval(log_interval: Any, owner: str) -> float:
    """Check a loop's ``log_interval`` as HAT uses it: any real number (an int, or a float such as
    HAT configs' ``calibration_step / 10``); ``0`` or less logs nothing.

    >>> check_log_interval(2.5, "Calibrator")
    2.5
    >>> check_log_interval("10", "Trainer")
    Traceback (most recent call last):
    ...
    TypeError: Trainer: log_interval must be a number (an int or a float; 0 or less: never log), got '10'.
    """
    if isinstance(log_interval, bool) or not isinstance(log_interval, (int, float)):
        raise TypeError(
            f"{owner}: log_interval must be a number (an int or a float; 0 or less: never log), got {log_interval!r}."
        )
    return log_interval


def log_progress(engine: LoopBase) -> None:
    """Log the step's ids and loss after the steps HAT logs: ``step_id % log_interval == 0``.

    HAT's loop tests that expression (a float ``log_interval`` included) on the step id inside the
    epoch, so each epoch's first step is logged.
    """
    state = engine.state
    if state.step_id % engine.log_interval != 0:
        return
    losses = state.losses
    text = ""
    if isinstance(losses, torch.Tensor):
        text = f" loss={losses.detach().float().sum().item():.6g}"
    elif isinstance(losses, (list, tuple)) and losses:
        total = sum(float(t.detach().float().sum()) for t in losses if isinstance(t, torch.Tensor))
        text = f" loss={total:.6g}"
    engine.logger.info(
        "Epoch[%d] Step[%d] GlobalStep[%d]%s", state.epoch - 1, state.step_id, state.iteration - 1, text
    )
