"""The engine's state and the HAT callback keyword contract, in one place.

:class:`HatState` is Ignite's :class:`~ignite.engine.events.State` with HAT's fields declared.
:data:`HOOK_KWARGS` lists the keywords each HAT hook receives and :func:`hook_kwargs` builds them
from the engine; nothing else in the package knows the contract.

Ids are 0-based (``epoch_id``, ``step_id`` within the epoch, ``global_step_id`` across the run);
Ignite's ``state.epoch`` and ``state.iteration`` stay the 1-based counters Ignite defines. Inside a
step ``global_step_id`` is the id of the running step; outside a step (epoch and loop hooks) it is
the number of steps done so far, which is the id of the next step, as in HAT.

>>> sorted(HOOK_KWARGS["on_epoch_begin"])
['data_loader', 'epoch_id', 'global_step_id', 'model', 'optimizer']
>>> "loop" in COMMON_KWARGS and "storage" in COMMON_KWARGS
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ignite.engine import State

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["HatState", "HOOK_KWARGS", "COMMON_KWARGS", "hook_kwargs", "accepted_kwargs"]

_IDS = ("epoch_id", "step_id", "global_step_id")

#: Keywords passed to every hook.
COMMON_KWARGS: tuple[str, ...] = ("loop", "storage", "train_metrics", "val_metrics", "profiler")

#: Extra keywords of each hook, on top of :data:`COMMON_KWARGS`.
HOOK_KWARGS: dict[str, tuple[str, ...]] = {
    "on_loop_begin": ("model", "optimizer", "data_loader", "num_epochs", "num_steps"),
    "on_epoch_begin": ("model", "optimizer", "data_loader", "epoch_id", "global_step_id"),
    "on_step_begin": (
        "model", "optimizer", "data_loader", *_IDS, "start_epoch", "start_step", "batch",
    ),
    "on_batch_begin": ("batch", "batch_idx", *_IDS),
    "on_backward_end": ("model", "optimizer", "batch", "grad_scaler", "batch_idx", *_IDS),
    "on_batch_end": ("batch", "losses", "model_outs", "batch_idx", *_IDS),
    "on_step_end": (
        "model", "ema_model", "optimizer", "data_loader", *_IDS, "num_steps", "device",
        "callbacks", "batch", "model_outs",
    ),
    "on_epoch_end": (
        "model", "ema_model", "optimizer", "epoch_id", "global_step_id", "num_epochs", "device",
        "callbacks",
    ),
    "on_loop_end": ("model", "ema_model", "optimizer", "epoch_id", "global_step_id", "device", "callbacks"),
}

_STEP_HOOKS = frozenset({"on_step_begin", "on_batch_begin", "on_backward_end", "on_batch_end", "on_step_end"})
_SUB_BATCH_HOOKS = frozenset({"on_batch_begin", "on_backward_end", "on_batch_end"})


class HatState(State):
    """Ignite's state plus the fields a HAT loop keeps.

    Attributes:
        step_id: 0-based id of the running step inside its epoch.
        epoch_first_step: Ignite ``iteration`` value at which the running epoch began (so
            ``step_id`` continues from the resume point after a mid-epoch resume).
        hat_batch_count: 1-based count of (sub-)batches processed in this run; the counter that
            ``HatEvents.BATCH_*`` event filters use.
        batch_idx: index of the running sub-batch inside the step (0 for a single batch).
        sub_batch: the (sub-)batch the processor is working on, as passed to batch hooks.
        losses: loss tensors the loss collector picked from the latest (sub-)batch outputs.
        sub_model_outs: model outputs of the latest (sub-)batch.
        epoch_open: whether an epoch has begun and not yet ended (used to close an epoch that a
            step limit or ``terminate()`` stops partway through).
        storage: a per-run dict callbacks share values through.
    """

    def __init__(self, **kwargs: Any) -> None:
        self.step_id = 0
        self.epoch_first_step = 0
        self.hat_batch_count = 0
        self.batch_idx = 0
        self.sub_batch: Any = None
        self.losses: Any = None
        self.sub_model_outs: Any = None
        self.epoch_open = False
        self.storage: dict[str, Any] = {}
        super().__init__(**kwargs)


def hook_kwargs(hook: str, loop: LoopBase) -> dict[str, Any]:
    """Build the keyword arguments HAT passes to ``hook``, read from ``loop`` and its state.

    Args:
        hook: a HAT hook name such as ``"on_step_end"``.
        loop: the running engine.

    Returns:
        A new dict with exactly the names of ``HOOK_KWARGS[hook]`` plus :data:`COMMON_KWARGS`.
    """
    state = loop.state
    in_step = hook in _STEP_HOOKS
    values: dict[str, Any] = {
        "loop": loop,
        "storage": state.storage,
        "train_metrics": loop.train_metrics,
        "val_metrics": loop.val_metrics,
        "profiler": loop.profiler,
        "model": loop.model,
        "ema_model": loop.ema_model,
        "optimizer": loop.optimizer,
        "data_loader": loop.data_loader,
        "num_epochs": loop.num_epochs,
        "num_steps": loop.num_steps,
        "start_epoch": loop.start_epoch,
        "start_step": loop.start_step,
        "device": loop.device,
        "callbacks": loop.callbacks,
        "grad_scaler": getattr(loop.batch_processor, "grad_scaler", None),
        "epoch_id": max(state.epoch - 1, 0),
        "step_id": state.step_id,
        "global_step_id": state.iteration - 1 if in_step else state.iteration,
        "batch_idx": state.batch_idx,
    }
    if hook in _SUB_BATCH_HOOKS:
        values["batch"] = state.sub_batch
        values["losses"] = state.losses
        values["model_outs"] = state.sub_model_outs
    else:
        values["batch"] = state.batch
        values["model_outs"] = state.output
    return {name: values[name] for name in (*HOOK_KWARGS[hook], *COMMON_KWARGS)}


def accepted_kwargs(hook: str) -> frozenset[str]:
    """All keyword names ``hook`` passes.

    >>> "batch_idx" in accepted_kwargs("on_batch_end")
    True
    """
    return frozenset((*HOOK_KWARGS[hook], *COMMON_KWARGS))
