"""Ignite handlers and metrics in a loop's ``callbacks`` list.

A stock Ignite handler (``TerminateOnNan``, ``Checkpoint``, a plain function) is a callable
``handler(engine)`` registered on an *event*; a metric (``RunningAverage``) is attached under a
*name*. Neither can be listed bare, so a ``callbacks`` entry says which, as a dict (a config may
write it the same way, the handler itself being a config dict):

* ``dict(handler=TerminateOnNan(), event="ITERATION_COMPLETED")``: the handler on that event. The
  event is a name of Ignite's :class:`~ignite.engine.Events` or of
  :class:`~hat_ignite.engine.HatEvents` (``"STEP_END"``), or an event object, filtered too
  (``Events.ITERATION_COMPLETED(every=10)``). ``every=`` / ``once=`` keys filter a named event.
* ``dict(handler=RunningAverage(output_transform=...), name="loss")``: the metric attached as
  ``metric.attach(engine, name)`` (a ``usage=`` key is passed on).

Handlers run in list order with the HAT callbacks of the same point: an entry on ``STARTED``,
``EPOCH_STARTED``, ``EPOCH_COMPLETED`` or ``COMPLETED`` is registered on the HAT event fired there
(``LOOP_BEGIN``, ``EPOCH_BEGIN``, ``EPOCH_END``, ``LOOP_END``), so a handler listed before a HAT
callback runs before its hook: an evaluator listed before HAT's ``Checkpoint`` has its results
ready when the checkpoint reads them. ``EPOCH_END`` is also fired when a step limit ends the run
inside an epoch, so such an entry also runs then. ``ITERATION_*`` entries stay on Ignite's events:
they run after the step's HAT hooks and read ``engine.state.output`` as Ignite sets it.

>>> from ignite.engine import Events
>>> ignite_event("EPOCH_COMPLETED", "callbacks[0]") is HatEvents.EPOCH_END
True
>>> ignite_event("ITERATION_COMPLETED", "callbacks[0]") == Events.ITERATION_COMPLETED
True
>>> ignite_event("ITERATION_DONE", "callbacks[0]")
Traceback (most recent call last):
...
ValueError: callbacks[0].event: 'ITERATION_DONE' is no event; did you mean 'ITERATION_COMPLETED'? ...
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any, Mapping

from ignite.engine import Events
from ignite.engine.events import CallableEventWithFilter
from ignite.metrics import Metric

from hat_ignite.engine.events import HatEvents

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["is_handler_entry", "attach_entry", "ignite_event", "bare_handler_error", "ENTRY_KEYS"]

#: The keys a ``callbacks`` entry for an Ignite handler or metric may have.
ENTRY_KEYS = ("handler", "event", "every", "once", "name", "usage")

#: Ignite events whose handlers, when listed in ``callbacks``, run among the HAT hooks of that point.
_IN_HAT_ORDER: dict[Any, HatEvents] = {
    Events.STARTED: HatEvents.LOOP_BEGIN,
    Events.EPOCH_STARTED: HatEvents.EPOCH_BEGIN,
    Events.EPOCH_COMPLETED: HatEvents.EPOCH_END,
    Events.COMPLETED: HatEvents.LOOP_END,
}

#: The event a stock Ignite handler usually goes on, for the error that says how to list it.
_USUAL_EVENTS = {
    "TerminateOnNan": "ITERATION_COMPLETED",
    "Checkpoint": "EPOCH_COMPLETED",
    "ModelCheckpoint": "EPOCH_COMPLETED",
    "EMAHandler": "ITERATION_COMPLETED",
    "Timer": "EPOCH_COMPLETED",
}


def is_handler_entry(entry: Any) -> bool:
    """Whether a ``callbacks`` item is a ``dict(handler=..., ...)`` entry (see the module docstring)."""
    return isinstance(entry, Mapping) and "handler" in entry and "type" not in entry


def _event_names() -> dict[str, Any]:
    names: dict[str, Any] = {e.name: e for e in Events}
    names.update({e.name: e for e in HatEvents})
    return names


def ignite_event(event: Any, key: str) -> Any:
    """The event an entry's handler is registered on: ``event`` (a name or an event object).

    The Ignite events of the loop's begin/end and epoch begin/end map to their HAT events (with
    the same filter), so listed handlers keep the list's order among the HAT hooks.
    """
    if isinstance(event, str):
        names = _event_names()
        found = names.get(event.strip().upper())
        if found is None:
            close = difflib.get_close_matches(event.upper(), list(names), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(
                f"{key}.event: {event!r} is no event; {hint}Use a name of ignite.engine.Events "
                f"(ITERATION_COMPLETED, EPOCH_COMPLETED, ...) or of HatEvents (STEP_END, ...)."
            )
        event = found
    if not isinstance(event, CallableEventWithFilter):
        raise TypeError(
            f"{key}.event must be an event name such as 'ITERATION_COMPLETED' or an event such as "
            f"Events.EPOCH_COMPLETED(every=2), got {type(event).__name__}."
        )
    target = _IN_HAT_ORDER.get(event)
    if target is None:
        return event
    return target if event.filter is None else target(event_filter=event.filter)


def attach_entry(engine: LoopBase, entry: Mapping[str, Any], key: str) -> tuple[Any, list[Any]]:
    """Attach one ``dict(handler=..., event=...)`` / ``dict(handler=metric, name=...)`` entry.

    Returns:
        The handler (built when it is a config) and the removable handles made.
    """
    from hat_ignite.engine.loop import build_if_config  # loop imports this module

    unknown = sorted(set(entry) - set(ENTRY_KEYS))
    if unknown:
        raise ValueError(
            f"{key}: unknown key(s) {unknown} in a handler entry; an entry has handler= and event= "
            f"(with every= / once=) for a handler, or handler= and name= (with usage=) for a metric."
        )
    handler = build_if_config(entry["handler"], f"{key}.handler")
    if isinstance(handler, Metric):
        if not isinstance(entry.get("name"), str):
            raise ValueError(
                f"{key}: {type(handler).__name__} is an Ignite metric; give the name its value goes under "
                f"in engine.state.metrics: dict(handler={type(handler).__name__}(...), name='loss')."
            )
        extra = {"usage": entry["usage"]} if "usage" in entry else {}
        handler.attach(engine, entry["name"], **extra)
        return handler, []
    if not callable(handler):
        raise TypeError(f"{key}.handler must be callable as handler(engine), got {type(handler).__name__}.")
    if "event" not in entry:
        raise ValueError(f"{key}: a handler entry needs event=, e.g. {_how(handler)}.")
    event = ignite_event(entry["event"], key)
    if "every" in entry or "once" in entry:
        if isinstance(entry["event"], CallableEventWithFilter) and entry["event"].filter is not None:
            raise ValueError(f"{key}: the event already has a filter; drop every= / once=.")
        event = event(every=entry.get("every"), once=entry.get("once"))
    return handler, [engine.add_event_handler(event, handler)]


def _how(handler: Any) -> str:
    name = type(handler).__name__
    if isinstance(handler, Metric):
        return f"dict(handler={name}(...), name='{'loss' if name == 'RunningAverage' else name.lower()}')"
    event = _USUAL_EVENTS.get(name, "ITERATION_COMPLETED")
    shown = f"{name}(...)" if not hasattr(handler, "__code__") else getattr(handler, "__name__", "handler")
    return f"dict(handler={shown}, event={event!r})"


def bare_handler_error(handler: Any, key: str) -> TypeError:
    """The error for an object ``callbacks`` cannot attach as it is; says how to list it."""
    name = type(handler).__name__
    if isinstance(handler, Metric):
        return TypeError(
            f"{key} is a {name}, an Ignite metric: list it with the name its value goes under in "
            f"engine.state.metrics, as {_how(handler)} (see hat_ignite.engine.ignite_entries)."
        )
    if callable(handler):
        return TypeError(
            f"{key} is a {name}, an Ignite-style handler (called as handler(engine)) without attach(engine): "
            f"list it with the event it belongs on, as {_how(handler)} (see hat_ignite.engine.ignite_entries)."
        )
    return TypeError(
        f"{key} is a {name}, which has neither HAT hooks (on_step_end, ...) nor an attach(engine) method, "
        f"and is not callable as an Ignite handler. A callback must be a HAT callback, an object with "
        f"attach(engine), or an Ignite handler listed with its event: "
        f"dict(handler=..., event='ITERATION_COMPLETED')."
    )
