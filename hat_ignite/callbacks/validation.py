"""`Validation` and `MeanTeacherValidation`: run a `Predictor` inside training.

When: with ``interval_by="epoch"`` after every ``val_interval``-th epoch (``on_epoch_end``,
``(epoch_id + 1) % val_interval == 0``); with ``interval_by="step"`` after every
``val_interval``-th global step (``on_step_end``, ``(global_step_id + 1) % val_interval == 0``);
and, with ``val_on_train_end``, once more at ``on_loop_end`` unless the run's last step was just
validated.

On what: the training loop's ``ema_model`` when it is not ``None`` (an EMA callback sets
``loop.ema_model``) and ``use_ema_model`` is true, else the train model. With a separate
``val_model``, that model is used instead, loaded first from the chosen model's ``state_dict``
when ``init_with_train_model``. With a ``model_convert_pipeline``, a deep copy is converted each
time, so neither the train model nor ``val_model`` is changed. Every module's train/eval mode is restored afterwards (so
BatchNorm layers a callback froze in eval mode stay frozen).

Results: the validation's :class:`~hat_ignite.engine.Predictor` runs ``callbacks`` with the
training loop's ``val_metrics`` as its ``metrics`` (its hooks see them as ``train_metrics``).
Everything those callbacks leave in the predictor's ``storage`` (e.g. a
:class:`~hat_ignite.callbacks.metric_updater.MetricUpdater`'s ``storage["monitor_obj"] =
{"accuracy": 0.93}``) is copied into the training loop's ``storage`` under the same keys, where
a checkpoint callback attached after this one finds it. ``storage["validation"]`` records the
latest validation: ``{"epoch_id", "global_step_id", "results"}`` with ``results`` that copy.

For Ignite handlers: ``validation.evaluator`` (a
:class:`~hat_ignite.callbacks.validation_evaluator.ValidationEvaluator`) is an Ignite engine that
runs with every validation, its ``state.metrics`` holding the results by name
(``state.metrics["accuracy"]``): attach ``Checkpoint(score_function=...)``, ``EarlyStopping``,
``common.gen_save_best_models_by_val_score`` or a logger's output handler to it as to an Ignite
evaluator. Its events fire inside this callback's hook, so they come before the hooks of the
callbacks listed after it.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Iterable, Sequence

import torch
from ignite.engine import Events

from hat_ignite.callbacks.base import CallbackMixin
from hat_ignite.checkpoint.payload import unwrap_model
from hat_ignite.callbacks.validation_evaluator import ValidationEvaluator
from hat_ignite.engine.loop import build_if_config, check_log_interval
from hat_ignite.engine.predictor import Predictor

__all__ = ["Validation", "MeanTeacherValidation", "STORAGE_KEY"]

logger = logging.getLogger(__name__)

#: ``storage`` key of the record of the latest validation.
STORAGE_KEY = "validation"

_INTERVAL_BY = ("epoch", "step")


def _modes(*models: torch.nn.Module | None) -> dict[torch.nn.Module, bool]:
    return {m: m.training for model in models if model is not None for m in model.modules()}


def _restore_modes(modes: dict[torch.nn.Module, bool]) -> None:
    for module, training in modes.items():
        module.training = training


def _plain(value: Any) -> Any:
    """``value`` with only what a weights-only checkpoint holds (numbers, strings, tensors, and
    dicts/lists of them); other entries are left out.

    >>> _plain({"monitor_obj": {"accuracy": 0.9, "f": print}, "n": [1, "a"]})
    {'monitor_obj': {'accuracy': 0.9}, 'n': [1, 'a']}
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        pairs = ((str(k), _plain(v)) for k, v in value.items())
        return {k: v for k, v in pairs if v is not _DROP}
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return _DROP if any(v is _DROP for v in items) else items
    return _DROP


_DROP: Any = object()  # what _plain returns for a value a weights-only checkpoint cannot hold


class Validation(CallbackMixin):
    """Validate during training (when, on what and where results go: see the module docstring).

    ``validation.evaluator`` is an Ignite engine that runs with every validation, its
    ``state.metrics`` holding the results by name: attach Ignite's evaluator handlers to it
    (:mod:`~hat_ignite.callbacks.validation_evaluator`).

    Args:
        data_loader: the validation loader, or a list of loaders (each run in turn).
        batch_processor: the validation batch processor (``need_grad_update=False``) or its
            config.
        callbacks: callbacks for the validation run, usually a ``MetricUpdater``; with
            ``share_callbacks=False``, one list per loader.
        val_interval: validate every ``val_interval`` epochs or steps.
        interval_by: ``"epoch"`` or ``"step"``, the unit of ``val_interval``.
        val_model: a model (or config) to validate instead of the train model.
        model_convert_pipeline: callable(s) ``model -> model`` (or configs) applied to a copy of
            the validated model before each validation, e.g. a float-to-quantized conversion.
        init_with_train_model: load ``val_model`` from the train (or EMA) model's
            ``state_dict`` before each validation; no effect without ``val_model``.
        strict_match: whether that ``load_state_dict`` requires the keys to match exactly.
        val_on_train_end: also validate at ``on_loop_end`` (unless that point was just validated,
            or the run stopped on request, e.g. on SIGTERM: the resumed run validates).
        profiler: a profiler passed to the validation predictor.
        share_callbacks: whether every loader shares ``callbacks``.
        log_interval: the predictor logs its progress after the steps whose ``step_id`` is a
            multiple of it, as HAT does (a float too; ``0`` or less: never).
        use_ema_model: validate the loop's ``ema_model`` when it has one (default); ``False``
            validates the train model even then.

    Example:
        >>> import torch
        >>> from hat_ignite.callbacks.metric_updater import MetricUpdater
        >>> from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index
        >>> from hat_ignite.metrics import Accuracy
        >>> class Net(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.fc = torch.nn.Linear(2, 2)
        ...     def forward(self, x, y):
        ...         logits = self.fc(x)
        ...         return torch.nn.functional.cross_entropy(logits, y), logits
        >>> _ = torch.manual_seed(0)
        >>> data = [(torch.randn(4, 2), torch.randint(0, 2, (4,))) for _ in range(3)]
        >>> def update_metric(metrics, batch, model_outs):
        ...     for metric in metrics:
        ...         metric.update(batch[1], model_outs[1])
        >>> validation = Validation(
        ...     data_loader=data[:2], batch_processor=BasicBatchProcessor(need_grad_update=False),
        ...     callbacks=[MetricUpdater(update_metric, step_log_freq=0, log_prefix="Validation ")],
        ...     val_interval=1, log_interval=0)
        >>> model = Net()
        >>> trainer = Trainer(
        ...     model=model, data_loader=data, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        ...     batch_processor=BasicBatchProcessor(need_grad_update=True,
        ...                                         loss_collector=collect_loss_by_index(0)),
        ...     device=None, num_epochs=2, val_metrics=[Accuracy()], callbacks=[validation])
        >>> storage = trainer.fit().storage
        >>> sorted(storage["monitor_obj"]), storage["validation"]["epoch_id"], model.training
        (['accuracy'], 1, True)
    """

    def __init__(
        self,
        data_loader: Iterable | Sequence[Iterable] | dict,
        batch_processor: Any,
        callbacks: Sequence[Any],
        val_interval: int = 1,
        interval_by: str = "epoch",
        val_model: torch.nn.Module | dict | None = None,
        model_convert_pipeline: Any = None,
        init_with_train_model: bool = True,
        strict_match: bool = False,
        val_on_train_end: bool = True,
        profiler: Any = None,
        share_callbacks: bool = True,
        log_interval: float = 10,
        use_ema_model: bool = True,
    ) -> None:
        name = type(self).__name__
        if isinstance(val_interval, bool) or not isinstance(val_interval, int) or val_interval < 1:
            raise ValueError(f"{name}: val_interval must be an integer >= 1, got {val_interval!r}.")
        interval_by = (interval_by or "epoch").lower() if isinstance(interval_by, str) else interval_by
        if interval_by not in _INTERVAL_BY:
            raise ValueError(f"{name}: interval_by must be 'epoch' or 'step', got {interval_by!r}.")
        check_log_interval(log_interval, name)
        if callbacks is None or not isinstance(callbacks, (list, tuple)):
            raise TypeError(
                f"{name}: callbacks must be a list (e.g. [MetricUpdater(...)], or [] for none), got "
                f"{type(callbacks).__name__}."
            )
        self.data_loader = build_if_config(data_loader, "data_loader")
        self.batch_processor = build_if_config(batch_processor, "batch_processor")
        if not callable(self.batch_processor):
            raise TypeError(
                f"{name}: batch_processor must be callable as processor(engine, batch), got "
                f"{type(self.batch_processor).__name__}; use BasicBatchProcessor(need_grad_update=False)."
            )
        if share_callbacks:
            self.callbacks = list(build_if_config(list(callbacks), "callbacks"))
        else:
            self.callbacks = [  # as HAT: each entry is one loader's callback, or a list of them
                list(build_if_config(list(cbs) if isinstance(cbs, (list, tuple)) else [cbs], f"callbacks[{i}]"))
                for i, cbs in enumerate(callbacks)
            ]
        val_model = build_if_config(val_model, "val_model")
        if val_model is not None and not isinstance(val_model, torch.nn.Module):
            raise TypeError(f"{name}: val_model must be None, a torch.nn.Module or a model config, got {type(val_model).__name__}.")
        self.val_model = val_model
        self.model_convert_pipeline = build_if_config(model_convert_pipeline, "model_convert_pipeline")
        self.val_interval = val_interval
        self.interval_by = interval_by
        self.init_with_train_model = init_with_train_model
        self.strict_match = strict_match
        self.val_on_train_end = val_on_train_end
        self.profiler = profiler
        self.share_callbacks = share_callbacks
        self.log_interval = log_interval
        self.use_ema_model = bool(use_ema_model)
        self._validated_at: int | None = None  # steps done at the latest validation of this run
        #: The Ignite engine each validation runs, for Ignite handlers (see the module docstring).
        self.evaluator = ValidationEvaluator(name)
        self._latest: dict[str, Any] | None = None  # the record of the latest validation (see state_dict)
        self._restored: dict[str, Any] | None = None  # a record load_state_dict got, put back at loop begin

    # -- which model -----------------------------------------------------------------------
    def select_source(self, model: torch.nn.Module, ema_model: torch.nn.Module | None) -> torch.nn.Module:
        """The model whose weights are validated: ``ema_model`` if set and used, else the train model."""
        return ema_model if ema_model is not None and self.use_ema_model else model

    def _val_model(self, source: torch.nn.Module) -> torch.nn.Module:
        source = unwrap_model(source)
        if self.val_model is None:
            return copy.deepcopy(source) if self.model_convert_pipeline is not None else source
        val_model = copy.deepcopy(self.val_model) if self.model_convert_pipeline is not None else self.val_model
        if self.init_with_train_model:
            try:
                result = val_model.load_state_dict(source.state_dict(), strict=self.strict_match)
            except RuntimeError as exc:
                raise RuntimeError(
                    f"{type(self).__name__}: loading the {type(source).__name__} weights into val_model "
                    f"({type(self.val_model).__name__}) with strict_match={self.strict_match} failed. Give a "
                    f"val_model with the same parameters, set strict_match=False to load the matching "
                    f"keys only, or init_with_train_model=False to keep val_model's own weights. "
                    f"Details: {exc}"
                ) from exc
            if result.missing_keys or result.unexpected_keys:
                logger.debug(
                    "Validation: val_model loaded with %d missing and %d unexpected keys",
                    len(result.missing_keys), len(result.unexpected_keys),
                )
        return val_model

    # -- running ---------------------------------------------------------------------------
    def validate(
        self, model: torch.nn.Module, ema_model: torch.nn.Module | None, device: Any, val_metrics: Any,
        storage: dict[str, Any] | None, epoch_id: int, global_step_id: int | None,
    ) -> dict[str, Any]:
        """Run one validation now and copy its results into ``storage`` (if given); return the results."""
        source = self.select_source(model, ema_model)
        modes = _modes(model, ema_model, source, self.val_model)
        results: dict[str, Any] = {}

        def collect(engine: Predictor) -> None:  # after every callback's on_loop_end
            results.update(engine.state.storage)

        labelled = self._label_epoch(epoch_id)
        try:
            val_model = self._val_model(source)
            predictor = Predictor(
                model=val_model, data_loader=self.data_loader, batch_processor=self.batch_processor,
                device=device, model_convert_pipeline=self.model_convert_pipeline, callbacks=self.callbacks,
                metrics=val_metrics, profiler=self.profiler, log_interval=self.log_interval,
                share_callbacks=self.share_callbacks,
            )
            predictor.add_event_handler(Events.COMPLETED, collect)
            self.evaluator.follow(predictor)
            predictor.fit()
            del predictor, val_model
        finally:
            self.evaluator.release()
            _restore_modes(modes)
            for cb in labelled:
                cb.log_epoch_id = None
        record = {"epoch_id": epoch_id, "global_step_id": global_step_id, "results": copy.deepcopy(results)}
        self._latest = record
        if storage is not None:
            storage.update(results)
            storage[STORAGE_KEY] = record
        return results

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The latest validation's record (``storage["validation"]``), saved in each checkpoint.

        A resumed run puts its results back into the storage when its loop begins, where they
        were in the straight run: a save point after the resume judges ``best`` on them, as the
        straight run's does (a stop's resume point, written right after a validation, does not
        judge it). Only numbers, strings, tensors and lists/dicts of them are kept, so the
        checkpoint loads with ``weights_only=True``.
        """
        return {"latest": _plain(self._latest)}

    def load_state_dict(self, state_dict: Any) -> None:
        """Keep a saved record; the next loop begin puts its results back into the storage."""
        latest = state_dict.get("latest") if isinstance(state_dict, dict) else None
        self._restored = latest if isinstance(latest, dict) else None

    def _label_epoch(self, epoch_id: int) -> list[Any]:
        """Have the callbacks that log an epoch line (``MetricUpdater``) show the training ``epoch_id``."""
        flat = [cb for item in self.callbacks for cb in (item if isinstance(item, (list, tuple)) else [item])]
        labelled = [cb for cb in flat if hasattr(cb, "log_epoch_id")]
        for cb in labelled:
            cb.log_epoch_id = epoch_id
        return labelled

    def overridden_hooks(self) -> list[str]:
        """The hooks to attach: ``on_step_end`` only when validating by step."""
        hooks = super().overridden_hooks()
        return hooks if self.interval_by == "step" else [h for h in hooks if h != "on_step_end"]

    def on_loop_begin(self, storage: Any = None, **kwargs: Any) -> None:
        self._validated_at = None
        restored, self._restored = self._restored, None
        self._latest = restored
        if restored is not None and isinstance(storage, dict):
            storage.update(copy.deepcopy(restored.get("results") or {}))
            storage[STORAGE_KEY] = copy.deepcopy(restored)

    def on_step_end(
        self, model: torch.nn.Module, epoch_id: int, global_step_id: int, ema_model: torch.nn.Module | None = None,
        device: Any = None, storage: dict[str, Any] | None = None, val_metrics: Any = None, **kwargs: Any,
    ) -> None:
        if self.interval_by == "step" and (global_step_id + 1) % self.val_interval == 0:
            self.validate(model, ema_model, device, val_metrics, storage, epoch_id, global_step_id)
            self._validated_at = global_step_id + 1

    def on_epoch_end(
        self, model: torch.nn.Module, epoch_id: int, global_step_id: int | None = None,
        ema_model: torch.nn.Module | None = None, device: Any = None, storage: dict[str, Any] | None = None,
        val_metrics: Any = None, **kwargs: Any,
    ) -> None:
        if self.interval_by == "epoch" and (epoch_id + 1) % self.val_interval == 0:
            self.validate(model, ema_model, device, val_metrics, storage, epoch_id, global_step_id)
            self._validated_at = global_step_id

    def on_loop_end(
        self, model: torch.nn.Module, epoch_id: int, global_step_id: int | None = None,
        ema_model: torch.nn.Module | None = None, device: Any = None, storage: dict[str, Any] | None = None,
        val_metrics: Any = None, **kwargs: Any,
    ) -> None:
        stopped_by = getattr(kwargs.get("loop"), "stopped_by", None)
        # without global_step_id (HAT's unit tests) nothing tells this state was validated: validate
        due = self.val_on_train_end and (global_step_id is None or self._validated_at != global_step_id)
        if due and stopped_by is not None:
            logger.warning("Skipping the end-of-training validation: the run was stopped (%s) and its "
                           "checkpoint is saved; the resumed run validates.", stopped_by)
            return
        if due:
            self.validate(model, ema_model, device, val_metrics, storage, epoch_id, global_step_id)
            self._validated_at = global_step_id

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(val_interval={self.val_interval}, interval_by={self.interval_by!r}, "
            f"val_on_train_end={self.val_on_train_end}, callbacks={self.callbacks!r})"
        )


class MeanTeacherValidation(Validation):
    """Validation of a mean-teacher model's student or teacher.

    The student is ``model.student`` when the (unwrapped) train model has such a submodule,
    else the train model itself. The teacher is ``model.teacher`` when it exists, else the
    loop's ``ema_model`` (the EMA of the student); asking for a teacher when neither exists is an
    error. ``ema_model`` is never used for the student.

    Args:
        inference_on: ``"student"`` or ``"teacher"``.
        **kwargs: :class:`Validation`'s arguments.

    Example:
        >>> import torch
        >>> class MeanTeacher(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.student, self.teacher = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        >>> mt = MeanTeacher()
        >>> val = MeanTeacherValidation("teacher", data_loader=[], batch_processor=lambda e, b: b, callbacks=[])
        >>> val.select_source(mt, ema_model=None) is mt.teacher
        True
    """

    def __init__(self, inference_on: str = "student", **kwargs: Any) -> None:
        if inference_on not in ("student", "teacher"):
            raise ValueError(f"MeanTeacherValidation: inference_on must be 'student' or 'teacher', got {inference_on!r}.")
        super().__init__(**kwargs)
        self.inference_on = inference_on

    def select_source(self, model: torch.nn.Module, ema_model: torch.nn.Module | None) -> torch.nn.Module:
        inner = unwrap_model(model)
        part = getattr(inner, self.inference_on, None)
        if isinstance(part, torch.nn.Module):
            return part
        if self.inference_on == "student":
            return model
        if ema_model is not None:
            return ema_model
        raise ValueError(
            f"MeanTeacherValidation(inference_on='teacher'): the model ({type(inner).__name__}) has no "
            f"'teacher' submodule and the loop has no ema_model. Give the model a .teacher module or "
            f"attach an EMA callback before this validation."
        )
