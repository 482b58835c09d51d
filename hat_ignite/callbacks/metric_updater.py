"""`MetricUpdater`: update metrics after each batch; log, reset and store their values.

When things happen, in one run (``step_id`` counts steps inside the epoch, ``global_step_id``
across the run; both 0-based)::

    on_loop_begin   reset
    on_epoch_begin  reset                      if reset_metrics_by == "epoch"
    on_step_begin   reset                      if reset_metrics_by == "step"
    on_batch_end    metric_update_func(metrics, batch, model_outs)   if filter_condition(batch)
    on_step_end     log                        if (step_id + 1) % step_log_freq == 0
                    reset                      if reset_metrics_by == "log" and just logged
                    store                      if (global_step_id + 1) % step_storage_freq == 0
    on_epoch_end    log                        if reset_metrics_by == "epoch" and
                                                  (epoch_id + 1) % epoch_log_freq == 0
                    store                      if (epoch_id + 1) % epoch_storage_freq == 0
    on_loop_end     store                      always, when the run updated the metrics (the
                                               values the run ends with; with "log" resets, the
                                               last logged values if nothing came after them)

Resuming: the metrics' accumulated state is saved in each training checkpoint
(:meth:`MetricUpdater.state_dict`); a resumed run puts it back at loop begin, and the epoch it
resumes inside is not reset at its begin, so its final values equal a straight run's.

Steps whose update is dropped (``nonfinite_policy="skip"`` on the batch processor) contribute
nothing: in such a training loop each batch's ``metric_update_func`` call waits until the loop
knows whether its step's update was done (``loop.update_dropped``; at once without a fused
optimizer, a step or more later with one, whose flag stays on the device until then), and is
dropped with the update. Before a step's log or store, the epoch end, the loop end and a
checkpoint (:meth:`MetricUpdater.state_dict`) the pending outcomes are read at once
(``loop.settle_updates()``, a blocking read at those points only), so the values shown and saved
hold every done step and no dropped one. The batches and model outputs of the waiting steps (one,
or a few on an accelerator) are held until then.

Storage layout: ``storage[storage_key]`` is a dict ``{metric name: value}`` (values are Python
floats, or lists of floats for metrics with a vector value) holding the latest stored values.
It is always written at the end of the run, so inside a validation run (one epoch) it ends up
with that validation's results; :class:`~hat_ignite.callbacks.validation.Validation` copies it
into the training loop's storage, where a checkpoint callback can compare it across runs.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Callable, Sequence

import ignite.distributed as idist

from hat_ignite.callbacks.base import CallbackMixin
from hat_ignite.engine.loop import build_if_config
from hat_ignite.metrics.base import iter_metrics, metric_name_values, reset_metrics
from hat_ignite.metrics.interop import foreign_metric_kind

__all__ = ["MetricUpdater", "format_name_values"]

logger = logging.getLogger(__name__)

_RESET_BY = ("step", "log", "epoch")


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return "[" + ", ".join(_format_value(v) for v in value) + "]"
    return str(value)


def format_name_values(pairs: Sequence[tuple[str, Any]]) -> str:
    """Format ``(name, value)`` pairs the way the metric logs show them.

    >>> format_name_values([("accuracy", 0.75), ("loss", 0.123456789)])
    'accuracy=0.75 loss=0.123457'
    """
    return " ".join(f"{name}={_format_value(value)}" for name, value in pairs)


def _begins_part_way(loop: Any) -> bool:
    """Whether the epoch beginning now starts part-way (a run resumed inside it): what the metrics
    accumulated in its first steps, restored from the checkpoint, is kept."""
    state = getattr(loop, "state", None)
    first = getattr(state, "epoch_first_step", None)
    return first is not None and getattr(state, "iteration", first) > first


def _check_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"MetricUpdater: {name} must be an int (< 1 disables it), got {value!r}.")
    return value


def _build_metrics(metrics: Any) -> Any:
    if metrics is None:
        return None
    if isinstance(metrics, dict) and "type" not in metrics:
        return {k: build_if_config(v, f"metrics[{k!r}]") for k, v in metrics.items()}
    return build_if_config(metrics, "metrics")


class MetricUpdater(CallbackMixin):
    """Reset, update, log and store metrics (the timeline is in the module docstring).

    Args:
        metric_update_func: ``f(metrics, batch, model_outs)``: picks labels and predictions out of
            the batch and the model outputs and updates the metrics; HAT's builders are
            :func:`~hat_ignite.callbacks.metric_update_funcs.update_metric_using_regex` and
            :func:`~hat_ignite.callbacks.metric_update_funcs.update_metric_using_index`.
        metrics: metric instances or configs (one, a list, or a dict). ``None`` uses the loop's
            ``train_metrics`` as each hook receives them; inside a ``Predictor`` (and so inside
            a Validation) those are the predictor's ``metrics``.
        filter_condition: ``f(batch) -> bool``, called with the (sub-)batch alone, as HAT
            does; the metrics are updated only for batches where it is true (one task's
            batches in multitask training: ``lambda x: x[1] == "task1"`` for the
            ``(batch, task)`` pairs of ``MultitaskLoader(return_task=True)``).
        step_log_freq: log every ``step_log_freq`` steps of an epoch; ``< 1`` disables step logs.
        reset_metrics_by: ``"step"`` (each step's values stand alone), ``"log"`` (reset after
            each step log) or ``"epoch"`` (accumulate over the epoch).
        epoch_log_freq: log every ``epoch_log_freq`` epochs; only with ``reset_metrics_by="epoch"``;
            ``< 1`` disables epoch logs.
        log_prefix: text put in front of every log line (e.g. ``"Validation "``); a space is
            added after a prefix that does not end with one (HAT configs pass the task name).
        step_storage_freq: store the values every ``step_storage_freq`` global steps; ``< 1``
            disables step storage.
        epoch_storage_freq: store the values every ``epoch_storage_freq`` epochs; ``< 1`` disables
            epoch storage.
        storage_key: the ``storage`` key the values are stored under.

    Example:
        >>> import torch
        >>> from hat_ignite.engine import BasicBatchProcessor, Predictor
        >>> from hat_ignite.metrics import Accuracy
        >>> class Scores(torch.nn.Module):   # a dict batch is passed whole to the model
        ...     def forward(self, batch):
        ...         return batch["scores"]
        >>> def update_metric(metrics, batch, model_outs):
        ...     for metric in metrics:
        ...         metric.update(batch["labels"], model_outs)
        >>> model = Scores()
        >>> batches = [{"scores": torch.tensor([[0.9, 0.1], [0.2, 0.8]]), "labels": torch.tensor([0, 0])}]
        >>> updater = MetricUpdater(update_metric, step_log_freq=0)
        >>> predictor = Predictor(model, batches, BasicBatchProcessor(need_grad_update=False),
        ...                       metrics=[Accuracy()], callbacks=[updater])
        >>> predictor.fit().storage["monitor_obj"]
        {'accuracy': 0.5}
    """

    def __init__(
        self,
        metric_update_func: Callable[[Any, Any, Any], Any],
        metrics: Sequence[Any] | Any = None,
        filter_condition: Callable[[Any], bool] | None = None,
        step_log_freq: int = 1,
        reset_metrics_by: str = "epoch",
        epoch_log_freq: int = 1,
        log_prefix: str = "",
        step_storage_freq: int = -1,
        epoch_storage_freq: int = -1,
        storage_key: str = "monitor_obj",
    ) -> None:
        if not callable(metric_update_func):
            raise TypeError(
                f"MetricUpdater: metric_update_func must be callable as f(metrics, batch, model_outs), "
                f"got {type(metric_update_func).__name__}."
            )
        if filter_condition is not None and not callable(filter_condition):
            raise TypeError(
                f"MetricUpdater: filter_condition must be None or callable as f(batch), "
                f"got {type(filter_condition).__name__}."
            )
        if reset_metrics_by not in _RESET_BY:
            raise ValueError(f"MetricUpdater: reset_metrics_by must be one of {_RESET_BY}, got {reset_metrics_by!r}.")
        for name, value in (
            ("step_log_freq", step_log_freq), ("epoch_log_freq", epoch_log_freq),
            ("step_storage_freq", step_storage_freq), ("epoch_storage_freq", epoch_storage_freq),
        ):
            _check_int(name, value)
        if reset_metrics_by == "log" and step_log_freq < 1:
            raise ValueError(
                f"MetricUpdater: reset_metrics_by='log' resets after each step log, but "
                f"step_log_freq={step_log_freq} disables step logs. Set step_log_freq >= 1 or "
                f"reset by 'step' or 'epoch'."
            )
        if not isinstance(storage_key, str) or not storage_key:
            raise ValueError(f"MetricUpdater: storage_key must be a non-empty string, got {storage_key!r}.")
        self.metric_update_func = metric_update_func
        self.metrics = _build_metrics(metrics)
        self.filter_condition = filter_condition
        self.step_log_freq = step_log_freq
        self.reset_metrics_by = reset_metrics_by
        self.epoch_log_freq = epoch_log_freq
        prefix = log_prefix or ""
        # HAT configs pass a bare name (log_prefix=task_name): keep it apart from "Epoch[...]"
        self.log_prefix = prefix + " " if prefix and not prefix[-1].isspace() else prefix
        self.step_storage_freq = step_storage_freq
        self.epoch_storage_freq = epoch_storage_freq
        self.storage_key = storage_key
        self._dirty = False  # updated since the last reset
        self._last_pairs: list[tuple[str, Any]] | None = None  # latest values computed this run
        self._checked_metrics: Any = None  # the metrics object _metrics() last found non-empty
        self._warned: set[str] = set()  # classes of unwrapped torchmetrics / Ignite metrics warned about
        self._restored: dict[str, Any] | None = None  # a checkpoint's state, applied at loop begin
        # With a loop that may drop a step's update: that loop, and the updates waiting for it to
        # say whether their step's update was done ((global_step_id, metrics, batch, model_outs)).
        self._gate: Any = None
        self._waiting: deque[tuple[int, Any, Any, Any]] = deque()
        #: The epoch id its epoch line shows instead of the loop's own: a ``Validation`` sets it to the
        #: training epoch it validates, so that line reads ``Validation Epoch[3]``, not ``Epoch[0]``.
        self.log_epoch_id: int | None = None

    # -- helpers ---------------------------------------------------------------------------
    def _metrics(self, train_metrics: Any) -> Any:
        metrics = self.metrics if self.metrics is not None else train_metrics
        if metrics is self._checked_metrics and metrics is not None:  # checked already
            return metrics
        if metrics is None or not any(True for _ in iter_metrics(metrics)):
            raise ValueError(
                "MetricUpdater has no metrics: pass metrics=[...] to it, or give the loop metrics "
                "(Trainer(train_metrics=...), Predictor(metrics=...); a Validation's predictor gets "
                "the training loop's val_metrics)."
            )
        self._checked_metrics = metrics
        self._warn_unwrapped(metrics)
        return metrics

    def _warn_unwrapped(self, metrics: Any) -> None:
        """Warn once per metric class about a torchmetrics or Ignite metric used without ``MetricAdapter``."""
        for metric in iter_metrics(metrics):
            kind = foreign_metric_kind(metric)
            name = type(metric).__name__
            if kind is None or name in self._warned or idist.get_rank() != 0:
                continue
            self._warned.add(name)
            order = "update(preds, target)" if kind == "torchmetrics" else "update((y_pred, y))"
            logger.warning(
                "MetricUpdater: the %s metric %s is used unwrapped. It takes %s, while HAT's update "
                "functions call metric.update(labels, preds): called so, it computes with the two "
                "swapped, silently (with class ids as predictions, precision is reported as recall, "
                "and a checkpoint's best follows it). Wrap it: MetricAdapter(%s(...), name=%r) "
                "(hat_ignite.metrics.MetricAdapter; in a config dict(type=\"MetricAdapter\", "
                "metric=dict(type=...), name=...)) takes HAT's order; an update function that "
                "already passes the predictions first may wrap it too, to name it.",
                kind, name, order, name, name.lower(),
            )

    def _reset(self, train_metrics: Any) -> None:
        reset_metrics(self._metrics(train_metrics))
        self._dirty = False

    def _values(self, metrics: Any) -> list[tuple[str, Any]]:
        self._last_pairs = metric_name_values(metrics)
        return self._last_pairs

    def _log(self, head: str, pairs: list[tuple[str, Any]]) -> None:
        if idist.get_rank() == 0:
            logger.info("%s%s %s", self.log_prefix, head, format_name_values(pairs))

    def _store(self, storage: dict[str, Any] | None, pairs: list[tuple[str, Any]]) -> None:
        if storage is None:  # a hook called without storage (HAT's unit tests, a custom loop): logged only
            return
        # a new dict each time (merged with what other updaters stored under the same key), so a
        # dict someone kept from an earlier store never changes under them
        stored = storage.get(self.storage_key)
        storage[self.storage_key] = {**(stored if isinstance(stored, dict) else {}), **dict(pairs)}

    @property
    def final_values(self) -> dict[str, Any] | None:
        """The values the latest run ended with (what its loop end stored), by metric name;
        ``None`` before a run, or when the run never updated nor logged its metrics.

        These are the metrics this updater really used (its own ``metrics=[...]``, or the loop's),
        so ``hat-train`` reports them in ``metrics.json``.
        """
        return dict(self._last_pairs) if self._last_pairs is not None else None

    def overridden_hooks(self) -> list[str]:
        """The hooks to attach: the per-step/per-epoch reset hooks only for their reset mode, and
        ``on_step_end`` only when steps are logged or stored."""
        skip = {
            "on_step_begin": self.reset_metrics_by != "step", "on_epoch_begin": self.reset_metrics_by != "epoch",
            # nothing to do at step ends without step logs or step storage
            "on_step_end": self.step_log_freq < 1 and self.step_storage_freq < 1,
        }
        return [h for h in super().overridden_hooks() if not skip.get(h, False)]

    # -- hooks -----------------------------------------------------------------------------
    def _release(self, settle: bool = False) -> None:
        """Apply the waiting updates whose step's update was done, drop those of dropped ones."""
        waiting, gate = self._waiting, self._gate
        if not waiting or gate is None:
            return
        if settle:
            gate.settle_updates()
        while waiting:
            dropped = gate.update_dropped(waiting[0][0])
            if dropped is None:
                return
            _, metrics, batch, model_outs = waiting.popleft()
            if not dropped:
                self.metric_update_func(metrics, batch, model_outs)
                self._dirty = True

    def on_loop_begin(self, train_metrics: Any = None, **kwargs: Any) -> None:
        loop = kwargs.get("loop")
        self._gate = loop if getattr(loop, "drops_updates", False) else None
        self._waiting.clear()
        self._last_pairs = None
        restored, self._restored = self._restored, None
        self._reset(train_metrics)
        if restored is not None:
            self._apply_state(restored, self._metrics(train_metrics))

    def on_epoch_begin(self, train_metrics: Any = None, loop: Any = None, **kwargs: Any) -> None:
        if self.reset_metrics_by == "epoch" and not _begins_part_way(loop):
            self._waiting.clear()  # the epoch end read every outcome: nothing of the last epoch waits
            self._reset(train_metrics)

    def on_step_begin(self, train_metrics: Any = None, **kwargs: Any) -> None:
        if self.reset_metrics_by == "step":
            self._waiting.clear()  # what the last step fed is reset unread
            self._reset(train_metrics)

    def on_batch_end(self, batch: Any = None, model_outs: Any = None, train_metrics: Any = None, **kwargs: Any) -> None:
        if self.filter_condition is not None and not self.filter_condition(batch):
            return
        if self._gate is not None:  # the step's update may still be dropped: wait to know
            step = self._gate.state.iteration - 1  # the running step's global_step_id
            self._waiting.append((step, self._metrics(train_metrics), batch, model_outs))
            self._release()
            return
        self.metric_update_func(self._metrics(train_metrics), batch, model_outs)
        self._dirty = True

    def on_step_end(
        self, epoch_id: int, step_id: int, global_step_id: int, storage: dict[str, Any] | None = None,
        train_metrics: Any = None, **kwargs: Any,
    ) -> None:
        log_now = self.step_log_freq > 0 and (step_id + 1) % self.step_log_freq == 0
        store_now = self.step_storage_freq > 0 and (global_step_id + 1) % self.step_storage_freq == 0
        if not (log_now or store_now):
            return
        self._release(settle=True)
        metrics = self._metrics(train_metrics)
        pairs = self._values(metrics)
        if log_now:
            self._log(f"Epoch[{epoch_id}] Step[{step_id}] GlobalStep[{global_step_id}]", pairs)
        if store_now:
            self._store(storage, pairs)
        if log_now and self.reset_metrics_by == "log":
            self._reset(metrics)

    def on_epoch_end(
        self, epoch_id: int, storage: dict[str, Any] | None = None, train_metrics: Any = None, **kwargs: Any,
    ) -> None:
        self._release(settle=True)
        log_now = (
            self.reset_metrics_by == "epoch" and self.epoch_log_freq > 0 and (epoch_id + 1) % self.epoch_log_freq == 0
        )
        store_now = self.epoch_storage_freq > 0 and (epoch_id + 1) % self.epoch_storage_freq == 0
        if not (log_now or store_now):
            return
        pairs = self._values(self._metrics(train_metrics))
        if log_now:
            self._log(f"Epoch[{epoch_id if self.log_epoch_id is None else self.log_epoch_id}]", pairs)
        if store_now:
            self._store(storage, pairs)

    def on_loop_end(self, storage: dict[str, Any] | None = None, train_metrics: Any = None, **kwargs: Any) -> None:
        self._release(settle=True)
        if self._dirty:
            self._store(storage, self._values(self._metrics(train_metrics)))
        elif self._last_pairs is not None:  # reset right after the last log: store what it showed
            self._store(storage, self._last_pairs)

    # -- checkpoint state ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What the metrics accumulated so far, so a resumed run reports what a straight run does.

        ``{"metrics": [each metric's state_dict()], "dirty", "last_pairs"}``; ``metrics`` is
        ``None`` before the first update, or when a metric has no ``state_dict()``.
        """
        self._release(settle=True)  # a checkpoint holds every done step's values, no dropped one's
        metrics = list(iter_metrics(self._checked_metrics))
        states = [m.state_dict() for m in metrics] if metrics and all(
            callable(getattr(m, "state_dict", None)) for m in metrics) else None
        last = [(name, value) for name, value in self._last_pairs] if self._last_pairs is not None else None
        return {"metrics": states, "dirty": self._dirty, "last_pairs": last}

    def load_state_dict(self, state: Any) -> None:
        """Keep a :meth:`state_dict` to put back into the metrics when the resumed loop begins."""
        if not isinstance(state, dict) or "metrics" not in state:
            raise ValueError(f"MetricUpdater: {type(state).__name__} is not a MetricUpdater state.")
        self._restored = state

    def _apply_state(self, state: dict[str, Any], metrics: Any) -> None:
        saved, found = state.get("metrics"), list(iter_metrics(metrics))
        if saved is None:
            return
        if len(saved) != len(found):
            raise ValueError(
                f"MetricUpdater: the checkpoint holds the state of {len(saved)} metric(s), this run has "
                f"{len(found)}. Resume with the metrics of the run that wrote it."
            )
        for metric, metric_state in zip(found, saved):
            metric.load_state_dict(metric_state)
        self._dirty = bool(state.get("dirty"))
        last = state.get("last_pairs")
        self._last_pairs = [tuple(pair) for pair in last] if last is not None else None

    def __repr__(self) -> str:
        return (
            f"MetricUpdater(metrics={self.metrics!r}, reset_metrics_by={self.reset_metrics_by!r}, "
            f"step_log_freq={self.step_log_freq}, epoch_log_freq={self.epoch_log_freq}, "
            f"storage_key={self.storage_key!r})"
        )
