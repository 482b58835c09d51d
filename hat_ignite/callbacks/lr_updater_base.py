"""`LrUpdaterBase`: warmup plus a formal schedule, as a pure function of the loop position.

Every LR updater computes each param group's lr from ``(epoch_id, global_step_id)`` alone, as HAT
does. The warmup always moves step by step, over ``W`` steps: ``warmup_len`` steps
(``warmup_by="step"``) or ``warmup_len * len(data_loader)`` steps (``warmup_by="epoch"``)::

    if global_step_id < W:                                  # warmup, every step
        lr = get_warmup_lr(base_lr * warmup_lr_ratio, global_step_id)
    elif update_by == "step":                               # formal training, every step
        lr = get_lr(base_lr, global_step_id)
    elif epoch_id * steps_per_epoch < W:                    # the epoch began inside the warmup:
        lr = get_warmup_lr(base_lr * warmup_lr_ratio, ceil(W) - 1)    # keep the last warmup lr
    else:                                                   # formal training, every epoch
        lr = get_lr(base_lr, epoch_id)

``base_lr`` is the group's initial lr (its ``initial_lr`` entry, set from ``lr`` the first time),
so param groups keep their own lrs and move together. The lr is set on each epoch begin and, when
it can change within an epoch (``update_by="step"`` or inside the warmup), on each step begin. No
counter is kept: a resumed run (``start_epoch`` / ``start_step``) gets the same lr at the same step,
and :meth:`~LrUpdaterBase.state_dict` holds only the base lrs.

Warmup (``get_warmup_lr``): ``"linear"`` goes from ``warmup_begin_lr`` towards
``base_lr * warmup_lr_ratio`` over the ``W`` steps; ``"constant"`` holds
``base_lr * warmup_lr_ratio``. ``warmup_len`` may be fractional (``warmup_len=0.3`` epochs).
Subclasses implement :meth:`~LrUpdaterBase.get_lr`; those whose formula starts after the warmup
read :attr:`~LrUpdaterBase.warmup_updates`, the warmup length in ``update_by`` units (``W`` by
step; ``warmup_len`` epochs, or ``ceil(warmup_len / len(data_loader))`` for a step warmup, by epoch).

The run's length (:attr:`~LrUpdaterBase.total_steps`, :attr:`~LrUpdaterBase.total_epochs`) comes
from ``num_epochs`` whenever the loop has one, even with ``stop_by="step"`` (as HAT sizes its
schedules), and from ``num_steps`` otherwise.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any, Iterable, cast

import torch

from hat_ignite.callbacks.base import CallbackMixin
from hat_ignite.errors import UnknownLengthError

__all__ = ["LrUpdaterBase", "annealing_cos"]

logger = logging.getLogger(__name__)

_UNITS = ("step", "epoch")
_WARMUP_MODES = ("constant", "linear")


def annealing_cos(start: float, end: float, pct: float) -> float:
    """Cosine anneal from ``start`` (``pct=0``) to ``end`` (``pct=1``).

    >>> annealing_cos(1.0, 0.0, 0.0), annealing_cos(1.0, 0.0, 0.5), annealing_cos(1.0, 0.0, 1.0)
    (1.0, 0.5, 0.0)
    """
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1.0)


def _unit(value: str | None, name: str, owner: str) -> str:
    unit = (value or "").lower()
    if unit not in _UNITS:
        raise ValueError(f"{owner}({name}={value!r}): use 'step' or 'epoch'.")
    return unit


def loader_length(data_loader: Iterable | None) -> int | None:
    try:
        length = len(data_loader)  # type: ignore[arg-type]
    except TypeError:
        return None
    return length if length > 0 else None


class LrUpdaterBase(CallbackMixin):
    """Base of the LR updaters: warmup, per-group base lrs, when to set the lr, logging.

    Args:
        update_by: formal-training lr changes on ``"step"`` begin (by ``global_step_id``) or on
            ``"epoch"`` begin (by ``epoch_id``).
        warmup_by: the unit of ``warmup_len``, ``"step"`` or ``"epoch"``; the warmup lr itself
            changes every step either way.
        warmup_len: warmup length in steps or epochs as ``warmup_by`` says, may be fractional
            (0: no warmup).
        warmup_mode: ``"linear"`` or ``"constant"``.
        warmup_begin_lr: the lr a linear warmup starts from.
        warmup_lr_ratio: the warmup ends at ``base_lr * warmup_lr_ratio`` (in ``[0, 1]``).
        step_log_interval: log the lr every this many steps when it is set on steps. It is
            logged on every epoch begin too, unless that step is one of them: each step is
            logged once.

    Subclasses implement :meth:`get_lr` and may override :meth:`prepare` (run-length checks)
    and :meth:`get_warmup_lr`.
    """

    #: The param-group entry the schedule sets; the OptimParamUpdaters set another (``"betas"``...).
    param_name: str = "lr"

    def __init__(
        self,
        update_by: str = "step",
        warmup_by: str = "step",
        warmup_len: float = 0,
        warmup_mode: str = "linear",
        warmup_begin_lr: float = 0.0,
        warmup_lr_ratio: float = 1.0,
        step_log_interval: int = 1,
    ) -> None:
        owner = type(self).__name__
        self.update_by = _unit(update_by, "update_by", owner)
        self.warmup_by = _unit(warmup_by, "warmup_by", owner)
        if isinstance(warmup_len, bool) or not isinstance(warmup_len, (int, float)) or not warmup_len >= 0:
            raise ValueError(f"{owner}(warmup_len={warmup_len!r}): give a non-negative number.")
        if warmup_mode not in _WARMUP_MODES:
            raise ValueError(f"{owner}(warmup_mode={warmup_mode!r}): use 'linear' or 'constant'.")
        if not warmup_begin_lr >= 0:
            raise ValueError(f"{owner}(warmup_begin_lr={warmup_begin_lr!r}): give a non-negative lr.")
        if not 0.0 <= warmup_lr_ratio <= 1.0:
            raise ValueError(f"{owner}(warmup_lr_ratio={warmup_lr_ratio!r}): give a ratio in [0, 1].")
        if isinstance(step_log_interval, bool) or not isinstance(step_log_interval, int) or step_log_interval < 1:
            raise ValueError(f"{owner}(step_log_interval={step_log_interval!r}): give a positive integer.")
        self.warmup_len = warmup_len
        self.warmup_mode = warmup_mode
        self.warmup_begin_lr = float(warmup_begin_lr)
        self.warmup_lr_ratio = float(warmup_lr_ratio)
        self.step_log_interval = step_log_interval
        #: Steps per epoch (``len(data_loader)``), known from loop begin.
        self.step_per_epoch: int | None = None
        #: The run's length in steps and in epochs, known from loop begin where computable.
        self.total_steps: int | None = None
        self.total_epochs: int | None = None
        #: Warmup length in steps (``W`` in the module doc); known from loop begin.
        self.warmup_steps: float = warmup_len if self.warmup_by == "step" else 0
        #: Warmup length in ``update_by`` units.
        self.warmup_updates: float | None = warmup_len if self.update_by == self.warmup_by else None
        #: Warmup length in epochs, as HAT reads it: ``warmup_len`` (``warmup_by="epoch"``), else
        #: ``ceil(warmup_len / len(data_loader))`` from loop begin (None before, or without a length).
        self.warmup_epochs: float | None = warmup_len if self.warmup_by == "epoch" else None
        self._base_lrs: list[float] | None = None
        self._restored_base_lrs: list[float] | None = None
        self._apply_next_step = False

    # -- the schedule: pure functions ----------------------------------------------------------
    def get_lr(self, begin_lr: float, num_update: int) -> float:
        """Formal-training lr of a group whose base lr is ``begin_lr``, at update ``num_update``.

        ``num_update`` is ``global_step_id`` (``update_by="step"``) or ``epoch_id``.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement get_lr(begin_lr, num_update).")

    def get_warmup_lr(self, warmup_end_lr: float, num_update: int) -> float:
        """Warmup lr at global step ``num_update`` (``< warmup_steps``), ending at ``warmup_end_lr``."""
        if self.warmup_mode == "constant":
            return warmup_end_lr
        return self.warmup_begin_lr + (warmup_end_lr - self.warmup_begin_lr) * num_update / self.warmup_steps

    def lr_at(self, base_lr: float, epoch_id: int, global_step_id: int) -> float:
        """The lr of a group whose base lr is ``base_lr`` at this loop position (see the module doc)."""
        warmup = self.warmup_steps
        if global_step_id < warmup:
            return self.get_warmup_lr(base_lr * self.warmup_lr_ratio, global_step_id)
        if self.update_by == "step":
            return self.get_lr(base_lr, global_step_id)
        if warmup > 0 and epoch_id * self.require(self.step_per_epoch, "the steps per epoch") < warmup:
            return self.get_warmup_lr(base_lr * self.warmup_lr_ratio, math.ceil(warmup) - 1)
        return self.get_lr(base_lr, epoch_id)

    def prepare(self) -> None:
        """Check arguments against the run and derive lengths; called on loop begin."""

    def require(self, value: Any, what: str) -> Any:
        """Return ``value``, or raise an :class:`~hat_ignite.errors.UnknownLengthError` (a
        ``ValueError``, and an ``AssertionError`` as HAT's assert) saying ``what`` the updater could
        not learn."""
        if value is None:
            raise UnknownLengthError(
                f"{type(self).__name__} needs {what}, which this run does not define: give the "
                f"data_loader a length (len(data_loader)) and the loop num_epochs / num_steps, or "
                f"set the updater's length arguments explicitly."
            )
        return value

    # -- hooks ---------------------------------------------------------------------------------
    def on_loop_begin(self, optimizer: torch.optim.Optimizer | None, data_loader: Any,
                      num_epochs: int | None = None, num_steps: int | None = None, **kwargs: Any) -> None:
        """Learn the run's lengths and the per-group base lrs.

        ``num_epochs`` / ``num_steps`` default to None, so a caller passing only HAT's
        ``optimizer`` and ``data_loader`` (HAT's own loop, a custom loop) works; an updater whose
        schedule needs the run's length then says so.
        """
        owner = type(self).__name__
        if optimizer is None:
            raise ValueError(f"{owner} needs the loop's optimizer, but the loop has none.")
        spe = loader_length(data_loader)
        self.step_per_epoch = spe
        if num_epochs is not None:
            self.total_epochs = num_epochs
            self.total_steps = num_epochs * spe if spe is not None else None
        else:
            self.total_steps = num_steps
            self.total_epochs = math.ceil(num_steps / spe) if spe is not None and num_steps is not None else None
        if self.warmup_by == "step" and spe is not None:
            self.warmup_epochs = math.ceil(self.warmup_len / spe)
        if self.warmup_len == 0:
            self.warmup_steps, self.warmup_updates = 0, 0
        else:
            if self.warmup_by == "epoch" or self.update_by == "epoch":
                spe = self.require(spe, f"the steps per epoch (warmup_by={self.warmup_by!r}, "
                                        f"update_by={self.update_by!r})")
            # spe is required above when warmup_by == "epoch"
            self.warmup_steps = self.warmup_len * cast(int, spe) if self.warmup_by == "epoch" else self.warmup_len
            if self.update_by == "step":
                self.warmup_updates = self.warmup_steps
            elif self.warmup_by == "epoch":
                self.warmup_updates = self.warmup_len
            else:
                self.warmup_updates = math.ceil(self.warmup_len / cast(int, spe))  # update_by='epoch': required above
        groups = optimizer.param_groups
        if self._restored_base_lrs is not None:
            if len(self._restored_base_lrs) != len(groups):
                raise ValueError(
                    f"{owner}: the restored state has {len(self._restored_base_lrs)} base lr(s) but the "
                    f"optimizer has {len(groups)} param group(s). Resume with the same optimizer setup."
                )
            self._base_lrs = list(self._restored_base_lrs)
        else:
            self._base_lrs = [self.initial_value(group) for group in groups]
        self.prepare()
        self._apply_next_step = True

    def overridden_hooks(self) -> list[str]:
        """The hooks to attach; no ``on_step_begin`` when the lr changes only with the epoch.

        With ``update_by="epoch"``, no warmup (and the base class's :meth:`lr_at`), every lr is
        set on epoch begin, which precedes every step of a run (resumed runs included), so a
        step-begin handler would have nothing to do.
        """
        hooks = super().overridden_hooks()
        epoch_only = (
            self.update_by == "epoch" and self.warmup_len == 0 and type(self).lr_at is LrUpdaterBase.lr_at
            and type(self).on_step_begin is LrUpdaterBase.on_step_begin
        )
        return [h for h in hooks if h != "on_step_begin"] if epoch_only else hooks

    def on_epoch_begin(self, optimizer: torch.optim.Optimizer, epoch_id: int, global_step_id: int,
                       **kwargs: Any) -> None:
        self._apply(optimizer, epoch_id, global_step_id)
        # the epoch's first step: 0, or the step a run resumed inside the epoch goes on from
        first = getattr(getattr(kwargs.get("loop"), "state", None), "epoch_first_step", None)
        step_id = global_step_id - first if isinstance(first, int) and 0 <= first <= global_step_id else 0
        if not (type(self).on_step_begin is LrUpdaterBase.on_step_begin and self._logs_step(global_step_id)):
            self._log(optimizer, epoch_id, step_id, global_step_id)  # else on_step_begin logs the same step

    def on_step_begin(self, optimizer: torch.optim.Optimizer, epoch_id: int, step_id: int,
                      global_step_id: int, **kwargs: Any) -> None:
        per_step = self._per_step(global_step_id)
        if per_step or self._apply_next_step:
            self._apply(optimizer, epoch_id, global_step_id)
            if per_step and self._logs_step(global_step_id):
                self._log(optimizer, epoch_id, step_id, global_step_id)

    def _per_step(self, global_step_id: int) -> bool:
        """Whether the lr of this step is set at its begin (warmup, or ``update_by="step"``)."""
        return self.update_by == "step" or global_step_id < self.warmup_steps

    def _logs_step(self, global_step_id: int) -> bool:
        """Whether :meth:`on_step_begin` logs the lr of this step (each ``step_log_interval``-th
        step whose lr is set per step). The epoch's begin logs its first step only otherwise, so a
        step is logged once (HAT logs the first step of such an epoch twice)."""
        return self._per_step(global_step_id) and (global_step_id + 1) % self.step_log_interval == 0

    def _apply(self, optimizer: torch.optim.Optimizer, epoch_id: int, global_step_id: int) -> None:
        for group, base_lr in zip(optimizer.param_groups, self._base_lrs or ()):
            self.set_value(group, self.lr_at(base_lr, epoch_id, global_step_id))
        self._apply_next_step = False

    # -- the scheduled entry of a param group (``"lr"`` here; any entry for the OptimParamUpdaters)
    def initial_value(self, group: dict[str, Any]) -> float:
        """The group's base value: its ``initial_<param_name>`` entry, set from the current value
        (the first element of a tuple such as ``betas``) the first time."""
        value = group[self.param_name]
        first = value[0] if isinstance(value, (list, tuple)) else value
        key = f"initial_{self.param_name}"
        if key not in group:
            group[key] = first
        return float(group[key])

    def set_value(self, group: dict[str, Any], value: float) -> None:
        """Set the group's ``param_name`` entry (of a tuple, the first element) to ``value``."""
        old = group[self.param_name]
        group[self.param_name] = (value, *old[1:]) if isinstance(old, (list, tuple)) else value

    def _log(self, optimizer: torch.optim.Optimizer, epoch_id: int, step_id: int, global_step_id: int) -> None:
        if logger.isEnabledFor(logging.INFO):
            name = self.param_name
            values = [
                f"{(v[0] if isinstance(v, (list, tuple)) else v):.6g}"
                for v in (group[name] for group in optimizer.param_groups)
            ]
            # one value when every group has it (groups differing only in weight decay ...)
            shown = values[0] if len(set(values)) == 1 else ", ".join(values)
            logger.info("Epoch[%d] Step[%d] GlobalStep[%d] %s=%s", epoch_id, step_id, global_step_id, name, shown)

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The per-group base lrs (the schedule itself is a function of the loop position)."""
        base = self._base_lrs if self._base_lrs is not None else self._restored_base_lrs
        return {"base_lrs": None if base is None else [float(lr) for lr in base]}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Use the saved base lrs from the next loop begin on (and right away if running)."""
        base = state_dict.get("base_lrs")
        if base is None:
            return
        if not isinstance(base, (list, tuple)) or not all(isinstance(v, (int, float)) for v in base):
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: 'base_lrs' must be a list of numbers, got {base!r}."
            )
        self._restored_base_lrs = [float(v) for v in base]
        if self._base_lrs is not None and len(self._base_lrs) == len(base):
            self._base_lrs = list(self._restored_base_lrs)

    def rebase_from_optimizer(self) -> None:
        """Forget the restored base values: take them from the optimizer's groups at loop begin.

        A resume whose config changed the scheduled option (the lr) loads the config's value into
        the groups' ``initial_<param_name>`` entries; the schedule then starts from it.
        """
        self._restored_base_lrs = None
        self._base_lrs = None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(update_by={self.update_by!r}, warmup_by={self.warmup_by!r}, "
            f"warmup_len={self.warmup_len})"
        )
