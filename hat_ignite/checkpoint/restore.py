"""Putting a checkpoint back: model weights, or a whole training state.

:func:`load_model_weights` copies weights into a model and refuses the checkpoint of another
model; :func:`resume_from` / :func:`restore_training_state` restore optimizer, progress, callback
states and random generators into a loop; :class:`LoadCheckpoint` is the ``model -> model``
converter HAT configs put in ``model_convert_pipeline``. Files are read with
:func:`~hat_ignite.checkpoint.loading.load_checkpoint` (weights-only, hash verified); what they hold is listed
in :mod:`~hat_ignite.checkpoint.payload`.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable

import ignite.distributed as idist
import torch
from torch import nn

from hat_ignite.checkpoint.atomic import PathLike
from hat_ignite.checkpoint.loading import load_checkpoint
from hat_ignite.checkpoint.optimizer_state import load_optimizer_state
from hat_ignite.checkpoint.payload import set_rng_state, stateful_callbacks, unwrap_model
from hat_ignite.checkpoint.progress import check_schedule, rebase_schedules
from hat_ignite.errors import CheckpointError

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["load_model_weights", "restore_training_state", "resume_from", "check_world_size", "LoadCheckpoint"]

logger = logging.getLogger(__name__)

_MAX_LISTED = 5


def _listed(keys: list[str]) -> str:
    shown = ", ".join(keys[:_MAX_LISTED])
    return shown + (f" (+{len(keys) - _MAX_LISTED} more)" if len(keys) > _MAX_LISTED else "")


def _model_weights(checkpoint: Any, path: str) -> Mapping[str, Any]:
    if isinstance(checkpoint, Mapping):
        weights = checkpoint.get("state_dict")
        if isinstance(weights, Mapping):
            return weights
        if checkpoint and all(isinstance(v, torch.Tensor) for v in checkpoint.values()):
            return checkpoint  # a bare state_dict saved with torch.save(model.state_dict())
    keys = [str(k) for k in checkpoint] if isinstance(checkpoint, Mapping) else []
    raise CheckpointError(
        f"Checkpoint {path} holds no model weights: expected a 'state_dict' entry or a bare "
        f"state dict of tensors, found {type(checkpoint).__name__} with keys [{_listed(keys)}]."
    )


def _shape_differs(saved: Any, current: Any) -> bool:
    return isinstance(saved, torch.Tensor) and isinstance(current, torch.Tensor) and saved.shape != current.shape


def load_model_weights(
    model: nn.Module,
    checkpoint: Any,
    path: PathLike,
    allow_miss: bool = False,
    ignore_extra: bool = False,
    verbose: bool = False,
    state_dict_update_func: Callable[[dict], dict] | None = None,
    key: str = "state_dict",
    ignore_tensor_shape: bool = False,
) -> nn.Module:
    """Copy a loaded checkpoint's weights into ``model``, checking that they fit.

    Args:
        model: the model (a DDP/DataParallel wrapper is looked through).
        checkpoint: a loaded checkpoint dict, or a bare state dict.
        path: the checkpoint's path, named in errors.
        allow_miss: accept model entries the checkpoint lacks (they keep their values).
        ignore_extra: accept checkpoint entries the model lacks (they are dropped).
        verbose: log the missing and extra keys even when they are accepted.
        state_dict_update_func: applied to the weights before loading (rename keys, ...).
        key: the checkpoint entry holding the weights (``"ema_state_dict"`` for EMA weights).
        ignore_tensor_shape: skip the tensors whose shape differs from the model's (a new
            classification head, say): the model keeps its own values for them, the other
            tensors are loaded, and a warning names the skipped ones. Such tensors count as
            neither missing nor extra.

    Returns:
        ``model``.

    Raises:
        CheckpointError: shapes differ (without ``ignore_tensor_shape``), or keys are
            missing/extra and not allowed — usually the checkpoint of another model. Names the
            path and the first offending keys.
    """
    path = os.path.abspath(os.fspath(path))
    source = _model_weights(checkpoint, path) if key == "state_dict" else checkpoint[key]
    metadata = getattr(source, "_metadata", None)
    weights = dict(source)
    if state_dict_update_func is not None:
        updated = state_dict_update_func(weights)
        metadata = getattr(updated, "_metadata", metadata)
        weights = dict(updated)
    target = unwrap_model(model)
    own = target.state_dict()
    if weights and all(k.startswith("module.") for k in weights) and not any(k.startswith("module.") for k in own):
        weights = {k[len("module."):]: v for k, v in weights.items()}
        metadata = _renamed_metadata(metadata, lambda k: "" if k == "module" else k[len("module."):])
    if any("_orig_mod." in k for k in weights) and not any("_orig_mod." in k for k in own):
        weights = {k.replace("_orig_mod.", ""): v for k, v in weights.items()}  # saved from torch.compile(model)
        metadata = _renamed_metadata(
            metadata, lambda k: "" if k == "_orig_mod" else k.replace("_orig_mod.", "").replace("._orig_mod", ""),
        )
    if isinstance(checkpoint, Mapping) and checkpoint.get("prepared_modules"):
        from hat_ignite.quantization.observer_match import align_observers

        # a model prepared from another graph (HAT's deploy model): each observer's saved range
        # where it belongs, not where its number points
        weights = align_observers(target, weights, checkpoint["prepared_modules"], path, allow_miss=allow_miss)
    missing = [k for k in own if k not in weights]
    extra = [k for k in weights if k not in own]
    shapes = [
        f"{k}: checkpoint {tuple(weights[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in weights and _shape_differs(weights[k], own[k])
    ]
    if shapes and ignore_tensor_shape:
        logger.warning(
            "Loading %s into %s: %d tensor(s) of another shape skipped (ignore_tensor_shape=True), the model keeps "
            "its own values for them: %s", path, type(target).__name__, len(shapes), "; ".join(shapes),
        )
        for k in [k for k in own if k in weights and _shape_differs(weights[k], own[k])]:
            del weights[k]
        shapes = []
    problems = []
    if shapes:
        problems.append(f"{len(shapes)} shape mismatch(es) [{_listed(shapes)}]")
    if missing and not allow_miss:
        problems.append(f"{len(missing)} model key(s) missing from the checkpoint [{_listed(missing)}]")
    if extra and not ignore_extra:
        problems.append(f"{len(extra)} checkpoint key(s) the model does not have [{_listed(extra)}]")
    if problems:
        raise CheckpointError(
            f"Checkpoint {path} ({key}) does not fit {type(target).__name__}: {'; '.join(problems)}. "
            f"Is it the checkpoint of another model? Load the right file, or pass allow_miss=True / "
            f"ignore_extra=True to load the matching part (and ignore_tensor_shape=True to skip tensors of "
            f"another shape)."
        )
    if verbose and (missing or extra):
        logger.info("Loading %s into %s: missing %s; extra %s", path, type(target).__name__, missing, extra)
    kept = OrderedDict((k, v) for k, v in weights.items() if k in own)
    if metadata is not None:
        # the modules' state-dict versions: without them torch treats every entry as written by
        # the oldest version, and an observer's eps is silently reset to torch's default
        kept._metadata = metadata  # type: ignore[attr-defined]
    target.load_state_dict(kept, strict=False)
    return model


def _renamed_metadata(metadata: Any, rename: Callable[[str], str]) -> Any:
    """A state dict's ``_metadata`` (module path -> version info) with its module paths renamed."""
    if metadata is None:
        return None
    return OrderedDict((rename(k), v) for k, v in metadata.items())


def restore_training_state(
    loop: LoopBase, checkpoint: Mapping[str, Any], path: PathLike, load_model: bool = True
) -> dict[str, list[str]]:
    """Put a loaded checkpoint back into ``loop``; log what was and was not restored.

    Always: the model weights (if ``load_model``) and the EMA weights (when both the
    checkpoint and ``loop.ema_model`` have them). With ``loop.resume_optimizer``: the optimizer
    and the grad scaler. With ``loop.resume_epoch_or_step``: the progress (``loop.start_epoch`` /
    ``loop.start_step``, so ``fit()`` continues after the saved step), the callback states and the
    random generators. The checkpoint is also kept as ``loop.checkpoint`` for callbacks that
    restore themselves later (an EMA callback creating ``ema_model`` at loop begin, say).

    Args:
        loop: the built loop to restore into.
        checkpoint: the loaded checkpoint (a dict as :func:`~hat_ignite.checkpoint.loading.load_checkpoint` returns).
        path: the file it was loaded from (named in messages).
        load_model: also copy the model weights (``False`` when a converter loaded them already).

    Returns:
        ``{"restored": [...], "skipped": ["what (why)", ...]}``.

    Raises:
        CheckpointError: the weights, optimizer or a callback state do not fit; names the path.
    """
    path = os.path.abspath(os.fspath(path))
    restored: list[str] = []
    skipped: list[str] = []
    if load_model:
        load_model_weights(loop.model, checkpoint, path)
        restored.append("model")
    if checkpoint.get("ema_state_dict") is not None:
        if loop.ema_model is not None:
            load_model_weights(loop.ema_model, checkpoint, path, key="ema_state_dict")
            restored.append("ema_model")
        else:
            skipped.append("ema_model (the loop has no ema_model yet; it stays in loop.checkpoint)")
    changed = _restore_optimizer(loop, checkpoint, path, restored, skipped)
    _restore_progress(loop, checkpoint, path, restored, skipped)
    rebase_schedules(loop.callbacks, changed)  # after the callback states: the config's values rule
    loop.checkpoint = checkpoint
    if restored:
        logger.info("Restored from %s: %s.", path, ", ".join(restored))
    if skipped:  # a converter that loaded the weights (and said so) and restored nothing else: quiet
        (logger.info if restored else logger.debug)("Not restored from %s: %s.", path, "; ".join(skipped))
    return {"restored": restored, "skipped": skipped}


def _fail(path: str, what: str, exc: Exception) -> CheckpointError:
    return CheckpointError(
        f"Checkpoint {path}: the saved {what} does not fit this run ({type(exc).__name__}: {exc}). "
        f"Resume with the configuration that wrote it, or set resume_optimizer=False / "
        f"resume_epoch_or_step=False to load the model weights only."
    )


def _restore_optimizer(
    loop: LoopBase, ckpt: Mapping[str, Any], path: str, restored: list[str], skipped: list[str]
) -> set[str]:
    """Restore the optimizer and grad scaler; return the optimizer options the config changed."""
    if not loop.resume_optimizer:
        skipped.append("optimizer and grad_scaler (resume_optimizer=False)")
        return set()
    changed: set[str] = set()
    if ckpt.get("optimizer") is None or loop.optimizer is None:
        skipped.append("optimizer (the loop has none)" if loop.optimizer is None else "optimizer (none saved)")
    else:
        changes = load_optimizer_state(loop.optimizer, ckpt["optimizer"], path, ckpt.get("optimizer_type"),
                                       run_options=True)
        for change in changes:
            logger.warning("Resuming from %s with the config's %s.", path, change.describe())
        restored.append("optimizer")
        changed = {c.name for c in changes}
    ensure = getattr(loop.batch_processor, "ensure_grad_scaler", None)
    if ckpt.get("grad_scaler") and callable(ensure):
        ensure(loop.torch_device)  # fp16 processors create their scaler lazily: create it now
    scaler: Any = getattr(loop.batch_processor, "grad_scaler", None)
    if ckpt.get("grad_scaler"):
        if callable(getattr(scaler, "load_state_dict", None)):
            scaler.load_state_dict(ckpt["grad_scaler"])
            restored.append("grad_scaler")
        else:
            skipped.append("grad_scaler (the batch processor has no GradScaler yet)")
    return changed


def check_world_size(progress: Mapping[str, Any], path: str) -> None:
    """Refuse to continue a run with another number of processes than the one that saved it.

    Each process's share of an epoch, the steps per epoch and the global batch depend on the
    number of processes, so the saved position and generators only continue the run exactly
    with the same number. Checkpoints without a recorded ``world_size`` are not checked.
    """
    saved = progress.get("world_size")
    world = int(idist.get_world_size())
    if saved is None or int(saved) == world:
        return
    raise CheckpointError(
        f"Checkpoint {path} was written by a run of {int(saved)} training process(es), but this run has "
        f"{world}. Its progress, data position and random generators belong to {int(saved)} processes (the "
        f"number of processes sets each one's share of an epoch and the global batch), so the run cannot "
        f"continue exactly. Resume it with {int(saved)} processes (hat-train ... --nproc {int(saved)}), or start "
        f"a new run from its weights only (resume_epoch_or_step=False, or LoadCheckpoint in "
        f"model_convert_pipeline without --resume)."
    )


def _restore_progress(
    loop: LoopBase, ckpt: Mapping[str, Any], path: str, restored: list[str], skipped: list[str]
) -> None:
    if not loop.resume_epoch_or_step:
        skipped.append("epoch/step, callback states and RNG (resume_epoch_or_step=False)")
        return
    progress = ckpt.get("progress")
    if isinstance(progress, Mapping):
        check_world_size(progress, path)
        iteration = int(progress["iteration"])
        saved_length = progress.get("epoch_length")
        try:
            length: int | None = len(loop.data_loader)
        except TypeError:
            length = saved_length
        check_schedule(loop, progress, ckpt.get("data"), length, path)
        loop.start_step = iteration
        loop.start_epoch = iteration // length if length else 0
        restored.append(f"progress (goes on at global step {iteration})")
    else:
        skipped.append("epoch/step (the checkpoint records no progress)")
    saved = ckpt.get("callbacks") or {}
    for key, cb in stateful_callbacks(loop.callbacks):
        if key not in saved:
            skipped.append(f"callback {key} (not in the checkpoint)")
            continue
        try:
            cb.load_state_dict(saved[key])
        except (ValueError, KeyError, TypeError) as exc:
            raise _fail(path, f"state of callback {key}", exc) from exc
        restored.append(f"callback {key}")
    present = {key for key, _ in stateful_callbacks(loop.callbacks)}
    skipped.extend(f"callback {k} (no such callback in this loop)" for k in saved if k not in present)
    rng, data = ckpt.get("rng"), ckpt.get("data")
    load_data = getattr(loop, "load_data_state_dict", None)
    if callable(load_data) and isinstance(data, Mapping):
        # the loop sets the generators right before training goes on, after re-creating the
        # epoch's data iterator at the saved position
        load_data(data, rng=rng)
        restored.append(f"data position (step {data.get('steps_done')} of {data.get('epoch_length')} in the epoch)")
        if rng is not None:
            restored.extend(f"rng:{name}" for name in ("python", "numpy", "torch", "cuda") if rng.get(name) is not None)
    else:
        skipped.append("data position (none saved: the epoch restarts from its first batch)")
        if rng is not None:
            restored.extend(f"rng:{name}" for name in set_rng_state(rng))
    if rng is None:
        skipped.append("rng (none saved)")


def resume_from(loop: LoopBase, path: PathLike, check_hash: bool = True) -> dict[str, list[str]]:
    """Load a checkpoint file and restore a whole training state into ``loop``, before ``fit()``.

    What is restored follows ``loop.resume_optimizer`` and ``loop.resume_epoch_or_step`` (see
    :func:`restore_training_state`). Call it after building the loop and right before ``fit()``.

    Args:
        loop: the built ``Trainer`` (or other loop) to restore into.
        path: the checkpoint file.
        check_hash: verify the content hash the file records (default ``True``).

    Returns:
        ``{"restored": [...], "skipped": [...]}``, also logged.

    Raises:
        CheckpointError: the file is unreadable, corrupt, or of another model; names the path.
    """
    checkpoint = load_checkpoint(path, check_hash=check_hash)
    return restore_training_state(loop, checkpoint, path)


class LoadCheckpoint:
    """A ``model -> model`` converter that loads checkpoint weights (for ``model_convert_pipeline``).

    The file is loaded with :func:`~hat_ignite.checkpoint.loading.load_checkpoint` (weights-only, hash
    verified) and its weights copied into the model with :func:`load_model_weights`. The loaded
    checkpoint stays in :attr:`checkpoint`, and :meth:`resume` restores the rest of the training
    state into a loop.

    Args:
        checkpoint_path: the checkpoint file (``None``: load nothing).
        allow_miss: accept model entries the checkpoint lacks.
        ignore_extra: accept checkpoint entries the model lacks.
        verbose: log missing/extra keys even when accepted.
        check_hash: verify the recorded content hash (default ``True``).
        state_dict_update_func: applied to the weights before loading (rename keys, ...).
        ignore_tensor_shape: skip checkpoint tensors whose shape differs from the model's (see
            :func:`load_model_weights`).
        enable_tracking: HAT's AIDI checkpoint tracking; only ``False`` is supported (``True``
            raises ``ValueError``: there is no AIDI service here).

    ``checkpoint_path=None`` loads nothing (the model is returned as is, and the log says so),
    as in HAT.

    Example:
        >>> import tempfile, torch
        >>> from hat_ignite.checkpoint.atomic import atomic_save
        >>> from hat_ignite.checkpoint.hashing import with_content_hash
        >>> tmp = tempfile.TemporaryDirectory()
        >>> src = nn.Linear(3, 2)
        >>> path = atomic_save(with_content_hash({"state_dict": src.state_dict()}), f"{tmp.name}/w.pth.tar")
        >>> model = LoadCheckpoint(path)(nn.Linear(3, 2))
        >>> torch.equal(model.weight, src.weight)
        True
        >>> tmp.cleanup()
    """

    def __init__(
        self,
        checkpoint_path: PathLike | None,
        allow_miss: bool = False,
        ignore_extra: bool = False,
        verbose: bool = False,
        check_hash: bool = True,
        state_dict_update_func: Callable[[dict], dict] | None = None,
        ignore_tensor_shape: bool = False,
        enable_tracking: bool = False,
    ) -> None:
        if enable_tracking:
            raise ValueError(
                f"LoadCheckpoint({checkpoint_path!r}, enable_tracking=True) asks HAT's AIDI service to track "
                f"the checkpoint; hat-ignite has no AIDI client. Set enable_tracking=False."
            )
        self.checkpoint_path = checkpoint_path
        self.ignore_tensor_shape = ignore_tensor_shape
        self.allow_miss = allow_miss
        self.ignore_extra = ignore_extra
        self.verbose = verbose
        self.check_hash = check_hash
        self.state_dict_update_func = state_dict_update_func
        self.checkpoint: Any = None

    def __call__(self, model: nn.Module) -> nn.Module:
        if self.checkpoint_path is None:
            logger.info("LoadCheckpoint: checkpoint_path is None, no weights loaded.")
            return model
        self.checkpoint = load_checkpoint(self.checkpoint_path, check_hash=self.check_hash)
        load_model_weights(
            model, self.checkpoint, self.checkpoint_path, allow_miss=self.allow_miss,
            ignore_extra=self.ignore_extra, verbose=self.verbose,
            state_dict_update_func=self.state_dict_update_func, ignore_tensor_shape=self.ignore_tensor_shape,
        )
        logger.info("Loaded model weights from %s.", self.checkpoint_path)
        return model

    def resume(self, loop: LoopBase) -> dict[str, list[str]]:
        """Restore the rest of the loaded training state into ``loop`` (weights already loaded)."""
        if self.checkpoint_path is None:
            return {"restored": [], "skipped": ["everything (checkpoint_path is None)"]}
        if self.checkpoint is None:
            raise ValueError(
                f"LoadCheckpoint({self.checkpoint_path!r}).resume(loop) was called before the "
                f"converter ran; apply it to the model first (model_convert_pipeline does)."
            )
        return restore_training_state(loop, self.checkpoint, self.checkpoint_path, load_model=False)

    def __repr__(self) -> str:
        return f"LoadCheckpoint({self.checkpoint_path!r})"
