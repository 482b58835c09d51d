"""HAT's seven LR updaters. Each is a formula over :class:`~.lr_updater_base.LrUpdaterBase`.

Notation: ``b`` is a param group's base lr, ``n`` the update index (``global_step_id`` or
``epoch_id``), ``w`` the warmup length in update units (``warmup_updates``).

=========================  =====================================================================
updater                    formal-training lr
=========================  =====================================================================
PolyLrUpdater              ``final + (b - final) * (1 - min(n - w, T) / T) ** power``, T=max_update
StepDecayLrUpdater         ``b * factor ** (number of lr_decay_id entries <= n)``
CosLrUpdater               ``stop + (b - stop) * (1 + cos(pi * min(n - w, T) / T)) / 2`` per step
CosineAnnealingLrUpdater   ``stop + (b - stop) * (1 + cos(pi * n / E)) / 2`` per epoch, E epochs
OneCycleUpdater            cosine up from ``lr_max / div_factor`` to ``b``, then down to ``stop_lr``
CyclicLrUpdater            cosine ``b -> b * r0 -> b * r1`` repeated ``cyclic_times`` times
NoamLrUpdater              ``b * d_model ** 0.5 * min(s ** -0.5, s * warmup_step ** -1.5)``, s=n+1
=========================  =====================================================================

Example, a two-step warmup then a linear decay over four steps:

>>> import torch
>>> from hat_ignite.callbacks import CallbackMixin
>>> from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index
>>> class RecordLr(CallbackMixin):
...     def __init__(self): self.lrs = []
...     def on_step_begin(self, optimizer, **kwargs): self.lrs.append(optimizer.param_groups[0]["lr"])
>>> model = torch.nn.Linear(2, 1)
>>> record = RecordLr()
>>> trainer = Trainer(
...     model=model, data_loader=[(torch.ones(1, 2),)] * 3, device=None, num_epochs=2,
...     optimizer=torch.optim.SGD(model.parameters(), lr=0.4),
...     batch_processor=BasicBatchProcessor(True, loss_collector=lambda out: [out.sum()]),
...     callbacks=[PolyLrUpdater(max_update=4, warmup_len=2), record])
>>> _ = trainer.fit()
>>> [round(lr, 6) for lr in record.lrs]
[0.0, 0.2, 0.4, 0.3, 0.2, 0.1]
"""

from __future__ import annotations

import bisect
from typing import Any, Sequence

from hat_ignite.callbacks.lr_updater_base import LrUpdaterBase, annealing_cos

__all__ = [
    "PolyLrUpdater",
    "StepDecayLrUpdater",
    "CosLrUpdater",
    "CosineAnnealingLrUpdater",
    "OneCycleUpdater",
    "CyclicLrUpdater",
    "NoamLrUpdater",
]

def _positive(value: Any, name: str, owner: str, integer: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0:
        raise ValueError(f"{owner}({name}={value!r}): give a positive {'integer' if integer else 'number'}.")


class PolyLrUpdater(LrUpdaterBase):
    """Polynomial decay from the base lr to ``final_lr`` over ``max_update`` updates after warmup.

    Args:
        max_update: updates of formal training (warmup not included).
        update_by: ``"step"`` or ``"epoch"``.
        power: exponent of the decay (1.0 is linear).
        final_lr: lr once ``max_update`` updates are done.
        warmup_by, warmup_mode, warmup_len, warmup_begin_lr, warmup_lr_ratio, step_log_interval:
            see :class:`~.lr_updater_base.LrUpdaterBase`.

    >>> PolyLrUpdater(max_update=10, power=2.0).get_lr(0.1, 5)
    0.025
    """

    def __init__(self, max_update: int, update_by: str = "step", power: float = 1.0, final_lr: float = 0.0,
                 warmup_by: str = "step", warmup_mode: str = "linear", warmup_len: float = 0,
                 warmup_begin_lr: float = 0.0, warmup_lr_ratio: float = 1.0, step_log_interval: int = 1) -> None:
        super().__init__(
            update_by, warmup_by, warmup_len, warmup_mode, warmup_begin_lr, warmup_lr_ratio, step_log_interval
        )
        _positive(max_update, "max_update", "PolyLrUpdater", integer=True)
        self.max_update = max_update
        self.power = float(power)
        self.final_lr = float(final_lr)

    def get_lr(self, begin_lr: float, num_update: int) -> float:
        done = min(max(num_update - (self.warmup_updates or 0), 0), self.max_update)
        return self.final_lr + (begin_lr - self.final_lr) * (1.0 - done / self.max_update) ** self.power


class StepDecayLrUpdater(LrUpdaterBase):
    """Multiply the base lr by ``lr_decay_factor`` at each id of ``lr_decay_id``.

    Args:
        update_by: ids in ``lr_decay_id`` are epoch ids (``"epoch"``) or global step ids.
        lr_decay_id: ascending ids (after the warmup) from which the lr is decayed once more.
        lr_decay_factor: the factor, in ``[0, 1]``.
        warmup_by, warmup_len, warmup_mode, warmup_begin_lr, warmup_lr_ratio, step_log_interval:
            see :class:`~.lr_updater_base.LrUpdaterBase`.

    >>> up = StepDecayLrUpdater(lr_decay_id=[3, 6], lr_decay_factor=0.1)
    >>> [round(up.get_lr(1.0, n), 6) for n in (0, 2, 3, 5, 6, 9)]
    [1.0, 1.0, 0.1, 0.1, 0.01, 0.01]
    """

    def __init__(self, update_by: str = "epoch", warmup_by: str = "epoch", warmup_len: float = 0,
                 warmup_mode: str = "linear", warmup_begin_lr: float = 0.0, warmup_lr_ratio: float = 1.0,
                 step_log_interval: int = 1, lr_decay_id: Sequence[int] | None = None,
                 lr_decay_factor: float = 0.1) -> None:
        super().__init__(
            update_by, warmup_by, warmup_len, warmup_mode, warmup_begin_lr, warmup_lr_ratio, step_log_interval
        )
        ids = list(lr_decay_id or [])
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids) or ids != sorted(ids):
            raise ValueError(
                f"StepDecayLrUpdater(lr_decay_id={lr_decay_id!r}): give ascending non-negative integers."
            )
        if not 0.0 <= lr_decay_factor <= 1.0:
            raise ValueError(f"StepDecayLrUpdater(lr_decay_factor={lr_decay_factor!r}): give a factor in [0, 1].")
        self.lr_decay_id = ids
        self.lr_decay_factor = float(lr_decay_factor)

    def prepare(self) -> None:
        if self.lr_decay_id and self.lr_decay_id[0] < (self.warmup_updates or 0):
            raise ValueError(
                f"StepDecayLrUpdater(lr_decay_id={self.lr_decay_id}): the first decay ({self.lr_decay_id[0]}) "
                f"falls inside the warmup ({self.warmup_updates} {self.update_by}s). Decay after the warmup."
            )

    def get_lr(self, begin_lr: float, num_update: int) -> float:
        return begin_lr * self.lr_decay_factor ** bisect.bisect_right(self.lr_decay_id, num_update)


class CosLrUpdater(LrUpdaterBase):
    """Cosine decay, step by step, from the base lr to ``stop_lr`` over ``max_steps`` after warmup.

    Args:
        max_steps: steps of formal training; ``-1`` (default) is the run's steps minus the
            warmup steps (the run's steps are ``num_epochs * len(data_loader)`` whenever the
            loop has ``num_epochs``, even with ``stop_by="step"``, else ``num_steps``). After
            ``max_steps`` the lr stays at ``stop_lr`` (HAT's cosine would rise again).
        max_epoch: if positive, ``max_steps`` is ``max_epoch * len(data_loader)`` minus the
            warmup steps, whatever ``max_steps`` says.
        stop_lr: the lr the decay approaches.
        warmup_by, warmup_len, warmup_mode, warmup_begin_lr, warmup_lr_ratio, step_log_interval:
            see :class:`~.lr_updater_base.LrUpdaterBase`.

    >>> up = CosLrUpdater(max_steps=4, stop_lr=0.0)
    >>> [round(up.get_lr(1.0, n), 6) for n in range(6)]
    [1.0, 0.853553, 0.5, 0.146447, 0.0, 0.0]
    """

    def __init__(self, max_steps: int = -1, max_epoch: int = -1, stop_lr: float = 0.0, warmup_by: str = "step",
                 warmup_len: float = 0, warmup_mode: str = "linear", warmup_begin_lr: float = 0.0,
                 warmup_lr_ratio: float = 1.0, step_log_interval: int = 1) -> None:
        super().__init__(
            "step", warmup_by, warmup_len, warmup_mode, warmup_begin_lr, warmup_lr_ratio, step_log_interval
        )
        if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int)):
            raise ValueError(f"CosLrUpdater(max_steps={max_steps!r}): give an integer, or -1 for the whole run.")
        if max_epoch is not None and (isinstance(max_epoch, bool) or not isinstance(max_epoch, int)):
            raise ValueError(f"CosLrUpdater(max_epoch={max_epoch!r}): give an integer, or -1 to use max_steps.")
        #: Steps of formal training: the argument until loop begin, then the steps derived from
        #: the run (as HAT reads it after loop begin).
        self.max_steps: float = -1 if max_steps is None else max_steps
        self.max_epoch = -1 if max_epoch is None else max_epoch
        self.stop_lr = float(stop_lr)
        self._max_steps_arg: float = self.max_steps
        self._decay_steps: float | None = self.max_steps if self.max_steps >= 0 and self.max_epoch <= 0 else None

    def prepare(self) -> None:
        if self.max_epoch > 0:
            spe = self.require(self.step_per_epoch, "the steps per epoch (max_epoch)")
            self._decay_steps = self.max_epoch * spe - self.warmup_steps
        elif self._max_steps_arg < 0:
            total = self.require(self.total_steps, "the run's total steps (max_steps=-1)")
            self._decay_steps = total - self.warmup_steps
        # derived anew from the argument at every loop begin (a later stage recomputes it)
        self.max_steps = self.require(self._decay_steps, "max_steps")

    def get_lr(self, begin_lr: float, num_update: int) -> float:
        span = self.require(self._decay_steps, "max_steps")
        if span <= 0:
            return begin_lr
        done = min(max(num_update - self.warmup_steps, 0), span)
        return annealing_cos(begin_lr, self.stop_lr, done / span)


class CosineAnnealingLrUpdater(LrUpdaterBase):
    """Cosine annealing by epoch over the whole run: ``epoch_id / num_epochs`` sets the phase.

    The phase counts from epoch 0, so a warmup replaces the first part of the curve. The run's
    epochs are the loop's ``num_epochs`` (also with ``stop_by="step"``), else
    ``ceil(num_steps / len(data_loader))``.

    Args:
        stop_lr: the lr the curve approaches at the end of the run.
        warmup_by, warmup_len, warmup_mode, warmup_begin_lr, warmup_lr_ratio, step_log_interval:
            see :class:`~.lr_updater_base.LrUpdaterBase`.

    >>> up = CosineAnnealingLrUpdater(stop_lr=0.0)
    >>> up.total_epochs = 4
    >>> [round(up.get_lr(1.0, e), 6) for e in range(4)]
    [1.0, 0.853553, 0.5, 0.146447]
    """

    def __init__(self, stop_lr: float = 0.0, warmup_by: str = "step", warmup_len: float = 0,
                 warmup_mode: str = "linear", warmup_begin_lr: float = 0.0, warmup_lr_ratio: float = 1.0,
                 step_log_interval: int = 1) -> None:
        super().__init__(
            "epoch", warmup_by, warmup_len, warmup_mode, warmup_begin_lr, warmup_lr_ratio, step_log_interval
        )
        self.stop_lr = float(stop_lr)

    def prepare(self) -> None:
        self.require(self.total_epochs, "the run's number of epochs")

    def get_lr(self, begin_lr: float, num_update: int) -> float:
        epochs = self.require(self.total_epochs, "the run's number of epochs")
        return annealing_cos(begin_lr, self.stop_lr, min(num_update / epochs, 1.0))


class OneCycleUpdater(LrUpdaterBase):
    """One cycle by step: cosine up from ``lr_max / div_factor`` to each group's lr, then down.

    Over a run of ``N`` steps (``num_epochs * len(data_loader)`` whenever the loop has
    ``num_epochs``, else ``num_steps``) the first ``W = pct_start * N`` steps go up, from
    ``lr_max / div_factor`` (the same start for every param group) to the group's own lr; the
    remaining ``N - W`` steps go down from the group's lr to ``stop_lr``. As in HAT, ``lr_max``
    only sets the starting lr: each group peaks at its own optimizer lr.

    Args:
        lr_max: sets the starting lr ``lr_max / div_factor``.
        div_factor: see ``lr_max``.
        pct_start: fraction of the run spent going up, in ``(0, 1)``.
        stop_lr: the lr the cycle approaches at the end of the run.
        warmup_by: accepted for HAT configs; the cycle moves by step either way.
        step_log_interval: see :class:`~.lr_updater_base.LrUpdaterBase`.

    >>> up = OneCycleUpdater(lr_max=0.1, div_factor=10.0, pct_start=0.5)
    >>> up.warmup_steps, up._down_steps = 2.0, 2.0
    >>> [round(up.lr_at(0.05, 0, g), 6) for g in range(4)]
    [0.01, 0.03, 0.05, 0.025]
    """

    def __init__(self, lr_max: float = 0.001, div_factor: float = 10.0, pct_start: float = 0.4,
                 stop_lr: float = 0.0, warmup_by: str = "step", step_log_interval: int = 1) -> None:
        super().__init__("step", warmup_by, 0, "linear", 0.0, 1.0, step_log_interval)
        _positive(lr_max, "lr_max", "OneCycleUpdater")
        _positive(div_factor, "div_factor", "OneCycleUpdater")
        if not 0.0 < pct_start < 1.0:
            raise ValueError(f"OneCycleUpdater(pct_start={pct_start!r}): give a fraction in (0, 1).")
        self.lr_max = float(lr_max)
        self.div_factor = float(div_factor)
        #: The lr the cycle starts from, the same for every param group (HAT's attribute).
        self.warmup_begin_lr = self.lr_max / self.div_factor
        self.pct_start = float(pct_start)
        self.stop_lr = float(stop_lr)
        self._down_steps: float | None = None
        #: Steps going down, known from loop begin (HAT's attribute).
        self.max_steps: float | None = None

    @staticmethod
    def annealing_cos(start: float, end: float, pct: float) -> float:
        """Cosine anneal from ``start`` to ``end`` as ``pct`` goes from 0.0 to 1.0."""
        return annealing_cos(start, end, pct)

    def prepare(self) -> None:
        total = self.require(self.total_steps, "the run's number of steps")
        self.warmup_steps = total * self.pct_start
        self.warmup_updates = self.warmup_steps
        self._down_steps = self.max_steps = total - self.warmup_steps

    def get_warmup_lr(self, warmup_end_lr: float, num_update: int) -> float:
        return annealing_cos(self.warmup_begin_lr, warmup_end_lr, num_update / self.warmup_steps)

    def get_lr(self, begin_lr: float, num_update: int) -> float:
        span = self.require(self._down_steps, "the run's length")
        return annealing_cos(begin_lr, self.stop_lr, min((num_update - self.warmup_steps) / span, 1.0))


class CyclicLrUpdater(LrUpdaterBase):
    """Cosine cycles by step: up from ``b`` to ``b * target_ratio[0]``, down to ``b * target_ratio[1]``.

    The run's steps (``num_epochs * len(data_loader)`` whenever the loop has ``num_epochs``,
    else ``num_steps``) are split into ``cyclic_times`` cycles of ``total_steps // cyclic_times``
    steps; the first ``int(step_ratio_up * cycle)`` steps of each go up.

    Args:
        target_ratio: ``(peak ratio, final ratio)`` relative to the base lr.
        cyclic_times: number of cycles in the run.
        step_ratio_up: fraction of each cycle spent going up, in ``[0, 1]``.
        step_log_interval: see :class:`~.lr_updater_base.LrUpdaterBase`.
    """

    def __init__(self, target_ratio: Sequence[float] = (10, 1e-4), cyclic_times: int = 1,
                 step_ratio_up: float = 0.4, step_log_interval: int = 1) -> None:
        super().__init__("step", "step", 0, "linear", 0.0, 1.0, step_log_interval)
        if len(target_ratio) != 2:
            raise ValueError(f"CyclicLrUpdater(target_ratio={target_ratio!r}): give two ratios (peak, final).")
        _positive(cyclic_times, "cyclic_times", "CyclicLrUpdater", integer=True)
        if not 0.0 <= step_ratio_up <= 1.0:
            raise ValueError(f"CyclicLrUpdater(step_ratio_up={step_ratio_up!r}): give a fraction in [0, 1].")
        self.target_ratio = (float(target_ratio[0]), float(target_ratio[1]))
        self.cyclic_times = cyclic_times
        self.step_ratio_up = float(step_ratio_up)
        self.cycle_len: int | None = None
        self.up_len: int | None = None

    def prepare(self) -> None:
        total = self.require(self.total_steps, "the run's total steps")
        self.cycle_len = total // self.cyclic_times
        if self.cycle_len < 1:
            raise ValueError(
                f"CyclicLrUpdater(cyclic_times={self.cyclic_times}): the run has only {total} steps; "
                f"use at most {total} cycles."
            )
        self.up_len = int(self.step_ratio_up * self.cycle_len)

    def get_lr(self, begin_lr: float, num_update: int) -> float:
        cycle = self.require(self.cycle_len, "the cycle length")
        up = self.up_len or 0
        n = num_update % cycle
        peak, final = begin_lr * self.target_ratio[0], begin_lr * self.target_ratio[1]
        if n < up:
            return annealing_cos(begin_lr, peak, n / up)
        return annealing_cos(peak, final, (n - up) / (cycle - up))


class NoamLrUpdater(LrUpdaterBase):
    """The Transformer schedule ("Attention Is All You Need"): linear rise, then ``1/sqrt`` decay.

    ``lr = b * d_model ** 0.5 * min(s ** -0.5, s * warmup_step ** -1.5)`` with ``s = n + 1``
    (the number of updates including this one). The warmup is part of the formula, hence its
    own ``warmup_step`` argument.

    The factor is ``d_model ** 0.5``, as HAT's code computes it (and HAT configs were tuned
    against), not the paper's ``d_model ** -0.5`` that HAT's docstring shows; with the paper's
    scaling in mind, divide the optimizer's lr by ``d_model``.

    Args:
        d_model: model dimension in the formula.
        warmup_step: updates until the peak.
        update_by: ``"step"`` or ``"epoch"``.
        step_log_interval: see :class:`~.lr_updater_base.LrUpdaterBase`.

    >>> up = NoamLrUpdater(d_model=16, warmup_step=4)
    >>> [round(up.get_lr(1.0, n), 6) for n in (0, 3, 15)]
    [0.5, 2.0, 1.0]
    """

    def __init__(self, d_model: float = 256, warmup_step: float = 4000, update_by: str = "step",
                 step_log_interval: int = 1) -> None:
        super().__init__(update_by, update_by, 0, "linear", 0.0, 1.0, step_log_interval)
        _positive(d_model, "d_model", "NoamLrUpdater")
        _positive(warmup_step, "warmup_step", "NoamLrUpdater")
        self.d_model = d_model
        self.warmup_step = warmup_step

    def get_lr(self, begin_lr: float, num_update: int) -> float:
        s = num_update + 1
        return begin_lr * self.d_model ** 0.5 * min(s ** -0.5, s * self.warmup_step ** -1.5)

    def get_warmup_lr(self, warmup_end_lr: float, num_update: int) -> float:
        """The warmup is inside :meth:`get_lr`; this is the same formula."""
        return self.get_lr(warmup_end_lr, num_update)
