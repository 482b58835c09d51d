"""HAT's loop events as Ignite custom events.

The HAT loop, and the Ignite event each HAT event is fired from::

    on_loop_begin                      <- Events.STARTED
    for epoch_id in epochs:
        on_epoch_begin                 <- Events.EPOCH_STARTED (after sampler.set_epoch)
        for step_id, batch in loader:
            on_step_begin              <- Events.ITERATION_STARTED (first of its handlers)
            # Ignite's process function runs the batch processor:
            [zero gradients: MultiBatchProcessor, when an accumulation group starts]
            for batch_idx, b in batches_of_this_step:    # 1 for Basic, n for Multi
                on_batch_begin         <- fired by the processor
                [zero gradients: BasicBatchProcessor, when an accumulation group starts]
                device move, batch transforms
                on_forward_begin       <- fired by the processor
                forward, inverse transforms
                on_forward_end         <- fired by the processor
                collect losses; training only from here to on_backward_end:
                on_backward_begin      <- fired by the processor
                (scaled) backward
                on_backward_end        <- fired by the processor
                [Basic, when the accumulation group ends: on_optimizer_step_begin, update]
                on_batch_end           <- fired by the processor
            [Multi, when the accumulation group ends: on_optimizer_step_begin, update]
            on_step_end                <- the process function's end (before ITERATION_COMPLETED)
        on_epoch_end                   <- Events.EPOCH_COMPLETED, or at the end of the run when
                                          stopping by step closes an epoch partway through
    on_loop_end                        <- Events.COMPLETED

``on_optimizer_step_begin`` fires right before each optimizer update (after the last backward
of the group), before the batch processor's finite-gradient check, gradient clipping and
``GradScaler.step``; an update that closes an incomplete accumulation group at an epoch's end
fires it from ``EPOCH_COMPLETED``, before ``on_epoch_end``.

Every event is registered on every hat-ignite engine, so Ignite handlers and event filters
work on them as on Ignite's own events:

>>> from ignite.engine import Engine
>>> HatEvents.STEP_END.value
'hat_step_end'
>>> HOOK_EVENTS["on_optimizer_step_begin"] is HatEvents.OPTIMIZER_STEP_BEGIN
True
>>> filtered = HatEvents.STEP_END(every=3)   # an Ignite event filter
>>> filtered == HatEvents.STEP_END
True
>>> [e.hat_index for e in (HatEvents.LOOP_BEGIN, HatEvents.FORWARD_BEGIN, HatEvents.STEP_END)]
[0, 4, 10]
>>> len(HOOK_EVENTS)
13
"""

from __future__ import annotations

from ignite.engine import EventEnum

__all__ = ["HatEvents", "HOOK_EVENTS", "EVENT_HOOKS", "EVENT_COUNTERS"]


class HatEvents(EventEnum):
    """The thirteen HAT loop events, in firing order (see the module docstring for where each fires)."""

    LOOP_BEGIN = "hat_loop_begin"
    EPOCH_BEGIN = "hat_epoch_begin"
    STEP_BEGIN = "hat_step_begin"
    BATCH_BEGIN = "hat_batch_begin"
    FORWARD_BEGIN = "hat_forward_begin"
    FORWARD_END = "hat_forward_end"
    BACKWARD_BEGIN = "hat_backward_begin"
    BACKWARD_END = "hat_backward_end"
    OPTIMIZER_STEP_BEGIN = "hat_optimizer_step_begin"
    BATCH_END = "hat_batch_end"
    STEP_END = "hat_step_end"
    EPOCH_END = "hat_epoch_end"
    LOOP_END = "hat_loop_end"

    #: position in the engine's ``hat_handlers`` list, set on each member below
    hat_index: int


for _index, _event in enumerate(HatEvents):
    # position of each event in the engine's ``hat_handlers`` list (see LoopBase.hat_handlers)
    _event.hat_index = _index
del _index, _event

#: HAT callback method name -> the event it is attached to, in firing order.
HOOK_EVENTS: dict[str, HatEvents] = {
    "on_loop_begin": HatEvents.LOOP_BEGIN,
    "on_epoch_begin": HatEvents.EPOCH_BEGIN,
    "on_step_begin": HatEvents.STEP_BEGIN,
    "on_batch_begin": HatEvents.BATCH_BEGIN,
    "on_forward_begin": HatEvents.FORWARD_BEGIN,
    "on_forward_end": HatEvents.FORWARD_END,
    "on_backward_begin": HatEvents.BACKWARD_BEGIN,
    "on_backward_end": HatEvents.BACKWARD_END,
    "on_optimizer_step_begin": HatEvents.OPTIMIZER_STEP_BEGIN,
    "on_batch_end": HatEvents.BATCH_END,
    "on_step_end": HatEvents.STEP_END,
    "on_epoch_end": HatEvents.EPOCH_END,
    "on_loop_end": HatEvents.LOOP_END,
}

EVENT_HOOKS: dict[HatEvents, str] = {event: hook for hook, event in HOOK_EVENTS.items()}

#: The ``engine.state`` counter each event's filters (``every=``, ``once=``) count with.
#: Step events (and ``OPTIMIZER_STEP_BEGIN``, at most once a step) count Ignite's 1-based
#: ``iteration``, epoch and loop events its ``epoch``, and the per-batch events their own
#: ``hat_batch_count`` (a MultiBatchProcessor step has several batches).
EVENT_COUNTERS: dict[HatEvents, str] = {
    HatEvents.LOOP_BEGIN: "epoch",
    HatEvents.EPOCH_BEGIN: "epoch",
    HatEvents.STEP_BEGIN: "iteration",
    HatEvents.BATCH_BEGIN: "hat_batch_count",
    HatEvents.FORWARD_BEGIN: "hat_batch_count",
    HatEvents.FORWARD_END: "hat_batch_count",
    HatEvents.BACKWARD_BEGIN: "hat_batch_count",
    HatEvents.BACKWARD_END: "hat_batch_count",
    HatEvents.OPTIMIZER_STEP_BEGIN: "iteration",
    HatEvents.BATCH_END: "hat_batch_count",
    HatEvents.STEP_END: "iteration",
    HatEvents.EPOCH_END: "epoch",
    HatEvents.LOOP_END: "epoch",
}
