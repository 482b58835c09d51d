"""`TensorBoard`: write a run's losses, learning rates and metrics to a TensorBoard event file.

What is written, under which tag (the x axis is always HAT's ``global_step_id``):

* ``loss/<name>``: each loss in ``model_outs`` whose flattened key matches ``loss_name_reg``;
  every ``update_freq`` steps (that step's value) or epochs (the epoch's mean);
* ``lr/group_<i>``: the learning rate of each optimizer param group, at the same points;
* ``train/<metric>``: the ``get()`` values of the loop's ``train_metrics``, at the same points;
* ``metrics/<name>``: the numbers in the loop's ``state.metrics`` (where Ignite metrics and
  handlers such as ``RunningAverage`` put theirs), at the same points;
* ``val/<metric>``: each validation's results, read from ``storage["validation"]`` (the record a
  ``Validation`` callback leaves), once per validation;
* ``stats/<key>``: a ``StatsMonitor``'s figures from ``storage["stats"]`` (those that changed
  since its previous record), once per record.

Loss names: ``model_outs`` is flattened to dotted keys (``({"cls_loss": t}, logits)`` gives
``0.cls_loss`` and ``1``); a key is a loss when ``loss_name_reg`` matches it or its last part. The
tag drops the purely numeric parts (``loss/cls_loss``) unless two losses would then share a name.
A loss tensor with several elements is summed, as the batch processor does before backward.

Steps: as in HAT, with ``update_by="step"``, step ``global_step_id`` is written when
``global_step_id % update_freq == 0`` (the first step, then every ``update_freq``-th), so ``N``
steps give ``ceil(N / update_freq)`` points per tag. With ``update_by="epoch"``, the end of epoch
``epoch_id`` is written when ``epoch_id % update_freq == 0``, at the number of steps done so far. Validation results are written at the ``global_step_id`` their record
carries; ``val/<name>`` for the values a ``MetricUpdater`` stores under its default key
``monitor_obj``, ``val/<key>/<name>`` for other keys. (``val_metrics`` themselves are not read
between validations: they hold the previous validation's values until the next one runs; the
record holds exactly what their ``get()`` returned at the end of each validation.)

Cost: a loss, lr or metric is turned into a Python number (``.item()``, a device sync on a GPU)
only on steps that are written; on other steps the callback does one modulo and, to notice new
validation and StatsMonitor records, compares the two records in ``storage`` with the ones it
wrote, by identity.

Files: each run start adds one event file of scalars to ``save_dir``, a step's scalars as one
event written on the spot through tensorboardX's public ``EventsWriter`` (see
:mod:`hat_ignite.callbacks.tensorboard_scalars`), flushed at every epoch end (every point handed
over by then is on disk), every ``flush_secs`` and at the loop's end. A ``SummaryWriter`` (a
second file, a queue and a logger thread) is made only when something writes through it: a
``tb_update_funcs`` function taking ``writer`` (or ``**kwargs``), or code reading
:attr:`TensorBoard.writer` in a run. Names start with the creation time: name order is creation order. Under ``hat-train`` they end
with the stage (:attr:`TensorBoard.stage`), so stages sharing ``save_dir`` keep their own histories.

Processes: only rank 0 writes. Metric ``get()`` may be a collective under ``torch.distributed``,
so every rank computes the metric values at the same points and rank 0 writes them.

Order: attach it after ``Validation``, ``StatsMonitor`` and metric updaters (loggers last), so it
sees their records of the same step, epoch and loop end.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any, Callable, Sequence

import ignite.distributed as idist
import torch

from hat_ignite.callbacks.base import CallbackMixin
from hat_ignite.callbacks.late_metrics import LateMetricsWatch
from hat_ignite.callbacks.tensorboard_history import prepare_save_dir, resume_step_of, write_purge_marker
from hat_ignite.callbacks.tensorboard_scalars import StepScalars, summary_writer
from hat_ignite.callbacks.tensorboard_values import call_style, loss_scalars, scalar_number
from hat_ignite.metrics.base import metric_name_values
from hat_ignite.visualize.event_file import EVENT_FILE_GLOB, stage_suffix

__all__ = ["TensorBoard", "EVENT_FILE_GLOB", "loss_scalars", "resume_step_of", "write_purge_marker"]

logger = logging.getLogger(__name__)

_UPDATE_BY = ("step", "epoch")
_VALIDATION_KEY = "validation"  # hat_ignite.callbacks.validation.STORAGE_KEY
_STATS_KEY = "stats"  # hat_ignite.callbacks.stats_monitor.STORAGE_KEY
_DEFAULT_METRIC_KEY = "monitor_obj"  # MetricUpdater's default storage_key
_STATS_SKIP = frozenset({"epoch_id", "step_id", "global_step_id", "lr"})  # lr: see lr/group_<i>


class TensorBoard(CallbackMixin):
    """Write losses, learning rates, metrics and custom summaries for TensorBoard (rank 0).

    The tags, steps and costs are described in the module docstring. Open the result with
    ``tensorboard --logdir <save_dir>``; ``hat-curves`` draws it as a PNG.

    Args:
        save_dir: directory of the event files (created when the run begins).
        overwrite: remove the event files already in ``save_dir`` when a fresh run begins
            (other files there are left alone); otherwise a new event file is added beside them
            and TensorBoard shows them as one run. A resumed run (one that begins past step 0)
            never removes them: it keeps the history up to its checkpoint and drops the points the
            interrupted run wrote after it (TensorBoard's ``purge_step``).
        loss_name_reg: regex selecting the losses in ``model_outs`` by flattened key.
        update_freq: write every ``update_freq`` steps or epochs.
        update_by: ``"step"`` or ``"epoch"``, the unit of ``update_freq``.
        tb_update_funcs: functions called at every written point as
            ``func(writer=..., model_outs=..., step_id=..., **hook kwargs)`` to add anything
            else (images, histograms ...). A function that does not take ``**kwargs`` gets only
            the names it declares, so HAT's ``func(writer, model_outs, step_id)`` works as is.
            With ``update_by="step"`` they run after the written step's batch; with ``"epoch"``
            at the written epoch's end, with that epoch's last ``model_outs``.
        **tb_writer_kwargs: passed to ``tensorboardX.SummaryWriter`` (``max_queue`` ...);
            ``flush_secs``, ``filename_suffix``, ``purge_step`` and ``write_to_disk=False`` apply
            to the scalars file too (``purge_step`` to it alone).

    Example:
        >>> import tempfile
        >>> from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_regex
        >>> from hat_ignite.visualize.event_file import read_scalars
        >>> class Net(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.fc = torch.nn.Linear(3, 1)
        ...     def forward(self, x):
        ...         return {"mse_loss": (self.fc(x) ** 2).mean()}
        >>> model, tmp = Net(), tempfile.TemporaryDirectory()
        >>> trainer = Trainer(
        ...     model=model, data_loader=[torch.randn(5, 3) for _ in range(4)],
        ...     optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
        ...     batch_processor=BasicBatchProcessor(need_grad_update=True,
        ...                                         loss_collector=collect_loss_by_regex("^.*loss.*")),
        ...     device=None, num_epochs=3, callbacks=[TensorBoard(tmp.name, update_freq=2)])
        >>> _ = trainer.fit()
        >>> scalars = read_scalars(tmp.name)
        >>> sorted(scalars), [step for step, _ in scalars["loss/mse_loss"]]
        (['loss/mse_loss', 'lr/group_0'], [0, 2, 4, 6, 8, 10])
        >>> tmp.cleanup()
    """

    def __init__(
        self,
        save_dir: str,
        overwrite: bool = False,
        loss_name_reg: str = "^.*loss.*",
        update_freq: int = 1,
        update_by: str = "step",
        tb_update_funcs: Sequence[Callable[..., Any]] | None = None,
        **tb_writer_kwargs: Any,
    ) -> None:
        if not isinstance(save_dir, (str, os.PathLike)) or not os.fspath(save_dir):
            raise ValueError(f"TensorBoard: save_dir must be a directory path, got {save_dir!r}.")
        if isinstance(update_freq, bool) or not isinstance(update_freq, int) or update_freq < 1:
            raise ValueError(f"TensorBoard: update_freq must be an integer >= 1, got {update_freq!r}.")
        if update_by not in _UPDATE_BY:
            raise ValueError(f"TensorBoard: update_by must be 'step' or 'epoch', got {update_by!r}.")
        try:
            self.loss_pattern = re.compile(loss_name_reg)
        except (re.error, TypeError) as exc:
            raise ValueError(f"TensorBoard: loss_name_reg {loss_name_reg!r} is not a valid regex: {exc}.") from exc
        funcs = list(tb_update_funcs or [])
        bad = [i for i, f in enumerate(funcs) if not callable(f)]
        if bad:
            raise TypeError(
                f"TensorBoard: tb_update_funcs[{bad[0]}] is a {type(funcs[bad[0]]).__name__}, not a function; "
                f"give functions called as func(writer, model_outs, step_id, **kwargs)."
            )
        for key in ("logdir", "log_dir"):
            if key in tb_writer_kwargs:
                raise TypeError(f"TensorBoard: pass the directory as save_dir, not {key}.")
        self.save_dir = os.fspath(save_dir)
        self.overwrite = overwrite
        self.loss_name_reg = loss_name_reg
        self.update_freq = update_freq
        self.update_by = update_by
        self.tb_update_funcs = funcs
        self.tb_writer_kwargs = tb_writer_kwargs
        self._func_names = [call_style(f) for f in funcs]
        self._writing = False  # a loop runs and this process writes (rank 0)
        self._writer: Any = None  # the tensorboardX SummaryWriter, made on first use
        self._seen: dict[str, Any] = {}  # the storage records already written, by key
        #: Warns when ``state.metrics`` values changed after an epoch-wise write (see late_metrics).
        self._late = LateMetricsWatch("TensorBoard", "TensorBoard writes them one epoch late", logger=logger)
        self._epoch_sums: dict[str, torch.Tensor] = {}
        self._epoch_counts: dict[str, int] = {}
        self._last_outs: Any = None
        self._scalars: StepScalars | None = None  # the running loop's scalars file
        #: The ``hat-train`` stage of the run (``hat-train`` sets it; ``None``: no stage). A stage's
        #: event files end their names with it, and ``overwrite`` and a resume's purge concern that
        #: stage's files only, so stages sharing ``save_dir`` (HAT's ``ckpt_dir/tensorboard``) keep
        #: their own histories (see :func:`~hat_ignite.visualize.event_file.stage_suffix`).
        self.stage: str | None = None
        self._began = False  # a loop began, or the files were opened for hooks called without one

    # -- files -----------------------------------------------------------------------------
    @property
    def writer(self) -> Any:
        """The running loop's tensorboardX ``SummaryWriter`` (rank 0), made on first use; ``None``
        outside a run. Its events go to an event file of its own, beside the scalars file."""
        if self._writer is None and self._writing:
            self._writer = summary_writer(self.save_dir, self.tb_writer_kwargs, stage_suffix(self.stage))
        return self._writer

    @property
    def writer_if_made(self) -> Any:
        """The ``SummaryWriter`` if this run made one (reading it makes none), else ``None``."""
        return self._writer

    def _open(self, resume_step: int | None = None) -> None:
        """Open the run's scalars file (after :func:`.tensorboard_history.prepare_save_dir`)."""
        prepare_save_dir(self.save_dir, self.overwrite, resume_step, self.stage)
        kwargs = self.tb_writer_kwargs
        self._writing = True
        if kwargs.get("write_to_disk", True):
            suffix = (kwargs.get("filename_suffix") or "") + stage_suffix(self.stage)
            self._scalars = StepScalars(self.save_dir, kwargs.get("flush_secs"), suffix, kwargs.get("purge_step"))

    def close(self) -> None:
        """Close the run's event files now (the loop's end does it); a second call does nothing.

        Raises ``OSError`` when a file cannot take its last points (a full disk), after closing both.
        """
        self._writing = False
        scalars, writer, self._scalars, self._writer = self._scalars, self._writer, None, None
        try:
            if scalars is not None:
                scalars.close()
        finally:
            if writer is not None:
                writer.close()

    def _scalar(self, tag: str, value: Any, step: int) -> None:
        number = scalar_number(value)
        if number is not None and self._scalars is not None:
            self._scalars.add(tag, number, step)

    def _write_point(self, optimizer: Any, train_metrics: Any, step: int, loop: Any = None) -> None:
        """lr of each param group, the train metrics (metrics on every rank, see module doc) and
        the loop's ``state.metrics``."""
        pairs = metric_name_values(train_metrics) if train_metrics is not None else []
        if not self._writing:
            return
        engine_metrics = getattr(getattr(loop, "state", None), "metrics", None) or {}
        for name, value in engine_metrics.items():
            self._scalar(f"metrics/{name}", value, step)
        if self.update_by == "epoch":
            self._late.note_read(engine_metrics)
        for i, group in enumerate(getattr(optimizer, "param_groups", None) or []):
            self._scalar(f"lr/group_{i}", group.get("lr"), step)
        for name, value in pairs:
            if isinstance(value, list):
                for j, v in enumerate(value):
                    self._scalar(f"train/{name}/{j}", v, step)
            else:
                self._scalar(f"train/{name}", value, step)

    def _write_records(self, storage: Mapping[str, Any]) -> None:
        """Validation and StatsMonitor records that appeared since the last call."""
        if not self._writing:
            return
        record = storage.get(_VALIDATION_KEY)
        if isinstance(record, Mapping) and record is not self._seen.get(_VALIDATION_KEY):
            self._seen[_VALIDATION_KEY] = record
            step = int(record.get("global_step_id", 0))
            for key, value in (record.get("results") or {}).items():
                if isinstance(value, Mapping):
                    head = "val" if key == _DEFAULT_METRIC_KEY else f"val/{key}"
                    for name, v in value.items():
                        self._scalar(f"{head}/{name}", v, step)
                else:
                    self._scalar(f"val/{key}", value, step)
        stats = storage.get(_STATS_KEY)
        previous = self._seen.get(_STATS_KEY)
        if isinstance(stats, Mapping) and stats is not previous:
            self._seen[_STATS_KEY] = stats
            step = int(stats.get("global_step_id", 0))
            old = previous if isinstance(previous, Mapping) else {}
            for key, value in stats.items():
                if key not in _STATS_SKIP and (key not in old or old[key] != value):
                    self._scalar(f"stats/{key}", value, step)

    def _run_funcs(self, step: int, model_outs: Any, kwargs: dict[str, Any]) -> None:
        if not self._writing:
            return
        given = {**kwargs, "model_outs": model_outs, "step_id": step}
        for func, names in zip(self.tb_update_funcs, self._func_names):
            if names is None or "writer" in names:  # the SummaryWriter is made for a function that takes it
                given["writer"] = self.writer
            func(**(given if names is None else {k: v for k, v in given.items() if k in names}))

    # -- hooks -----------------------------------------------------------------------------
    def overridden_hooks(self) -> list[str]:
        """The hooks to attach: no per-epoch accumulator reset when writing by step."""
        hooks = super().overridden_hooks()
        return hooks if self.update_by == "epoch" else [h for h in hooks if h != "on_epoch_begin"]

    def _open_without_loop(self) -> None:
        """Open the files for hooks called with no ``on_loop_begin`` first (HAT's tests, a custom
        loop); once, on rank 0."""
        self._began = True
        if idist.get_rank() == 0:
            self._open(None)

    def on_loop_begin(self, storage: dict[str, Any] | None = None, loop: Any = None, **kwargs: Any) -> None:
        self._began = True
        storage = {} if storage is None else storage
        self.close()
        self._seen = {key: storage.get(key) for key in (_VALIDATION_KEY, _STATS_KEY)}
        if idist.get_rank() == 0:
            self._open(resume_step_of(loop))
            self._late.start(loop)

    def on_epoch_begin(self, **kwargs: Any) -> None:
        self._epoch_sums, self._epoch_counts, self._last_outs = {}, {}, None

    def hook_methods(self) -> dict[str, Callable[..., Any]]:
        """The hooks to attach; without ``tb_update_funcs`` the batch-end hook takes no ``**kwargs``.

        The keywords a batch end passes on are only for the update functions, so without any the
        hook is attached as :meth:`_on_batch_end_losses_only`, for which no keyword dict is built.
        """
        methods = super().hook_methods()
        if not self.tb_update_funcs and "on_batch_end" in methods:
            methods["on_batch_end"] = self._on_batch_end_losses_only
        return methods

    def _on_batch_end_losses_only(self, model_outs: Any, epoch_id: int, global_step_id: int) -> None:
        if self.update_by == "step" and global_step_id % self.update_freq:
            return  # not a step to write: decided here, without a second call
        self.on_batch_end(model_outs, epoch_id=epoch_id, global_step_id=global_step_id)

    def on_batch_end(self, model_outs: Any, epoch_id: int | None = None, global_step_id: int = 0,
                     **kwargs: Any) -> None:
        """Write (or, by epoch, add up) the batch's losses and run the update functions.

        ``epoch_id`` is optional: HAT's loop passes only ``model_outs`` and ``global_step_id``
        here, and without it an epoch-wise TensorBoard adds up every batch.
        """
        if not self._began:
            self._open_without_loop()
        if not self._writing:
            return
        if self.update_by == "step":
            if global_step_id % self.update_freq:
                return
            for name, value in loss_scalars(model_outs, self.loss_pattern).items():
                self._scalar(f"loss/{name}", value, global_step_id)
            if self.tb_update_funcs:
                ids = {"epoch_id": epoch_id, "global_step_id": global_step_id}
                self._run_funcs(global_step_id, model_outs, {**ids, **kwargs})
            return
        if epoch_id is not None and epoch_id % self.update_freq:
            return
        for name, value in loss_scalars(model_outs, self.loss_pattern).items():
            value = value.detach().float().sum()
            self._epoch_sums[name] = self._epoch_sums[name] + value if name in self._epoch_sums else value
            self._epoch_counts[name] = self._epoch_counts.get(name, 0) + 1
        if self.tb_update_funcs:
            self._last_outs = model_outs

    def on_step_end(
        self, global_step_id: int, storage: dict[str, Any] | None = None, optimizer: Any = None,
        train_metrics: Any = None, loop: Any = None, **kwargs: Any,
    ) -> None:
        storage = {} if storage is None else storage
        if self.update_by == "step" and global_step_id % self.update_freq == 0:
            self._write_point(optimizer, train_metrics, global_step_id, loop)
        seen = self._seen  # a record already written is the very object still in storage: skip it
        if self._writing and (
            storage.get(_VALIDATION_KEY) is not seen.get(_VALIDATION_KEY)
            or storage.get(_STATS_KEY) is not seen.get(_STATS_KEY)
        ):
            self._write_records(storage)
        if self._scalars is not None and self._scalars.pending:
            self._scalars.write()

    def on_epoch_end(
        self, epoch_id: int, global_step_id: int | None = None, storage: dict[str, Any] | None = None,
        optimizer: Any = None, train_metrics: Any = None, loop: Any = None, **kwargs: Any,
    ) -> None:
        """Write an epoch-wise point; hand every point so far to disk.

        ``global_step_id`` and ``storage`` are optional (HAT's loop passes only ``epoch_id``
        here): the point is then written at ``epoch_id``.
        """
        if not self._began:
            self._open_without_loop()
        storage = {} if storage is None else storage
        if global_step_id is None:
            global_step_id = epoch_id
        if self.update_by == "epoch" and epoch_id % self.update_freq == 0:
            if self._writing:
                for name, total in self._epoch_sums.items():
                    self._scalar(f"loss/{name}", total / self._epoch_counts[name], global_step_id)
            self._write_point(optimizer, train_metrics, global_step_id, loop)
            if self.tb_update_funcs:
                self._run_funcs(global_step_id, self._last_outs, {
                    "epoch_id": epoch_id, "global_step_id": global_step_id, "storage": storage,
                    "optimizer": optimizer, "train_metrics": train_metrics, "loop": loop, **kwargs,
                })
            self._epoch_sums, self._epoch_counts, self._last_outs = {}, {}, None
        self._write_records(storage)
        if self._scalars is not None:  # every point handed over so far is on disk
            self._scalars.flush()
        if self._writer is not None:
            self._writer.flush()

    def on_loop_end(self, storage: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self._late.stop()
        self._write_records({} if storage is None else storage)
        self.close()

    def __repr__(self) -> str:
        return (
            f"TensorBoard(save_dir={self.save_dir!r}, update_freq={self.update_freq}, "
            f"update_by={self.update_by!r}, loss_name_reg={self.loss_name_reg!r})"
        )
