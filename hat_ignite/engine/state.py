"""The engine's state and the HAT callback keyword contract, in one place.

:class:`HatState` is Ignite's :class:`~ignite.engine.events.State` with HAT's fields declared.
:data:`HOOK_KWARGS` lists the keywords each HAT hook receives and :func:`hook_kwargs` builds them
from the engine; nothing else in the package knows the contract.

Ids are 0-based (``epoch_id``, ``step_id`` within the epoch, ``global_step_id`` across the run);
Ignite's ``state.epoch`` and ``state.iteration`` stay the 1-based counters Ignite defines. Inside a
step ``global_step_id`` is the id of the running step; outside a step (epoch and loop hooks) it is
the number of steps done so far, which is the id of the next step, as in HAT. At ``on_loop_end``
``epoch_id`` is the epoch after the last one run (``2`` after epochs 0 and 1), as HAT's loop
leaves its counter.

Values are HAT's: ``storage`` is an :class:`EventStorage` (a dict with HAT's ``put``),
``grad_scaler`` is a disabled ``GradScaler`` when training without one, and ``train_metrics`` /
``val_metrics`` are lists (``[None]`` when the loop has none), as the loop stores them.

>>> sorted(HOOK_KWARGS["on_epoch_begin"])
['data_loader', 'epoch_id', 'global_step_id', 'model', 'optimizer']
>>> "loop" in COMMON_KWARGS and "storage" in COMMON_KWARGS
True
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable

from ignite.engine import State

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = [
    "HatState", "EventStorage", "HOOK_KWARGS", "COMMON_KWARGS", "hook_kwargs", "accepted_kwargs",
    "disabled_grad_scaler", "hook_grad_scaler",
]

_IDS = ("epoch_id", "step_id", "global_step_id")

#: Keywords passed to every hook.
COMMON_KWARGS: tuple[str, ...] = ("loop", "storage", "train_metrics", "val_metrics", "profiler")

#: Extra keywords of each hook, on top of :data:`COMMON_KWARGS`: what HAT's loop and batch
#: processors pass (for the per-batch hooks, the union of what Basic and Multi pass, with
#: ``batch_idx`` always, 0 for a single batch).
HOOK_KWARGS: dict[str, tuple[str, ...]] = {
    "on_loop_begin": ("model", "optimizer", "data_loader", "num_epochs", "num_steps"),
    "on_epoch_begin": ("model", "optimizer", "data_loader", "epoch_id", "global_step_id"),
    "on_step_begin": (
        "model", "optimizer", "data_loader", *_IDS, "start_epoch", "start_step", "batch",
    ),
    "on_batch_begin": ("batch", "batch_idx", *_IDS),
    "on_forward_begin": ("batch", "model", "batch_idx", *_IDS),
    "on_forward_end": ("model_outs", "batch_idx", *_IDS),
    "on_backward_begin": ("model", "optimizer", "batch", "batch_idx", *_IDS),
    "on_backward_end": ("model", "optimizer", "batch", "grad_scaler", "batch_idx", *_IDS),
    "on_optimizer_step_begin": ("model", "optimizer", "grad_scaler", *_IDS),
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


class EventStorage(dict):
    """The ``storage`` every hook receives: a dict callbacks share values through, with HAT's ``put``.

    Plain item access works as on any dict (``storage["monitor_obj"] = {...}``). :meth:`put`
    keeps a history per key, as HAT's event storage does: ``storage[key]`` is a list that each
    ``put`` appends to, or, with ``always_dict=True``, a one-element list holding a dict that
    each ``put`` updates. A new storage is made when a run starts.

    Example:
        >>> storage = EventStorage()
        >>> storage.put("loss", 0.5); storage.put("loss", 0.25)
        >>> storage.put("scaler", {"scale": 2.0}, always_dict=True)
        >>> storage.put("scaler", {"growth": 3}, always_dict=True)
        >>> storage
        {'loss': [0.5, 0.25], 'scaler': [{'scale': 2.0, 'growth': 3}]}
        >>> storage.histories is storage
        True
    """

    def put(self, key: str, value: Any, always_dict: bool = False) -> None:
        """Append ``value`` to the history of ``key``, or merge it into its dict (``always_dict``).

        Raises:
            TypeError: ``always_dict=True`` with a value that is not a dict, or ``key`` holding a
                value that :meth:`put` did not write (not a list).
        """
        history = self.get(key)
        if history is None:
            history = self[key] = [{}] if always_dict else []
        elif not isinstance(history, list):
            raise TypeError(
                f"storage.put({key!r}, ...): storage[{key!r}] holds a {type(history).__name__} set by "
                f"item assignment, not a history list; use another key, or assign it directly."
            )
        if always_dict:
            if not isinstance(value, dict):
                raise TypeError(f"storage.put({key!r}, ..., always_dict=True) needs a dict value, got {type(value).__name__}.")
            if not history or not isinstance(history[0], dict):
                history.insert(0, {})
            history[0].update(value)
        else:
            history.append(value)

    def clear_key(self, key: str) -> None:
        """Empty the history of ``key``."""
        self[key] = []

    @property
    def histories(self) -> EventStorage:
        """The storage itself (HAT's name for its key -> history mapping)."""
        return self

    def __enter__(self) -> EventStorage:
        """``with EventStorage() as storage:``, as HAT code writes it; the storage stays usable after."""
        return self

    def __exit__(self, *exc_info: Any) -> None:
        return None


@functools.lru_cache(maxsize=None)
def disabled_grad_scaler() -> Any:
    """The disabled ``torch.amp.GradScaler`` hooks receive as ``grad_scaler`` when training without one.

    As in HAT, ``grad_scaler`` is always a scaler: a disabled one passes values through
    (``scale(loss)`` is ``loss``, ``unscale_(optimizer)`` does nothing), so HAT callbacks that
    call it run unchanged. One instance is shared; it holds no state.

    >>> disabled_grad_scaler().is_enabled()
    False
    """
    import torch

    return torch.amp.GradScaler("cuda", enabled=False)


def hook_grad_scaler(loop: LoopBase) -> Any:
    """The ``grad_scaler`` keyword: the batch processor's scaler, or :func:`disabled_grad_scaler`."""
    scaler = getattr(loop.batch_processor, "grad_scaler", None)
    return disabled_grad_scaler() if scaler is None else scaler


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
        storage: the per-run :class:`EventStorage` callbacks share values through.
    """

    def __init__(self, **kwargs: Any) -> None:
        self.epoch_first_step = 0
        self.hat_batch_count = 0
        self.batch_idx = 0
        self.sub_batch: Any = None
        self.losses: Any = None
        self.sub_model_outs: Any = None
        self.epoch_open = False
        self.storage: EventStorage = EventStorage()
        super().__init__(**kwargs)

    @property
    def step_id(self) -> int:
        """0-based id of the running step inside its epoch (of the last one, between steps).

        Derived from ``iteration`` and ``epoch_first_step``, so it is right from the moment Ignite
        counts a step, for every handler; 0 before an epoch's first step.
        """
        return max(self.iteration - 1 - self.epoch_first_step, 0)


# What each hook passes on top of COMMON_KWARGS, one function per hook, in HOOK_KWARGS order
# (tests/test_hot_path.py checks that they agree). Ids: epoch_id is 0-based, as HAT's; inside a
# step global_step_id is the running step's id, outside a step the next step's (Ignite's
# iteration counts the steps done).


def _on_loop_begin(loop: Any, state: Any) -> dict[str, Any]:
    return {"model": loop.model, "optimizer": loop.optimizer, "data_loader": loop.data_loader,
            "num_epochs": loop.num_epochs, "num_steps": loop.num_steps}


def _on_epoch_begin(loop: Any, state: Any) -> dict[str, Any]:
    return {"model": loop.model, "optimizer": loop.optimizer, "data_loader": loop.data_loader,
            "epoch_id": max(state.epoch - 1, 0), "global_step_id": state.iteration}


def _on_step_begin(loop: Any, state: Any) -> dict[str, Any]:
    return {"model": loop.model, "optimizer": loop.optimizer, "data_loader": loop.data_loader,
            "epoch_id": max(state.epoch - 1, 0), "step_id": state.step_id, "global_step_id": state.iteration - 1,
            "start_epoch": loop.start_epoch, "start_step": loop.start_step, "batch": state.batch}


# the per-batch hooks pass the (sub-)batch the processor works on, and its outputs and losses


def _on_batch_begin(loop: Any, state: Any) -> dict[str, Any]:
    return {"batch": state.sub_batch, "batch_idx": state.batch_idx,
            "epoch_id": max(state.epoch - 1, 0), "step_id": state.step_id, "global_step_id": state.iteration - 1}


def _on_forward_begin(loop: Any, state: Any) -> dict[str, Any]:
    return {"batch": state.sub_batch, "model": loop.model, "batch_idx": state.batch_idx,
            "epoch_id": max(state.epoch - 1, 0), "step_id": state.step_id, "global_step_id": state.iteration - 1}


def _on_forward_end(loop: Any, state: Any) -> dict[str, Any]:
    return {"model_outs": state.sub_model_outs, "batch_idx": state.batch_idx,
            "epoch_id": max(state.epoch - 1, 0), "step_id": state.step_id, "global_step_id": state.iteration - 1}


def _on_backward_begin(loop: Any, state: Any) -> dict[str, Any]:
    return {"model": loop.model, "optimizer": loop.optimizer, "batch": state.sub_batch, "batch_idx": state.batch_idx,
            "epoch_id": max(state.epoch - 1, 0), "step_id": state.step_id, "global_step_id": state.iteration - 1}


def _on_backward_end(loop: Any, state: Any) -> dict[str, Any]:
    return {"model": loop.model, "optimizer": loop.optimizer, "batch": state.sub_batch,
            "grad_scaler": hook_grad_scaler(loop), "batch_idx": state.batch_idx,
            "epoch_id": max(state.epoch - 1, 0), "step_id": state.step_id, "global_step_id": state.iteration - 1}


def _on_optimizer_step_begin(loop: Any, state: Any) -> dict[str, Any]:
    return {"model": loop.model, "optimizer": loop.optimizer, "grad_scaler": hook_grad_scaler(loop),
            "epoch_id": max(state.epoch - 1, 0), "step_id": state.step_id, "global_step_id": state.iteration - 1}


def _on_batch_end(loop: Any, state: Any) -> dict[str, Any]:
    return {"batch": state.sub_batch, "losses": state.losses, "model_outs": state.sub_model_outs,
            "batch_idx": state.batch_idx,
            "epoch_id": max(state.epoch - 1, 0), "step_id": state.step_id, "global_step_id": state.iteration - 1}


def _on_step_end(loop: Any, state: Any) -> dict[str, Any]:
    return {"model": loop.model, "ema_model": loop.ema_model, "optimizer": loop.optimizer,
            "data_loader": loop.data_loader,
            "epoch_id": max(state.epoch - 1, 0), "step_id": state.step_id, "global_step_id": state.iteration - 1,
            "num_steps": loop.num_steps, "device": loop.device, "callbacks": loop.callbacks, "batch": state.batch,
            "model_outs": state.output}


def _on_epoch_end(loop: Any, state: Any) -> dict[str, Any]:
    return {"model": loop.model, "ema_model": loop.ema_model, "optimizer": loop.optimizer,
            "epoch_id": max(state.epoch - 1, 0), "global_step_id": state.iteration, "num_epochs": loop.num_epochs,
            "device": loop.device, "callbacks": loop.callbacks}


def _on_loop_end(loop: Any, state: Any) -> dict[str, Any]:
    # after the loop HAT's epoch counter has moved past the last epoch run: the epochs run so far
    return {"model": loop.model, "ema_model": loop.ema_model, "optimizer": loop.optimizer,
            "epoch_id": state.epoch, "global_step_id": state.iteration, "device": loop.device,
            "callbacks": loop.callbacks}


_HOOK_VALUES: dict[str, Callable[[Any, Any], dict[str, Any]]] = {
    "on_loop_begin": _on_loop_begin,
    "on_epoch_begin": _on_epoch_begin,
    "on_step_begin": _on_step_begin,
    "on_batch_begin": _on_batch_begin,
    "on_forward_begin": _on_forward_begin,
    "on_forward_end": _on_forward_end,
    "on_backward_begin": _on_backward_begin,
    "on_backward_end": _on_backward_end,
    "on_optimizer_step_begin": _on_optimizer_step_begin,
    "on_batch_end": _on_batch_end,
    "on_step_end": _on_step_end,
    "on_epoch_end": _on_epoch_end,
    "on_loop_end": _on_loop_end,
}


def hook_kwargs(hook: str, loop: LoopBase) -> dict[str, Any]:
    """Build the keyword arguments HAT passes to ``hook``, read from ``loop`` and its state.

    Args:
        hook: a HAT hook name such as ``"on_step_end"``.
        loop: the running engine.

    Returns:
        A new dict with exactly the names of ``HOOK_KWARGS[hook]`` plus :data:`COMMON_KWARGS`,
        in that order.

    Raises:
        ValueError: ``hook`` is no HAT hook.
    """
    values = _HOOK_VALUES.get(hook)
    if values is None:
        raise ValueError(f"{hook!r} is not a HAT hook; the hooks are {', '.join(HOOK_KWARGS)}.")
    state = loop.state
    kwargs = values(loop, state)
    kwargs["loop"] = loop  # COMMON_KWARGS
    kwargs["storage"] = state.storage
    kwargs["train_metrics"] = loop.train_metrics
    kwargs["val_metrics"] = loop.val_metrics
    kwargs["profiler"] = loop.profiler
    return kwargs


def accepted_kwargs(hook: str) -> frozenset[str]:
    """All keyword names ``hook`` passes.

    >>> "batch_idx" in accepted_kwargs("on_batch_end")
    True
    """
    return frozenset((*HOOK_KWARGS[hook], *COMMON_KWARGS))
