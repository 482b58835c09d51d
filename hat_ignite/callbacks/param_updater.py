"""HAT's OptimParamUpdaters: the LR schedules, applied to any entry of the optimizer's param groups.

``StepDecayOptimParamUpdater``, ``CosOptimParamUpdater`` and ``CyclicOptimParamUpdater`` move
``param_name`` (``"weight_decay"``, ``"momentum"``, ``"betas"``...) of every param group with the
schedule of :class:`~.lr_updater.StepDecayLrUpdater`, :class:`~.lr_updater.CosLrUpdater` and
:class:`~.lr_updater.CyclicLrUpdater`: same warmup, same formulas, same "pure function of the
loop position" (see :mod:`~hat_ignite.callbacks.lr_updater_base`), with HAT's argument names
(``param_decay_id``, ``stop_param``, ``warmup_begin_param``, ``warmup_param_ratio``...).

Each group's base value is its ``initial_<param_name>`` entry, set from the group's value the
first time (as ``initial_lr`` is for the lr). For a tuple entry such as Adam's ``betas`` the
schedule moves the first element and keeps the others.

Example, a weight decay warmed up over two steps, then decayed tenfold from step 4 on:

>>> import torch
>>> from hat_ignite.callbacks import CallbackMixin
>>> from hat_ignite.engine import BasicBatchProcessor, Trainer
>>> class RecordWd(CallbackMixin):
...     def __init__(self): self.seen = []
...     def on_step_begin(self, optimizer, **kwargs): self.seen.append(optimizer.param_groups[0]["weight_decay"])
>>> model, record = torch.nn.Linear(2, 1), RecordWd()
>>> trainer = Trainer(
...     model=model, data_loader=[(torch.ones(1, 2),)] * 3, device=None, num_epochs=2,
...     optimizer=torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.01),
...     batch_processor=BasicBatchProcessor(True, loss_collector=lambda out: [out.sum()]),
...     callbacks=[StepDecayOptimParamUpdater("weight_decay", update_by="step", warmup_by="step",
...                                           warmup_len=2, param_decay_id=[4]), record])
>>> _ = trainer.fit()
>>> [round(wd, 6) for wd in record.seen]
[0.0, 0.005, 0.01, 0.01, 0.001, 0.001]
"""

from __future__ import annotations

from typing import Any, Sequence

from hat_ignite.callbacks.lr_updater import CosLrUpdater, CyclicLrUpdater, StepDecayLrUpdater
from hat_ignite.callbacks.lr_updater_base import LrUpdaterBase, annealing_cos

__all__ = [
    "OptimParamUpdaterBase",
    "StepDecayOptimParamUpdater",
    "CosOptimParamUpdater",
    "CyclicOptimParamUpdater",
]


class OptimParamUpdaterBase(LrUpdaterBase):
    """Base of the OptimParamUpdaters: an :class:`~.lr_updater_base.LrUpdaterBase` on ``param_name``.

    HAT's names for the schedule hooks work both ways: a subclass may implement
    :meth:`get_param` (and :meth:`get_warmup_param`) as HAT's do, or ``get_lr`` as LR updaters do.

    Args:
        param_name: the param-group entry to schedule, e.g. ``"weight_decay"`` or ``"betas"``.
        update_by, warmup_by, warmup_len, warmup_mode, step_log_interval: as for
            :class:`~.lr_updater_base.LrUpdaterBase`.
        warmup_begin_param: the value a linear warmup starts from.
        warmup_param_ratio: the warmup ends at ``base * warmup_param_ratio`` (in ``[0, 1]``).
    """

    def __init__(self, param_name: str, update_by: str = "step", warmup_by: str = "step", warmup_len: float = 0,
                 warmup_mode: str = "linear", warmup_begin_param: float = 0.0, warmup_param_ratio: float = 1.0,
                 step_log_interval: int = 1) -> None:
        self._check_param_args(param_name, warmup_begin_param, warmup_param_ratio)
        super().__init__(update_by, warmup_by, warmup_len, warmup_mode, warmup_begin_param, warmup_param_ratio,
                         step_log_interval)
        self.param_name = param_name

    def _check_param_args(self, param_name: Any, warmup_begin_param: Any, warmup_param_ratio: Any) -> None:
        owner = type(self).__name__
        if not isinstance(param_name, str) or not param_name:
            raise ValueError(f"{owner}(param_name={param_name!r}): name a param-group entry, e.g. 'weight_decay'.")
        if isinstance(warmup_begin_param, bool) or not isinstance(warmup_begin_param, (int, float)) \
                or not warmup_begin_param >= 0:
            raise ValueError(f"{owner}(warmup_begin_param={warmup_begin_param!r}): give a non-negative number.")
        if isinstance(warmup_param_ratio, bool) or not isinstance(warmup_param_ratio, (int, float)) \
                or not 0.0 <= warmup_param_ratio <= 1.0:
            raise ValueError(f"{owner}(warmup_param_ratio={warmup_param_ratio!r}): give a ratio in [0, 1].")

    def get_param(self, begin_param: float, num_update: int) -> float:
        """Formal-training value of a group whose base value is ``begin_param`` (HAT's name)."""
        return super().get_lr(begin_param, num_update)

    def get_lr(self, begin_lr: float, num_update: int) -> float:
        return self.get_param(begin_lr, num_update)

    def get_warmup_param(self, warmup_end_param: float, num_update: int) -> float:
        """Warmup value at global step ``num_update``, ending at ``warmup_end_param`` (HAT's name)."""
        return super().get_warmup_lr(warmup_end_param, num_update)

    def get_warmup_lr(self, warmup_end_lr: float, num_update: int) -> float:
        return self.get_warmup_param(warmup_end_lr, num_update)

    def on_loop_begin(self, optimizer: Any = None, data_loader: Any = None, num_epochs: int | None = None,
                      num_steps: int | None = None, loop: Any = None, **kwargs: Any) -> None:
        """As the LR updaters' (HAT calls it with only ``optimizer`` and ``data_loader`` at times)."""
        for i, group in enumerate(getattr(optimizer, "param_groups", ())):
            if self.param_name not in group:
                entries = sorted(k for k in group if k != "params")
                raise ValueError(
                    f"{type(self).__name__}(param_name={self.param_name!r}): param group {i} of "
                    f"{type(optimizer).__name__} has no {self.param_name!r}; its entries are {entries}."
                )
        super().on_loop_begin(optimizer=optimizer, data_loader=data_loader, num_epochs=num_epochs,
                              num_steps=num_steps, loop=loop, **kwargs)

    @property
    def _per_group_init_param(self) -> list[float] | None:
        """Each param group's base value (HAT's attribute name); known from loop begin."""
        return None if self._base_lrs is None else list(self._base_lrs)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, param_name={self.param_name!r})"


class StepDecayOptimParamUpdater(OptimParamUpdaterBase, StepDecayLrUpdater):
    """Warmup, then ``param_decay_factor`` applied once more at each id of ``param_decay_id``.

    Args:
        param_name: the param-group entry to schedule.
        update_by: the ids of ``param_decay_id`` are epoch ids (``"epoch"``) or global step ids.
        warmup_by, warmup_len, warmup_mode, warmup_begin_param, warmup_param_ratio, step_log_interval:
            see :class:`OptimParamUpdaterBase`.
        param_decay_id: ascending ids (after the warmup) from which the value is decayed once more.
        param_decay_factor: the factor, in ``[0, 1]``.

    >>> StepDecayOptimParamUpdater("momentum", param_decay_id=[2], param_decay_factor=0.5).get_param(0.9, 3)
    0.45
    """

    def __init__(self, param_name: str, update_by: str = "epoch", warmup_by: str = "epoch", warmup_len: float = 0,
                 warmup_mode: str = "linear", warmup_begin_param: float = 0.0, warmup_param_ratio: float = 1.0,
                 step_log_interval: int = 1, param_decay_id: Sequence[int] | None = None,
                 param_decay_factor: float = 0.1) -> None:
        self._check_param_args(param_name, warmup_begin_param, warmup_param_ratio)
        ids = list(param_decay_id or [])
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids) or ids != sorted(ids):
            raise ValueError(
                f"StepDecayOptimParamUpdater(param_decay_id={param_decay_id!r}): give ascending non-negative integers."
            )
        if isinstance(param_decay_factor, bool) or not isinstance(param_decay_factor, (int, float)) \
                or not 0.0 <= param_decay_factor <= 1.0:
            raise ValueError(
                f"StepDecayOptimParamUpdater(param_decay_factor={param_decay_factor!r}): give a factor in [0, 1]."
            )
        StepDecayLrUpdater.__init__(
            self, update_by, warmup_by, warmup_len, warmup_mode, warmup_begin_param, warmup_param_ratio,
            step_log_interval, lr_decay_id=ids, lr_decay_factor=param_decay_factor,
        )
        self.param_name = param_name
        self.param_decay_id = self.lr_decay_id
        self.param_decay_factor = self.lr_decay_factor

    def prepare(self) -> None:
        if self.lr_decay_id and self.lr_decay_id[0] < (self.warmup_updates or 0):
            raise ValueError(
                f"StepDecayOptimParamUpdater(param_decay_id={self.lr_decay_id}): the first decay "
                f"({self.lr_decay_id[0]}) falls inside the warmup ({self.warmup_updates} {self.update_by}s). "
                f"Decay after the warmup."
            )


class CosOptimParamUpdater(OptimParamUpdaterBase, CosLrUpdater):
    """Cosine decay, step by step, from each group's base value to ``stop_param`` after the warmup.

    Args:
        param_name: the param-group entry to schedule.
        max_steps: steps of formal training; ``-1`` (default) is the run's steps minus the warmup
            steps (the run's steps are ``num_epochs * len(data_loader)`` whenever the loop has
            ``num_epochs``, else ``num_steps``). Once the loop begins, ``max_steps`` holds that
            length. After it the value stays at ``stop_param`` (HAT's cosine would rise again).
        stop_param: the value the decay approaches.
        decay_only: leave a group whose base value is below ``stop_param`` at its base value
            (the schedule only ever decreases a value).
        warmup_by, warmup_len, warmup_mode, warmup_begin_param, warmup_param_ratio, step_log_interval:
            see :class:`OptimParamUpdaterBase`.

    >>> up = CosOptimParamUpdater("weight_decay", max_steps=4, stop_param=0.5, decay_only=True)
    >>> [up.get_param(1.0, 2), up.get_param(0.1, 2)]
    [0.75, 0.1]
    """

    def __init__(self, param_name: str, max_steps: int = -1, stop_param: float = 0.0, decay_only: bool = False,
                 warmup_by: str = "step", warmup_len: float = 0, warmup_mode: str = "linear",
                 warmup_begin_param: float = 0.0, warmup_param_ratio: float = 1.0, step_log_interval: int = 1) -> None:
        self._check_param_args(param_name, warmup_begin_param, warmup_param_ratio)
        CosLrUpdater.__init__(
            self, max_steps=max_steps, max_epoch=-1, stop_lr=stop_param, warmup_by=warmup_by,
            warmup_len=warmup_len, warmup_mode=warmup_mode, warmup_begin_lr=warmup_begin_param,
            warmup_lr_ratio=warmup_param_ratio, step_log_interval=step_log_interval,
        )
        self.param_name = param_name
        self.stop_param = self.stop_lr
        self.decay_only = bool(decay_only)
        self._max_steps_arg = self.max_steps

    def prepare(self) -> None:
        self.max_steps = self._max_steps_arg  # each run sizes itself again from the configured value
        self._decay_steps = None if self.max_steps < 0 else self.max_steps
        super().prepare()
        span = self._decay_steps
        if span is not None and float(span).is_integer():
            self.max_steps = int(span)  # as HAT, the attribute tells the decay length in use

    def get_param(self, begin_param: float, num_update: int) -> float:
        if self.decay_only and begin_param < self.stop_param:
            return begin_param
        return CosLrUpdater.get_lr(self, begin_param, num_update)


class CyclicOptimParamUpdater(OptimParamUpdaterBase, CyclicLrUpdater):
    """Cosine cycles by step: up from each group's base ``b`` to ``b * target_ratio[0]``, down to ``b * target_ratio[1]``.

    The run's steps (``num_epochs * len(data_loader)`` whenever the loop has ``num_epochs``, else
    ``num_steps``) are split into ``cyclic_times`` cycles; the first ``int(step_ratio_up * cycle)``
    steps of each go up.

    Args:
        param_name: the param-group entry to schedule.
        target_ratio: ``(peak ratio, final ratio)`` relative to the base value.
        cyclic_times: number of cycles in the run.
        step_ratio_up: fraction of each cycle spent going up, in ``[0, 1]``.
        step_log_interval: see :class:`OptimParamUpdaterBase`.
    """

    def __init__(self, param_name: str, target_ratio: Sequence[float] = (10, 1e-4), cyclic_times: int = 1,
                 step_ratio_up: float = 0.4, step_log_interval: int = 1) -> None:
        self._check_param_args(param_name, 0.0, 1.0)
        CyclicLrUpdater.__init__(self, target_ratio, cyclic_times, step_ratio_up, step_log_interval)
        self.param_name = param_name

    @staticmethod
    def annealing_cos(start: float, end: float, pct: float) -> float:
        """Cosine anneal from ``start`` to ``end`` as ``pct`` goes from 0.0 to 1.0."""
        return annealing_cos(start, end, pct)
