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
    "HatState", "EventStorage", "HOOK_KWARGS", "COMMON_KWARGS", "hook_kwargs", "keyword_readers", "accepted_kwargs",
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

_SUB_BATCH_HOOKS = frozenset(
    {"on_batch_begin", "on_forward_begin", "on_forward_end", "on_backward_begin", "on_backward_end", "on_batch_end"}
)
_STEP_HOOKS = _SUB_BATCH_HOOKS | {"on_step_begin", "on_optimizer_step_begin", "on_step_end"}


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


def _epoch_id(loop: LoopBase) -> int:
    return max(loop.state.epoch - 1, 0)


#: How each keyword's value is read from the running loop. Step-level and sub-batch hooks read a
#: few of them elsewhere (:data:`_IN_STEP_VALUES`, :data:`_SUB_BATCH_VALUES`), as does ``on_loop_end``.
_VALUES: dict[str, Callable[[Any], Any]] = {
    "loop": lambda loop: loop,
    "storage": lambda loop: loop.state.storage,
    "train_metrics": lambda loop: loop.train_metrics,
    "val_metrics": lambda loop: loop.val_metrics,
    "profiler": lambda loop: loop.profiler,
    "model": lambda loop: loop.model,
    "ema_model": lambda loop: loop.ema_model,
    "optimizer": lambda loop: loop.optimizer,
    "data_loader": lambda loop: loop.data_loader,
    "num_epochs": lambda loop: loop.num_epochs,
    "num_steps": lambda loop: loop.num_steps,
    "start_epoch": lambda loop: loop.start_epoch,
    "start_step": lambda loop: loop.start_step,
    "device": lambda loop: loop.device,
    "callbacks": lambda loop: loop.callbacks,
    "grad_scaler": hook_grad_scaler,
    "epoch_id": _epoch_id,
    "step_id": lambda loop: loop.state.step_id,
    "global_step_id": lambda loop: loop.state.iteration,  # outside a step: the id of the next step
    "batch_idx": lambda loop: loop.state.batch_idx,
    "batch": lambda loop: loop.state.batch,
    "model_outs": lambda loop: loop.state.output,
}
_IN_STEP_VALUES: dict[str, Callable[[Any], Any]] = {"global_step_id": lambda loop: loop.state.iteration - 1}
_SUB_BATCH_VALUES: dict[str, Callable[[Any], Any]] = {
    **_IN_STEP_VALUES,
    "batch": lambda loop: loop.state.sub_batch,
    "losses": lambda loop: loop.state.losses,
    "model_outs": lambda loop: loop.state.sub_model_outs,
}
# after the loop HAT's epoch counter has moved past the last epoch run: the epochs run so far
_LOOP_END_VALUES: dict[str, Callable[[Any], Any]] = {"epoch_id": lambda loop: loop.state.epoch}

#: A reader ``(keyword, loop -> value)`` for each keyword a hook passes.
Readers = tuple[tuple[str, Callable[[Any], Any]], ...]


@functools.lru_cache(maxsize=None)
def keyword_readers(hook: str, names: tuple[str, ...] | None = None) -> Readers:
    """How to read ``hook``'s keywords (or only ``names`` of them) from the running loop.

    Args:
        hook: a HAT hook name such as ``"on_step_end"``.
        names: the keywords wanted, a subset of :func:`accepted_kwargs`; ``None`` for all, in
            the order of :data:`HOOK_KWARGS` then :data:`COMMON_KWARGS`.

    Returns:
        ``(keyword, reader)`` pairs, where ``reader(loop)`` is the keyword's value right now.

    Raises:
        ValueError: ``hook`` is no HAT hook, or it does not pass one of ``names``.

    >>> [name for name, _ in keyword_readers("on_epoch_begin", ("epoch_id",))]
    ['epoch_id']
    """
    if hook not in HOOK_KWARGS:
        raise ValueError(f"{hook!r} is not a HAT hook; the hooks are {', '.join(HOOK_KWARGS)}.")
    allowed = (*HOOK_KWARGS[hook], *COMMON_KWARGS)
    if names is None:
        names = allowed
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise ValueError(f"{hook} does not pass {', '.join(map(repr, unknown))}; it passes {', '.join(allowed)}.")
    values = dict(_VALUES)
    if hook in _SUB_BATCH_HOOKS:
        values.update(_SUB_BATCH_VALUES)
    elif hook in _STEP_HOOKS:
        values.update(_IN_STEP_VALUES)
    elif hook == "on_loop_end":
        values.update(_LOOP_END_VALUES)
    return tuple((name, values[name]) for name in names)


def hook_kwargs(hook: str, loop: LoopBase) -> dict[str, Any]:
    """Build the keyword arguments HAT passes to ``hook``, read from ``loop`` and its state.

    Args:
        hook: a HAT hook name such as ``"on_step_end"``.
        loop: the running engine.

    Returns:
        A new dict with exactly the names of ``HOOK_KWARGS[hook]`` plus :data:`COMMON_KWARGS`.
    """
    return {name: read(loop) for name, read in keyword_readers(hook)}


def accepted_kwargs(hook: str) -> frozenset[str]:
    """All keyword names ``hook`` passes.

    >>> "batch_idx" in accepted_kwargs("on_batch_end")
    True
    """
    return frozenset((*HOOK_KWARGS[hook], *COMMON_KWARGS))
