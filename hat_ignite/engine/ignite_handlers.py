"""Stock Ignite handlers that need to know about HAT's loop: ``EMAHandler`` and ``HandlersTimeProfiler``.

:func:`adopt_ignite_handlers` runs when a loop starts (Ignite's ``STARTED``, before
``on_loop_begin``), after every handler the user attached.

* **Ignite's** ``EMAHandler``: attached to a loop (``ema_handler.attach(trainer)``), its
  ``ema_model`` becomes the loop's ``ema_model``, which is what HAT's hooks receive as
  ``ema_model``: ``Validation`` then validates the averaged weights, as it does with HAT's own EMA
  callback (``Validation(use_ema_model=False)`` validates the train model), and ``Checkpoint``
  saves them as ``ema_state_dict``. An ``ema_model`` set otherwise (HAT's
  ``ExponentialMovingAverage``, or ``trainer.ema_model = ...`` by hand) is kept.
* **Ignite's** ``HandlersTimeProfiler``: HAT's hooks are Ignite handlers the profiler times, one
  row each, but they run inside another timed span: the step hooks (``on_batch_*``,
  ``on_forward_*``, ``on_backward_*``, ``on_optimizer_step_begin``, ``on_step_end``) inside the
  process function ("Processing"), the others inside the loop's bridge handler of an Ignite event
  (``on_started``, ``on_epoch_started``, ``on_iteration_started``, ``close_epoch``,
  ``on_completed``). So that each hook is counted once, its event's handlers pause the
  profiler's processing timer while they run, and the bridge's row counts only what runs after
  them: the rows then add up to no more than the run's wall time.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ignite.engine import Events

if TYPE_CHECKING:
    from hat_ignite.engine.loop import LoopBase

__all__ = ["adopt_ignite_handlers", "attached_ema_handlers"]

logger = logging.getLogger(__name__)


def _ignite_class(obj: Any, name: str) -> bool:
    """Whether ``obj`` is an instance of Ignite's class ``name`` (found by name: no import)."""
    return any(c.__name__ == name and c.__module__.startswith("ignite.") for c in type(obj).__mro__)


def _handler_owners(engine: LoopBase, method: str, cls: str) -> list[Any]:
    """The objects of Ignite class ``cls`` whose bound ``method`` is a handler of ``engine``, once each."""
    owners: list[Any] = []
    for handlers in list(engine._event_handlers.values()):
        for func, _, _ in handlers:
            func = getattr(func, "_profiler_original", func)  # as HandlersTimeProfiler wrapped it
            owner = getattr(func, "__self__", None)
            if (
                owner is not None and getattr(func, "__name__", None) == method
                and _ignite_class(owner, cls) and all(owner is not o for o in owners)
            ):
                owners.append(owner)
    return owners


def attached_ema_handlers(engine: LoopBase) -> list[Any]:
    """The Ignite ``EMAHandler`` objects attached to ``engine``.

    Example:
        >>> import torch
        >>> from ignite.handlers import EMAHandler
        >>> from hat_ignite.engine import BasicBatchProcessor, Predictor
        >>> model = torch.nn.Linear(2, 1)
        >>> loop = Predictor(model, [torch.zeros(1, 2)], BasicBatchProcessor(need_grad_update=False))
        >>> ema = EMAHandler(model)
        >>> ema.attach(loop)
        >>> attached_ema_handlers(loop) == [ema]
        True
    """
    return _handler_owners(engine, "_update_ema_model", "EMAHandler")


def _adopt_ema(engine: LoopBase) -> None:
    adopted = engine.__dict__.get("_adopted_ema")
    if adopted is not None and engine.ema_model is adopted:
        engine.ema_model = None  # re-chosen below: the handler may have been detached since
    engine.__dict__["_adopted_ema"] = None
    handlers = attached_ema_handlers(engine)
    if not handlers:
        return
    if engine.ema_model is not None:
        logger.info(
            "%s: Ignite's EMAHandler is attached but the loop already has an ema_model (%s); HAT's "
            "hooks and Validation use that one.", type(engine).__name__, type(engine.ema_model).__name__,
        )
        return
    if len(handlers) > 1:
        logger.warning(
            "%s: %d Ignite EMAHandlers are attached, so none is the loop's ema_model and Validation "
            "validates the train model. Choose one before fit(): trainer.ema_model = "
            "ema_handler.ema_model.", type(engine).__name__, len(handlers),
        )
        return
    engine.ema_model = engine.__dict__["_adopted_ema"] = handlers[0].ema_model
    logger.info(
        "%s: the attached Ignite EMAHandler's ema_model is the loop's ema_model: HAT's hooks receive "
        "it and Validation validates it (Validation(use_ema_model=False) validates the train model).",
        type(engine).__name__,
    )


def _strip_separators(engine: LoopBase) -> None:
    """Take out the entries :func:`_separate_hook_time` put into the HAT events' handler lists."""
    added = engine.__dict__.pop("_profiler_separators", None)
    if not added:
        return
    for handlers in engine.hat_handlers:
        if handlers:
            handlers[:] = [entry for entry in handlers if all(entry is not a for a in added)]


def _separate_hook_time(engine: LoopBase) -> None:
    """Have each attached ``HandlersTimeProfiler`` count every HAT hook once (module docstring)."""
    profilers = _handler_owners(engine, "_timeit_processing", "HandlersTimeProfiler")
    added: list[tuple[Any, ...]] = []
    for profiler in profilers:
        processing = getattr(profiler, "_processing_timer", None)
        handlers_timer = getattr(profiler, "_event_handlers_timer", None)
        if not all(callable(getattr(t, m, None)) for t in (processing, handlers_timer) for m in ("pause", "resume", "reset")):
            continue  # another Ignite version's profiler: leave it as it is
        assert processing is not None and handlers_timer is not None
        for handlers in engine.hat_handlers:
            if not handlers:
                continue  # an event nobody listens to stays free
            first: tuple[Any, ...] = (processing.pause, (), {})
            last: list[tuple[Any, ...]] = [(handlers_timer.reset, (), {}), (processing.resume, (), {})]
            handlers.insert(0, first)
            handlers.extend(last)
            added += [first, *last]
    if added:
        engine.__dict__["_profiler_separators"] = added
        engine.add_event_handler(Events.COMPLETED, _strip_separators)


def adopt_ignite_handlers(engine: LoopBase) -> None:
    """Connect the attached ``EMAHandler`` and ``HandlersTimeProfiler`` to HAT's loop (module docstring)."""
    _strip_separators(engine)
    if engine.has_event_handler(_strip_separators, Events.COMPLETED):
        engine.remove_event_handler(_strip_separators, Events.COMPLETED)
    _adopt_ema(engine)
    _separate_hook_time(engine)

