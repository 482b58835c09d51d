"""`Checkpoint`: periodic, last and best checkpoints, written crash-safely by rank 0.

Files in ``save_dir`` (``{p}`` is ``name_prefix``, ``{h}`` the first 8 hex digits of the
content hash, present when ``save_hash``)::

    {p}checkpoint-epoch-0003-{h}.pth.tar   every save_interval epochs (0-based epoch_id)
    {p}checkpoint-step-119-{h}.pth.tar     every save_interval steps (0-based global_step_id)
    {p}checkpoint-last.pth.tar             the newest save point (and the end of training)
    {p}checkpoint-best.pth.tar             the save point with the best monitored metric

``last`` and ``best`` are complete checkpoints, not pointer files, so HAT configs that load
``float-checkpoint-last.pth.tar`` keep working: each is a hard link to the periodic file just
written (a copy where the file system has no hard links), swapped in with one atomic rename.
A save point writes the periodic file (temp file, fsync, rename, directory fsync), then
``last``, then ``best``, and only then deletes superseded files, so a crash at any moment leaves
the previous checkpoints loadable. Before each write the NaN/Inf flags of updates still in
flight are read (``loop.settle_updates()``): an update the guard skipped on the device raises
:class:`~hat_ignite.errors.NonFiniteLossError` naming its step, and nothing is written, so no
checkpoint holds a step whose update was skipped. The periodic file records the best value and
the step it was reached at; a run that resumes from it first brings ``last`` and ``best`` up to that record
(:mod:`~hat_ignite.checkpoint.reconcile`), so a kill between the writes never leaves them stale. What a checkpoint holds is listed in
:mod:`~hat_ignite.checkpoint.payload`; how it is verified on load in :mod:`~hat_ignite.checkpoint.loading`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Sequence

import ignite.distributed as idist
import torch

from hat_ignite.callbacks.base import CallbackMixin
from hat_ignite.callbacks.checkpoint_best import BestMetricMixin
from hat_ignite.callbacks.late_metrics import LateMetricsWatch
from hat_ignite.checkpoint.atomic import PathLike, atomic_link, atomic_save, is_temp_file
from hat_ignite.checkpoint.hashing import HASH_KEY, with_content_hash
from hat_ignite.checkpoint.files import (
    NAME_HASH,
    checkpoint_number,
    latest_valid_checkpoint,
    list_checkpoints,
    resume_marks,
    weights_finite,
)
from hat_ignite.checkpoint.keywords import KeywordsLoop
from hat_ignite.checkpoint.payload import training_state, unwrap_model
from hat_ignite.checkpoint.reconcile import reconcile
from hat_ignite.checkpoint.rotation import rotate
from hat_ignite.errors import CheckpointError

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["Checkpoint", "list_checkpoints", "latest_valid_checkpoint"]

logger = logging.getLogger(__name__)

_MODES = ("max", "min")
_KINDS = ("epoch", "step")


class Checkpoint(BestMetricMixin, CallbackMixin):
    """Save checkpoints during training, so training can resume or be evaluated later.

    Args:
        save_dir: directory for the checkpoint files (created when needed).
        name_prefix: prefix of every file name, e.g. ``"float-"``.
        save_interval: save every this many epochs or steps.
        interval_by: ``"epoch"`` (save on epoch end) or ``"step"`` (save on step end).
        save_on_train_end: also update ``last`` when the loop ends (stopping by epoch or by
            step), unless the final save point already wrote it.
        strict_match: when the best checkpoint takes its weights from ``loop.ema_model``,
            require the EMA model's state-dict keys to equal the training model's.
        mode: ``"max"`` or ``"min"`` to keep a ``best`` checkpoint of the monitored metric;
            ``None`` keeps none.
        monitor_metric_key: name of the monitored metric: looked up in ``best_refer_metric``'s
            names, else read from the loop's ``storage`` (``storage[key]``, or
            ``storage[name][key]`` as validation stores ``storage["monitor_obj"]["accuracy"]``),
            else from the loop's ``state.metrics`` (where Ignite metrics such as ``RunningAverage``
            put theirs), else looked up in ``val_metrics``' names.
        best_refer_metric: metric object(s) whose ``get()`` returns ``(names, values)`` to
            monitor, or a metric config.
        task_sampler: HAT's multitask sampler. Merging per-task buffers across ranks is not
            supported: a parallel sampler in a multi-process run is refused at loop begin; in
            one process there is nothing to merge.
        save_hash: put the first 8 hex digits of the content hash in periodic file names.
        only_save_ddp: with submodules wrapped in DDP each on its own (the DDP trainer's
            ``convert_submodule_list``), save only their weights (keys ``backbone.fc.weight``);
            a model without such submodules is saved whole. Loading such a file into the whole
            model needs ``allow_miss=True``.
        keep_n: keep only the newest ``keep_n`` periodic files (``None``: keep all).

    The best checkpoint is considered at each save point; when the loop has an EMA model, the
    ``best`` file's ``state_dict`` holds the EMA weights (as in HAT). Only rank 0 writes.
    Place it after the callbacks that produce the monitored value (validation).

    Example:
        >>> ckpt = Checkpoint("ckpts", name_prefix="float-", mode="max", monitor_metric_key="acc")
        >>> os.path.basename(ckpt.last_path), ckpt.periodic_name("epoch", 3, "1a2b3c4d5e")
        ('float-checkpoint-last.pth.tar', 'float-checkpoint-epoch-0003-1a2b3c4d.pth.tar')
    """

    def __init__(
        self,
        save_dir: PathLike,
        name_prefix: str | None = "",
        save_interval: int | None = 1,
        interval_by: str | None = "epoch",
        save_on_train_end: bool | None = True,
        strict_match: bool | None = False,
        mode: str | None = None,
        monitor_metric_key: str | None = None,
        best_refer_metric: Any = None,
        task_sampler: Any = None,
        save_hash: bool = True,
        only_save_ddp: bool = False,
        keep_n: int | None = None,
    ) -> None:
        if isinstance(save_interval, bool) or not isinstance(save_interval, int) or save_interval < 1:
            raise ValueError(f"Checkpoint(save_interval={save_interval!r}): give a positive integer.")
        interval_by = (interval_by or "epoch").lower()
        if interval_by not in _KINDS:
            raise ValueError(f"Checkpoint(interval_by={interval_by!r}): use 'epoch' or 'step'.")
        if mode is not None and mode not in _MODES:
            raise ValueError(f"Checkpoint(mode={mode!r}): use 'max', 'min', or None for no best checkpoint.")
        if keep_n is not None and (isinstance(keep_n, bool) or not isinstance(keep_n, int) or keep_n < 1):
            raise ValueError(f"Checkpoint(keep_n={keep_n!r}): give a positive integer, or None to keep every file.")
        self.save_dir = os.fspath(save_dir)
        self.name_prefix = name_prefix or ""
        self.save_interval = save_interval
        self.interval_by = interval_by
        self.save_on_train_end = bool(save_on_train_end)
        self.strict_match = bool(strict_match)
        self.mode = mode
        self.monitor_metric_key = monitor_metric_key
        if isinstance(best_refer_metric, dict) and "type" in best_refer_metric:
            from hat_ignite.engine.loop import build_if_config

            best_refer_metric = build_if_config(best_refer_metric, "best_refer_metric")
        if best_refer_metric is not None and not isinstance(best_refer_metric, (list, tuple)):
            best_refer_metric = [best_refer_metric]
        self.best_refer_metric: Sequence[Any] | None = best_refer_metric
        self.task_sampler = task_sampler
        self.save_hash = save_hash
        self.only_save_ddp = bool(only_save_ddp)
        self.keep_n = keep_n
        self.best: float | None = None
        self._best_iteration: int | None = None  # steps done at the save point that reached ``best``
        self._restored = False  # load_state_dict ran since the last loop begin (a resume)
        self._saved_iteration: int | None = None
        self._saved_epoch_open = False  # that saved state was taken before its epoch's end hooks ran
        self._warned_missing = False
        self._missing_names: list[str] = []  # metric names seen while the monitored key was missing
        # Rotation never deletes these: the file the run resumed from, the newest finite one.
        self._resumed_hashes: set[str] = set()
        self._resumed_numbers: set[tuple[str, int]] = set()
        self._last_finite: str | None = None
        #: Warns when the monitored value in ``state.metrics`` was set after the read (see late_metrics).
        watched = mode is not None and best_refer_metric is None and bool(monitor_metric_key)
        self._lag = LateMetricsWatch(
            f"Checkpoint(monitor_metric_key={monitor_metric_key!r})", "the best checkpoint follows the previous "
            "epoch's value", key=monitor_metric_key, logger=logger,
        ) if watched else None

    # -- file names ---------------------------------------------------------------------------
    def _path(self, name: str) -> str:
        return os.path.join(os.path.abspath(self.save_dir), name)

    @property
    def last_path(self) -> str:
        """Absolute path of the ``last`` checkpoint."""
        return self._path(f"{self.name_prefix}checkpoint-last.pth.tar")

    @property
    def best_path(self) -> str:
        """Absolute path of the ``best`` checkpoint."""
        return self._path(f"{self.name_prefix}checkpoint-best.pth.tar")

    def periodic_name(self, kind: str, number: int, digest: str) -> str:
        """File name of a periodic checkpoint: ``kind`` is ``"epoch"`` or ``"step"``."""
        counter = f"{number:04d}" if kind == "epoch" else str(number)
        suffix = f"-{digest[:8]}" if self.save_hash else ""
        return f"{self.name_prefix}checkpoint-{kind}-{counter}{suffix}.pth.tar"

    # -- hooks -------------------------------------------------------------------------------
    def overridden_hooks(self) -> list[str]:
        """The hooks attached: only the step-end or epoch-end hook that ``interval_by`` saves on."""
        unused = "on_epoch_end" if self.interval_by == "step" else "on_step_end"
        return [hook for hook in super().overridden_hooks() if hook != unused]

    def on_loop_begin(self, loop: LoopBase | None = None, **kwargs: Any) -> None:
        self._saved_iteration, self._saved_epoch_open = None, False
        self._warned_missing = False
        self._missing_names = []
        self._last_finite = None
        if self._lag is not None and self.interval_by == "epoch":
            self._lag.start(loop)
        resumed = getattr(loop, "checkpoint", None)
        self._resumed_hashes, self._resumed_numbers = resume_marks(resumed)
        restored, self._restored = self._restored, False
        progress = resumed.get("progress") if restored and isinstance(resumed, Mapping) else None
        if loop is None or not (isinstance(progress, Mapping) and progress.get("iteration") == loop.state.iteration):
            resumed = None  # not a resume of this run's progress: nothing to bring up to date
        else:
            self._saved_iteration = loop.state.iteration  # that state is saved: the loop end need not save it
            data = resumed.get("data") if isinstance(resumed, Mapping) else None
            self._saved_epoch_open = bool(isinstance(data, Mapping) and data.get("epoch_open"))
        sampler = self.task_sampler
        if sampler is not None and idist.get_world_size() > 1 and getattr(sampler, "is_parallel", lambda: False)():
            raise ValueError(
                "Checkpoint(task_sampler=...): merging per-task buffers across ranks before saving "
                "is not supported. Remove task_sampler from the Checkpoint config."
            )
        if not self._is_writer():
            return
        os.makedirs(self.save_dir, exist_ok=True)
        stale = [
            name for name in os.listdir(self.save_dir)
            if is_temp_file(name) and name.startswith(f".{self.name_prefix}checkpoint-")
        ]
        for name in stale:
            os.remove(self._path(name))
        if stale:
            logger.warning("Removed %d temporary file(s) of an interrupted checkpoint write in %s: %s",
                           len(stale), os.path.abspath(self.save_dir), ", ".join(stale))
        if resumed is not None:
            reconcile(self.save_dir, self.name_prefix, self.last_path, self.best_path if self.mode else None,
                      resumed, self._best_iteration, self._write_best)

    def on_step_end(self, epoch_id: int, global_step_id: int, storage: Any = None, val_metrics: Any = None,
                    loop: LoopBase | None = None, **kwargs: Any) -> None:
        """Save every ``save_interval`` steps (``interval_by="step"``).

        Without ``loop`` (HAT's loop, a custom loop), the checkpoint is made from the keywords
        given: ``model``, ``ema_model``, ``optimizer`` (see :class:`~hat_ignite.checkpoint.keywords.KeywordsLoop`).
        """
        if self.interval_by == "step" and (global_step_id + 1) % self.save_interval == 0:
            source: Any = loop if loop is not None else KeywordsLoop(
                kwargs.get("model"), kwargs.get("ema_model"), kwargs.get("optimizer"), epoch_id, global_step_id,
                storage, num_steps=kwargs.get("num_steps"),
            )
            self.save_point(source, "step", global_step_id, epoch_id, global_step_id, storage, val_metrics)

    def on_epoch_end(self, epoch_id: int, global_step_id: int, storage: Any = None, val_metrics: Any = None,
                     loop: LoopBase | None = None, **kwargs: Any) -> None:
        """Save every ``save_interval`` epochs (``interval_by="epoch"``); ``loop`` as in :meth:`on_step_end`."""
        if self.interval_by == "epoch" and (epoch_id + 1) % self.save_interval == 0:
            source: Any = loop if loop is not None else KeywordsLoop(
                kwargs.get("model"), kwargs.get("ema_model"), kwargs.get("optimizer"), epoch_id, global_step_id,
                storage, num_epochs=kwargs.get("num_epochs"),
            )
            self.save_point(source, "epoch", epoch_id, epoch_id, global_step_id, storage, val_metrics)

    def on_loop_end(self, epoch_id: int, global_step_id: int, loop: LoopBase | None = None,
                    storage: Any = None, **kwargs: Any) -> None:
        """Save ``last`` (``save_on_train_end``); ``loop`` as in :meth:`on_step_end`."""
        source: Any = loop if loop is not None else KeywordsLoop(
            kwargs.get("model"), kwargs.get("ema_model"), kwargs.get("optimizer"), epoch_id, global_step_id, storage,
        )
        if self._lag is not None:
            self._lag.stop()
        self._save_at_loop_end(source, epoch_id, global_step_id, storage, kwargs.get("val_metrics"))
        self._check_best_written()

    def _save_at_loop_end(self, source: Any, epoch_id: int, global_step_id: int, storage: Any = None,
                          val_metrics: Any = None) -> None:
        """Write ``last`` unless the final save point wrote this very state.

        A save point at the last step (``interval_by="step"``) comes before that epoch's end hooks
        (validation, the closing of the epoch); the state after them is what the run ends with,
        so it is written here, and, as at a save point, the monitored value (the last
        validation's) is considered for ``best``.
        """
        if not self.save_on_train_end:
            return
        source.settle_updates()  # every rank: a skipped update raises on all of them
        state = source.state
        epoch_open = bool(getattr(state, "epoch_open", False))
        if self._saved_iteration == state.iteration and self._saved_epoch_open == epoch_open:
            return  # the final save point already wrote this state
        is_best = self._update_best(storage, val_metrics, getattr(state, "metrics", None), quiet=True)
        if is_best:
            self._best_iteration = int(state.iteration)
        self._saved_iteration, self._saved_epoch_open = state.iteration, epoch_open
        if not self._is_writer():
            return
        os.makedirs(self.save_dir, exist_ok=True)  # a hook called with no on_loop_begin first
        payload = with_content_hash(self._training_state(source, epoch_id, global_step_id))
        path = atomic_save(payload, self.last_path)
        if is_best:
            self._write_best(payload, path)
        best = f" (new best {self.monitor_metric_key or 'metric'}={self.best:.6g})" if is_best else ""
        logger.info("Saved checkpoint %s at the end of training%s.", path, best)

    def save_resume_point(self, loop: LoopBase) -> str | None:
        """Write a resumable checkpoint of the state right after the step that just ended.

        The loop calls this when it stops on request (``loop.request_stop()``, e.g. on SIGTERM):
        a step file as a step-interval save point writes it, and ``last`` pointing at it.
        Nothing is written twice when this step was already saved. It never changes ``best``:
        a straight run has no save point here, so a validation result not yet judged stays for
        the next save point of the schedule (the resumed run's ``Validation`` puts it back into
        the storage), and a stop cannot change which checkpoint is best.

        Returns:
            The file's absolute path (``None`` on ranks other than 0).
        """
        state = loop.state
        if self._saved_iteration == state.iteration and (not self._is_writer() or os.path.exists(self.last_path)):
            return self.last_path if self._is_writer() else None
        step = state.iteration - 1
        return self.save_point(loop, "step", step, max(state.epoch - 1, 0), step, state.storage, loop.val_metrics,
                               judge_best=False)

    # -- saving ------------------------------------------------------------------------------
    def save_point(self, loop: LoopBase, kind: str, number: int, epoch_id: int, global_step_id: int,
                   storage: Any = None, val_metrics: Any = None, judge_best: bool = True) -> str | None:
        """Write a periodic checkpoint, update ``last`` (and ``best``), then rotate old files.

        ``judge_best=False`` (a resume point written on a stop) leaves ``best`` as it is.

        Returns:
            The periodic file's absolute path (``None`` on ranks other than 0).
        """
        loop.settle_updates()  # before anything is written: never a checkpoint of a skipped update
        is_best = judge_best and self._update_best(storage, val_metrics, getattr(loop.state, "metrics", None))
        if is_best:
            self._best_iteration = int(loop.state.iteration)
        # every rank notes the saved state, so all take the same decision at the loop end
        self._saved_iteration = loop.state.iteration
        self._saved_epoch_open = bool(getattr(loop.state, "epoch_open", False))
        if not self._is_writer():
            return None
        os.makedirs(self.save_dir, exist_ok=True)
        payload = with_content_hash(self._training_state(loop, epoch_id, global_step_id))
        path = atomic_save(payload, self._path(self.periodic_name(kind, number, payload[HASH_KEY])))
        atomic_link(path, self.last_path)
        if is_best:
            self._write_best(payload, path)
        if weights_finite(payload["state_dict"]):
            self._last_finite = path
        else:
            logger.warning(
                "Checkpoint %s holds NaN/Inf weights; rotation keeps %s, the newest checkpoint with "
                "finite weights.", path, self._last_finite or "no earlier file of this run",
            )
        best = f" (new best {self.monitor_metric_key or 'metric'}={self.best:.6g})" if is_best else ""
        logger.info("Saved checkpoint %s%s.", path, best)
        rotate(self.save_dir, self.name_prefix, kind, number, path, self.keep_n, self._keep_reason)
        return path

    def _training_state(self, loop: LoopBase, epoch_id: int, global_step_id: int) -> dict[str, Any]:
        state = training_state(loop, epoch_id, global_step_id)
        if self.only_save_ddp:
            model = unwrap_model(loop.model)
            wrapped = [n for n, m in model.named_children() if isinstance(m, torch.nn.parallel.DistributedDataParallel)]
            if wrapped:
                state["state_dict"] = {k: v for k, v in state["state_dict"].items()
                                       if any(k.startswith(f"{n}.") for n in wrapped)}
        return state

    def _write_best(self, payload: Mapping[str, Any], path: str | None) -> None:
        """Write ``best`` from ``payload``: a link to ``path``, the file holding it (``None``: a
        copy is written), or, with an EMA model, a file of its own with the EMA weights."""
        ema = payload.get("ema_state_dict")
        if ema is None:
            if path is None:
                atomic_save(dict(payload), self.best_path)
            else:
                atomic_link(path, self.best_path)
            return
        if self.strict_match and list(ema) != list(payload["state_dict"]):
            diff = sorted(set(ema) ^ set(payload["state_dict"]))
            raise CheckpointError(
                f"Cannot write {self.best_path}: strict_match=True and the EMA model's state-dict "
                f"keys differ from the training model's ({len(diff)} differ, e.g. {diff[:3]}). "
                f"Build the EMA model from the training model, or set strict_match=False."
            )
        best = dict(payload, state_dict=ema, ema_state_dict=None)
        atomic_save(with_content_hash(best), self.best_path)

    def _keep_reason(self, kind: str, path: str) -> str | None:
        """Why rotation must not delete ``path`` (``None``: it may)."""
        if path == self._last_finite:
            return "it is the newest checkpoint with finite weights"
        match = NAME_HASH.search(os.path.basename(path))
        if match:
            return "the run resumed from it" if match.group(2) in self._resumed_hashes else None
        number = checkpoint_number(os.path.basename(path))
        return "the run resumed from it" if (kind, number) in self._resumed_numbers else None

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The best monitored value so far and the steps done when it was reached (saved in each
        checkpoint, restored on resume, where ``best`` is brought up to it)."""
        return {"best": self.best, "mode": self.mode, "best_iteration": self._best_iteration}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the best value; a checkpoint of another ``mode`` is refused."""
        if state_dict.get("mode") != self.mode and state_dict.get("best") is not None:
            raise ValueError(
                f"Checkpoint state was saved with mode={state_dict.get('mode')!r}, this callback "
                f"has mode={self.mode!r}; their best values cannot be compared."
            )
        best = state_dict.get("best")
        self.best = None if best is None else float(best)
        best_iteration = state_dict.get("best_iteration")
        self._best_iteration = None if best_iteration is None else int(best_iteration)
        self._restored = True

    @staticmethod
    def _is_writer() -> bool:
        return idist.get_rank() == 0

    def __repr__(self) -> str:
        return (
            f"Checkpoint(save_dir={self.save_dir!r}, name_prefix={self.name_prefix!r}, "
            f"interval_by={self.interval_by!r})"
        )

