"""`HatEventsMixin`: the thirteen HAT events on an Ignite engine, and how every event is fired.

:class:`~hat_ignite.engine.loop.LoopBase` takes its event handling from here: it registers
:class:`~hat_ignite.engine.events.HatEvents` with Ignite, keeps ``hat_handlers`` (the registry's
own handler lists of the thirteen events, by ``event.hat_index``) in step with Ignite's
``add_event_handler`` / ``remove_event_handler``, and fires HAT events through
:func:`~hat_ignite.engine.dispatch.fire_hat_event`. Ignite's own events are fired by Ignite, as
in any ``Engine``: no private Ignite method is replaced.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

from ignite.engine import Engine, Events

from hat_ignite.engine.bridge import on_iteration_started
from hat_ignite.engine.dispatch import fire_hat_event
from hat_ignite.engine.events import EVENT_COUNTERS, HatEvents
from hat_ignite.engine.state import hook_kwargs

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

    _EngineBase = Engine  # the mixin's ``super()`` calls reach Ignite's Engine (see LoopBase's bases)
else:
    _EngineBase = object

__all__ = ["HatEventsMixin", "quiet_ignite_messages"]

_STEP_BEGIN = HatEvents.STEP_BEGIN.hat_index

#: How the messages Ignite's ``Engine`` logs itself begin (run start/end, "Epoch[n] Complete" with
#: 1-based epochs, terminate/interrupt notes, and an exception's message, logged twice before it
#: propagates). hat-ignite logs progress with 0-based ids from its callbacks, and an exception
#: reaches the caller (``hat-train`` reports it once).
_IGNITE_MESSAGES = (
    "Engine run starting", "Engine run resuming", "Engine run finished", "Engine run is terminating",
    "Current run is terminating", "Terminate signaled", "Terminate current epoch", "interrupt signaled",
)


class _IgniteMessages(logging.Filter):
    """Drops the run-level INFO/ERROR lines Ignite's ``Engine`` logs (its DEBUG lines stay)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.DEBUG:
            return True
        message = record.msg
        if isinstance(message, str) and message.startswith(_IGNITE_MESSAGES):
            return False
        return not (isinstance(message, str) and message.startswith("Epoch[") and "] Complete. Time taken" in message)


_FILTER = _IgniteMessages()


def quiet_ignite_messages(logger: logging.Logger) -> logging.Logger:
    """Keep Ignite's own run-level lines out of ``logger`` (an engine's logger); returns it.

    Example:
        >>> import logging
        >>> log = quiet_ignite_messages(logging.getLogger("doctest.quiet"))
        >>> [f.filter(logging.makeLogRecord({"msg": m, "levelno": logging.INFO})) for f in log.filters
        ...  for m in ("Epoch[1] Complete. Time taken: 00:00:01.000", "Resuming inside epoch 0")]
        [False, True]
    """
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger


class HatEventsMixin(_EngineBase):
    """Event registry and firing of a hat-ignite engine (mixed into an Ignite ``Engine``)."""

    _event_handlers: Any
    logger: logging.Logger
    state: Any
    last_event_name: Any
    firing_kwargs: dict[str, dict[str, Any]] | None

    def _init_hat_events(self) -> None:
        """Register the HAT events and the handler-list view; called once, from ``__init__``."""
        self.register_events(*HatEvents, event_to_attr=EVENT_COUNTERS)
        #: The handler lists of the thirteen HAT events, by ``event.hat_index``: the very lists of
        #: Ignite's registry (kept in step by add/remove_event_handler), read without hashing.
        self.hat_handlers: list[list] = []
        self._step_begin_bridged = False  # see add_event_handler
        self._refresh_hat_handlers()

    def fire_event(self, event_name: Any) -> None:
        """Fire an event; a HAT event with no handler costs one list index.

        HAT events go through :func:`~hat_ignite.engine.dispatch.fire_hat_event`; their
        ``**kwargs`` hooks share one keyword dict per firing, built on first use (see
        :meth:`hook_kwargs`). Any other event goes to Ignite's ``Engine.fire_event``.
        """
        if event_name.__class__ is HatEvents:
            loop: Any = self  # a LoopBase: the only class this mixin goes into
            fire_hat_event(loop, event_name)
            return
        super().fire_event(event_name)

    def add_event_handler(self, event_name: Any, handler: Callable, *args: Any, **kwargs: Any) -> Any:
        """Ignite's ``add_event_handler``; keeps :attr:`hat_handlers` pointing at the live lists.

        The first handler of ``STEP_BEGIN`` also registers the bridge that fires it, as the first
        ``ITERATION_STARTED`` handler; until then a step pays no call for it.
        """
        handle = super().add_event_handler(event_name, handler, *args, **kwargs)
        self._refresh_hat_handlers()
        listening = self.__dict__.get("hat_handlers")  # absent while Engine.__init__ runs
        if listening and listening[_STEP_BEGIN] and not self._step_begin_bridged:
            self._step_begin_bridged = True
            super().add_event_handler(Events.ITERATION_STARTED, on_iteration_started)
            started = self._event_handlers[Events.ITERATION_STARTED]
            started.insert(0, started.pop())  # before any user handler, like the other bridges
        return handle

    def remove_event_handler(self, handler: Callable, event_name: Any) -> None:
        """Ignite's ``remove_event_handler`` (which replaces the event's list); refreshes :attr:`hat_handlers`."""
        super().remove_event_handler(handler, event_name)
        self._refresh_hat_handlers()

    def _refresh_hat_handlers(self) -> None:
        """Re-read the handler lists kept for the per-step paths (Ignite replaces a list on removal)."""
        if "hat_handlers" in self.__dict__:  # Engine.__init__ may add handlers before ours exist
            registry = self._event_handlers
            self.hat_handlers[:] = [registry[event] for event in HatEvents]

    def event_handlers(self, event: Any) -> list[str]:
        """Names of the handlers registered on ``event``, in the order they fire.

        A HAT callback's hook shows as ``Class.on_hook``, another handler by its qualified name.

        Example:
            >>> import torch
            >>> from hat_ignite.engine import BasicBatchProcessor, HatEvents, Predictor
            >>> from hat_ignite.callbacks import CallbackMixin
            >>> class Ping(CallbackMixin):
            ...     def on_step_end(self, **kwargs): self.pinged = True
            >>> predictor = Predictor(model=torch.nn.Linear(2, 1), data_loader=[torch.zeros(1, 2)],
            ...     batch_processor=BasicBatchProcessor(need_grad_update=False), callbacks=[Ping()])
            >>> predictor.event_handlers(HatEvents.STEP_END)
            ['Ping.on_step_end']
        """
        names = []
        for handler, _, _ in self._event_handlers.get(event, []):
            target = getattr(handler, "__wrapped__", handler)
            names.append(getattr(target, "__qualname__", None) or type(target).__qualname__)
        return names

    def hook_kwargs(self, hook: str) -> dict[str, Any]:
        """The keywords HAT passes to ``hook`` right now.

        While its event is being fired they are built once, on first use, and shared by the
        event's hooks (each hook gets its own copy when the dict is unpacked into its call);
        outside a firing they are built afresh.
        """
        loop: Any = self  # a LoopBase: the only class this mixin goes into
        firing = self.firing_kwargs
        if firing is None:
            return hook_kwargs(hook, loop)
        kwargs = firing.get(hook)
        if kwargs is None:
            kwargs = firing[hook] = hook_kwargs(hook, loop)
        return kwargs
