"""`ValidationEvaluator`: the Ignite engine through which a `Validation`'s runs reach Ignite handlers.

A :class:`~hat_ignite.callbacks.validation.Validation` builds a fresh
:class:`~hat_ignite.engine.Predictor` for each validation (on the train model, the EMA model or a
converted copy). Handlers attached to one predictor would be lost with it, so the validation
exposes one engine that lasts: ``validation.evaluator``. Attach Ignite handlers to it as to an
Ignite evaluator (``create_supervised_evaluator``): ``Checkpoint(score_function=...)``,
``EarlyStopping``, ``common.gen_save_best_models_by_val_score``,
``TensorboardLogger.attach_output_handler(evaluator, metric_names="all", ...)``, Ignite metrics.

During each validation the evaluator shares the predictor's ``state`` (``epoch``, ``iteration``,
``output``, ``batch``, ``metrics``) and fires its events from the predictor's:

=============================  ===========================================================
evaluator event                fired
=============================  ===========================================================
``STARTED``, ``EPOCH_STARTED``  after the predictor's HAT hooks of that point
``ITERATION_STARTED`` /         after the predictor's, only when the evaluator has handlers
``ITERATION_COMPLETED``         on them (``state.output``: the model outputs)
``EPOCH_COMPLETED``,            at the predictor's end, after every HAT hook
``COMPLETED``                   (``on_loop_end`` included)
=============================  ===========================================================

Before ``EPOCH_COMPLETED``, the results the validation's callbacks left in the predictor's
``storage`` are copied into ``state.metrics``: ``storage["monitor_obj"] = {"accuracy": 0.93}``
(a ``MetricUpdater``'s) gives ``state.metrics["accuracy"] == 0.93``; a number stored directly
under a key is copied under that key. With several data loaders, each loader's run is one
evaluator run. The evaluator's events fire inside the training loop's hook that validates (its
``on_epoch_end``, ``on_step_end`` or ``on_loop_end``), so HAT callbacks listed after the
``Validation`` see what its handlers did.
"""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Number
from typing import TYPE_CHECKING, Any, Callable

import torch
from ignite.engine import Engine, Events

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.predictor import Predictor

__all__ = ["ValidationEvaluator", "results_as_metrics"]

_PER_STEP = (Events.ITERATION_STARTED, Events.ITERATION_COMPLETED)


def results_as_metrics(storage: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers of a validation's ``storage``, by name, as ``state.metrics`` holds them.

    >>> results_as_metrics({"monitor_obj": {"accuracy": 0.93, "names": ["a"]}, "epoch_time": 1.5, "note": "x"})
    {'accuracy': 0.93, 'epoch_time': 1.5}
    """
    metrics: dict[str, Any] = {}
    for key, value in storage.items():
        items = value.items() if isinstance(value, Mapping) else [(key, value)]
        for name, number in items:
            if isinstance(number, (Number, torch.Tensor)) and not isinstance(number, bool):
                metrics[str(name)] = number
    return metrics


def _refuse_run(engine: Engine, batch: Any) -> None:
    raise RuntimeError("ValidationEvaluator runs no batch of its own: its Validation drives it.")


class ValidationEvaluator(Engine):
    """An Ignite engine whose events a ``Validation`` fires during each of its runs.

    See the module docstring for when each event fires and what ``state`` holds.

    Args:
        owner: the name of the callback that drives it (for error messages).
    """

    def __init__(self, owner: str = "Validation") -> None:
        #: The events handlers were added on (the per-step ones are forwarded only when listed).
        self.listened_events: list[Any] = []
        super().__init__(_refuse_run)
        self.owner = owner

    def add_event_handler(self, event_name: Any, handler: Callable, *args: Any, **kwargs: Any) -> Any:
        """Ignite's ``add_event_handler``; also notes the event in :attr:`listened_events`."""
        handle = super().add_event_handler(event_name, handler, *args, **kwargs)
        self.listened_events.append(event_name)
        return handle

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: the evaluator runs when its validation does (during the training loop's ``fit()``)."""
        raise RuntimeError(
            f"{self.owner}.evaluator runs when the {self.owner} callback validates during training "
            f"(trainer.fit()); attach Ignite handlers to it and train. To validate now, call "
            f"validation.validate(...) or run a Predictor."
        )

    def follow(self, predictor: Predictor) -> None:
        """Fire this engine's events from ``predictor``'s run(s) (register before ``fit()``)."""
        predictor.add_event_handler(Events.STARTED, self._forward, Events.STARTED)
        predictor.add_event_handler(Events.EPOCH_STARTED, self._forward, Events.EPOCH_STARTED)
        for event in _PER_STEP:  # a step pays for the forwarding only when someone listens
            if any(event == listened for listened in self.listened_events):
                predictor.add_event_handler(event, self._forward, event)
        predictor.add_event_handler(Events.COMPLETED, self._finish)

    def _forward(self, predictor: Engine, event: Any) -> None:
        if event is Events.STARTED:
            self.state = predictor.state
            self.should_terminate = False
        self.fire_event(event)

    def _finish(self, predictor: Engine) -> None:
        state = predictor.state
        storage = getattr(state, "storage", None)
        if isinstance(storage, Mapping):
            state.metrics.update(results_as_metrics(storage))
        if state.epoch:  # a run that did an epoch
            self.fire_event(Events.EPOCH_COMPLETED)
        self.fire_event(Events.COMPLETED)

    def release(self) -> None:
        """Drop the last run's batch and outputs (kept: epoch, iteration, metrics, storage)."""
        self.state.batch = self.state.output = self.state.dataloader = None
