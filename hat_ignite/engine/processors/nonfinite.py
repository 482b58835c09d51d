"""NaN / Inf guard of the batch processors: a non-finite loss or gradient never updates the model.

:class:`NonFiniteGuard` works in one of two ways, chosen per optimizer (:meth:`NonFiniteGuard.on_device`):

* **on the device** without an enabled ``GradScaler``, for optimizers that skip an update
  themselves on a ``found_inf`` flag (``fused=True``) under either policy, and for every other
  optimizer under ``policy="raise"``: each backward's loss is kept
  (:meth:`NonFiniteGuard.note_loss`), the update's flags are set on the device
  (:meth:`NonFiniteGuard.check_on_device`), a fused optimizer skips on them, and they are read a
  step or more later (:meth:`NonFiniteGuard.after_step`, :meth:`NonFiniteGuard.flush`), see
  :mod:`~hat_ignite.engine.processors.nonfinite_device`. No host read per step. An optimizer that
  cannot skip (plain ``SGD``, ``AdamW``) applies the bad update in memory; the run raises when the
  flags are read, and every checkpoint write and stop reads them first, so nothing of it is saved.
* **blocking** otherwise (``policy="skip"`` with an optimizer that cannot skip, or a GradScaler): :meth:`NonFiniteGuard.check_loss` reads the loss after it is collected
  (before the backward on the CPU, right after it on an accelerator) and
  :meth:`NonFiniteGuard.allow_update` the gradients' flag right before the optimizer step (unless a
  ``GradScaler`` is active, which finds and skips fp16 overflow itself: its normal work, not an
  error), and answers whether the step may run.

With ``policy="raise"`` (the default) the first non-finite value raises
:class:`~hat_ignite.errors.NonFiniteLossError` naming the epoch, step, sub-batch and the loss
values (and, blocking, the parameter names); the parameters (and the optimizer's state) are
those of the step before. With ``policy="skip"`` the step's update is dropped instead, counted
in ``engine.state.nonfinite_skipped`` and logged, and training goes on.

Every decision is the same on every rank: the flags are all-reduced when more than one process
trains (:func:`all_ranks_finite` in the blocking way), so every rank raises or skips together
instead of one rank leaving the others waiting in a collective.

>>> guard = NonFiniteGuard(policy="skip")
>>> guard.policy, guard.check_grad
('skip', True)
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import ignite.distributed as idist
import torch

from hat_ignite.engine.processors.nonfinite_device import DeviceFlags
from hat_ignite.errors import NonFiniteLossError

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["NONFINITE_POLICIES", "NonFiniteGuard", "all_ranks_finite", "grads_finite", "in_distributed_run", "describe_losses"]

logger = logging.getLogger(__name__)

#: Accepted values of the processors' ``nonfinite_policy`` argument.
NONFINITE_POLICIES = ("raise", "skip")

_MAX_NAMED = 5
_KEPT_DROPS = 256  # dropped updates remembered for update_dropped(): readers ask about recent steps only


_DIST = torch.distributed.is_available()


def in_distributed_run() -> bool:
    """Whether a torch.distributed process group is up (then every check must all-reduce).

    >>> in_distributed_run()
    False
    """
    return _DIST and torch.distributed.is_initialized()


def all_ranks_finite(finite: bool) -> bool:
    """Whether ``finite`` holds on every process (the local flag in a single-process run).

    With more than one process (``idist.get_world_size() > 1``) the flags are all-reduced, so
    every rank takes the same decision; each rank must then call this at the same point.

    >>> all_ranks_finite(True), all_ranks_finite(False)
    (True, False)
    """
    if idist.get_world_size() <= 1:
        return finite
    flag = torch.tensor([0.0 if finite else 1.0], device=idist.device())
    # Ignite's stub: a tensor in gives a tensor
    return float(idist.all_reduce(flag).item()) == 0.0  # type: ignore[union-attr]


def _value(t: torch.Tensor) -> float:
    return float(t.detach().float().sum())


def describe_losses(losses: Any, model_outs: Any = None) -> str:
    """``key=value`` for every collected loss (and non-finite scalar model outputs).

    >>> describe_losses({"cls_loss": torch.tensor(float("nan")), "reg_loss": torch.tensor(0.5)})
    'cls_loss=nan, reg_loss=0.5'
    """
    if isinstance(losses, Mapping):
        parts = [f"{k}={_value(v)}" for k, v in losses.items() if v is not None]
    elif isinstance(losses, torch.Tensor):
        parts = [f"loss={_value(losses)}"]
    else:
        parts = [f"losses[{i}]={_value(v)}" for i, v in enumerate(losses or ()) if v is not None]
    if isinstance(model_outs, Mapping):  # name the model outputs behind the numbers
        named = [
            f"{k}={_value(v)}" for k, v in model_outs.items()
            if isinstance(v, torch.Tensor) and v.numel() == 1 and not torch.isfinite(v).all()
        ]
        if named:
            parts.append("non-finite model outputs: " + ", ".join(named))
    return ", ".join(parts) or "no loss tensors"


def _where(state: Any, batch_idx: int) -> str:
    return (
        f"epoch_id={state.epoch - 1}, step_id={getattr(state, 'step_id', state.iteration - 1)}, "
        f"global_step_id={state.iteration - 1}, batch_idx={batch_idx}"
    )


class _ParamList:
    """The parameters of an optimizer as one flat tuple, listed again only when it changes.

    A step reads every ``p.grad`` anew (``zero_grad(set_to_none=True)`` frees them), but not the
    parameter groups: those are listed again when the optimizer, a group's list of parameters or
    its length is another one, e.g. after ``add_param_group``.
    """

    __slots__ = ("optimizer", "key", "params")

    def __init__(self) -> None:
        self.optimizer: Any = None
        self.key: tuple = ()
        self.params: tuple[torch.Tensor, ...] = ()

    def grads(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        groups = optimizer.param_groups
        if len(groups) == 1:
            params = groups[0]["params"]
            key: tuple = (id(params), len(params))
        else:
            key = tuple((id(group["params"]), len(group["params"])) for group in groups)
        if optimizer is not self.optimizer or key != self.key:
            self.optimizer, self.key = optimizer, key
            self.params = tuple(p for group in groups for p in group["params"])
        # a plain loop: a list comprehension is a function call of its own in Python 3.11,
        # about 1 µs a step inside the training loop
        grads = []
        for p in self.params:
            grad = p.grad
            if grad is not None:
                grads.append(grad)
        return grads


def grads_finite(grads: list[torch.Tensor]) -> bool:
    """Whether every gradient is free of NaN/Inf: a blocking read (the path of optimizers that
    cannot skip an update on the device).

    Uses the fused check GradScaler itself runs (with an unscale factor of exactly 1, which leaves
    the gradients bit for bit as they are) and reads its flag once. The flag is allocated once per
    device. Gradients spread over several devices or dtypes the fused op refuses take the
    per-tensor path.

    >>> grads_finite([torch.ones(3), torch.zeros(2, 2)]), grads_finite([torch.tensor([1.0, float("nan")])])
    (True, False)
    """
    if not grads:
        return True
    first = grads[0]
    flags = _FLAGS.get("cpu") if first.is_cpu else _FLAGS.get(first.device)
    if flags is None:
        flags = _make_flags(first.device)
    found, one = flags  # ``found`` is kept at 0 between checks: it is reset only after it was set
    try:
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, one)
    except (RuntimeError, AttributeError):
        found.zero_()
        return math.isfinite(torch.stack([g.float().sum() for g in grads]).sum().item())
    if found.item() == 0.0:
        return True
    found.zero_()
    return False


def _make_flags(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    flags = _FLAGS["cpu" if device.type == "cpu" else device] = (torch.zeros(1, device=device), torch.ones(1, device=device))
    return flags


# device ("cpu" for the CPU) -> (found-inf flag, unscale factor 1): made on first use and reused,
# so a check allocates nothing
_FLAGS: dict[Any, tuple[torch.Tensor, torch.Tensor]] = {}


def _all_finite(losses: Any) -> bool:
    """Whether every loss tensor in ``losses`` (a tensor, mapping or sequence) is finite (reads them)."""
    values = losses.values() if isinstance(losses, Mapping) else [losses] if isinstance(losses, torch.Tensor) else losses
    return all(bool(torch.isfinite(v.detach()).all()) for v in values if isinstance(v, torch.Tensor))


def _nonfinite_parameter_names(engine: LoopBase) -> list[str]:
    """Names of the parameters whose gradient holds NaN/Inf (the slow path, after a failure)."""
    names = [
        name for name, p in engine.model.named_parameters()
        if p.grad is not None and not bool(torch.isfinite(p.grad).all())
    ]
    shown = names[:_MAX_NAMED]
    return shown + ([f"(+{len(names) - _MAX_NAMED} more)"] if len(names) > _MAX_NAMED else [])


class NonFiniteGuard:
    """Decides what a NaN/Inf loss or gradient does to a training step (see the module docs).

    Args:
        policy: ``"raise"`` (stop with :class:`~hat_ignite.errors.NonFiniteLossError` before
            the update) or ``"skip"`` (drop the step's update, count it, go on).
        check_grad: check the gradients before each optimizer step (skipped while an enabled
            ``GradScaler`` handles fp16 overflow).
    """

    def __init__(self, policy: str = "raise", check_grad: bool = True) -> None:
        if policy not in NONFINITE_POLICIES:
            raise ValueError(
                f"nonfinite_policy={policy!r}: use 'raise' (stop before the update) or 'skip' "
                f"(drop the update of a step with a NaN/Inf loss or gradient and count it)."
            )
        self.policy = policy
        self.check_grad = bool(check_grad)
        self._params = _ParamList()
        #: Why the pending update must be dropped (skip policy), ``None`` when it may run.
        self.pending: str | None = None
        #: The on-device flags (made at the first update that uses them), see nonfinite_device.
        self.device_flags: DeviceFlags | None = None
        self._losses: list[torch.Tensor] = []  # the update's detached total losses (on-device mode)
        self._update_losses: list[torch.Tensor] = []  # those of the update checked last
        self._mode_for: tuple[Any, Any] = (None, None)  # (optimizer, scaler) the mode was chosen for
        self._on_device = False
        #: Whether the optimizer skips an update itself on the device flag (``fused=True``).
        self.skips_on_device = False
        #: The global step id up to which every update's outcome (done or dropped) is known.
        self.known_through = -1
        self._dropped: deque[tuple[int, int]] = deque(maxlen=_KEPT_DROPS)  # (first, last) steps of dropped updates
        self._last_update: int | None = None  # the global step id of the last update decided or queued

    # -- outcomes: which steps' updates were dropped ---------------------------------------------
    def _group_first(self, step: int) -> int:
        """The first step of the update ending at ``step`` (several with gradient accumulation)."""
        last = self._last_update
        self._last_update = step
        return last + 1 if last is not None and last < step else step

    def _decided(self, first: int, step: int, dropped: bool) -> None:
        if dropped:
            self._dropped.append((first, step))
        self.known_through = max(self.known_through, step)

    def update_dropped(self, global_step_id: int) -> bool | None:
        """Whether the update that step ``global_step_id`` fed was dropped (``policy="skip"``).

        ``None`` while it is not known yet: the flag is still on its way from the device
        (a step or more; :meth:`flush` reads every pending one).

        >>> guard = NonFiniteGuard(policy="skip")
        >>> guard._decided(guard._group_first(0), 0, dropped=True)
        >>> guard.update_dropped(0), guard.update_dropped(1)
        (True, None)
        """
        if global_step_id > self.known_through:
            return None
        return any(first <= global_step_id <= last for first, last in self._dropped)

    # -- on-device mode: no host read per step ------------------------------------------------
    def on_device(self, optimizer: Any, scaler: Any) -> bool:
        """Whether this update is guarded on the device (the optimizer skips itself on a flag).

        True for optimizers that take a ``found_inf`` flag (``fused=True`` SGD, Adam, AdamW...)
        while no enabled GradScaler steps them. Otherwise the check reads the flags on the host at
        every step, which the log says once.
        """
        if optimizer is self._mode_for[0] and scaler is self._mode_for[1]:
            return self._on_device
        self._mode_for = (optimizer, scaler)
        scaled = scaler is not None and scaler.is_enabled()
        self.skips_on_device = bool(getattr(optimizer, "_step_supports_amp_scaling", False))
        self._on_device = not scaled and (self.skips_on_device or self.policy == "raise")
        name = type(optimizer).__name__
        if not self._on_device:
            why = ("a GradScaler steps the optimizer" if scaled else
                   f"nonfinite_policy='skip' needs the optimizer to skip an update, and {name} cannot "
                   f"skip one on the device (no fused=True)")
            logger.info(
                "NaN/Inf guard: %s, so the %s checked with a blocking host read at every step. "
                "A fused optimizer (e.g. torch.optim.SGD(..., fused=True)) without GradScaler is checked "
                "on the device instead.", why, "loss is" if scaled or not self.check_grad else "loss and gradients are",
            )
        elif not self.skips_on_device:
            logger.info(
                "NaN/Inf guard: checked on the device and read a step or more later (no host read per "
                "step). %s cannot skip an update on the device (no fused=True), so a non-finite step's "
                "update reaches the parameters in memory before the run stops naming that step; no "
                "checkpoint is written after it.", name,
            )
        return self._on_device

    def note_loss(self, loss: torch.Tensor) -> None:
        """Keep a backward's total loss for the device check of the coming update."""
        self._losses.append(loss.detach())

    def check_on_device(self, engine: LoopBase) -> DeviceFlags:
        """Set the device flags of this update (all-reduced across processes); nothing is read."""
        losses = self._losses
        grads = self._params.grads(engine.optimizer) if self.check_grad else []
        flags = self.device_flags
        if flags is None:
            first = losses[0] if losses else (grads[0] if grads else None)
            device = first.device if first is not None else engine.torch_device
            flags = self.device_flags = DeviceFlags(device, sticky=self.policy == "raise")
        flags.check(losses, grads, engine.multi_process)
        self._update_losses, self._losses = losses, []
        return flags

    def after_step(self, engine: LoopBase, final: bool = False) -> None:
        """Note the update just queued, then act on every earlier update whose flags arrived."""
        flags = self.device_flags
        if flags is None:
            return
        skip = self.policy == "skip"
        if not final:
            state = engine.state
            step = state.iteration - 1
            # (epoch_id, step_id, global_step_id, batch_idx[, first step of the update: what "skip" drops])
            where: tuple[int, ...] = (state.epoch - 1, state.step_id, step, state.batch_idx)
            if skip:
                where += (self._group_first(step),)
            # names the losses; the update's own losses tell a bad loss from a bad gradient in one process
            flags.record(where, (state.losses, state.sub_model_outs, self._update_losses))
        for where, loss_bad, _, (losses, model_outs, update_losses) in flags.ready(final):
            if not engine.multi_process:  # the flags carry only "any"; the losses are read on this rare path
                loss_bad = not _all_finite(update_losses)
            self._report(engine, where, loss_bad, losses, model_outs)
        read = flags.read_through
        if skip and read is not None:
            self.known_through = max(self.known_through, read[2])

    def flush(self, engine: LoopBase) -> None:
        """Read every pending flag (waiting for the device): the end of an epoch or of the run."""
        if self.device_flags is not None and self.device_flags.pending():
            self.after_step(engine, final=True)

    def _report(self, engine: LoopBase, where_ids: tuple, loss_bad: bool, losses: Any, model_outs: Any) -> None:
        epoch_id, step_id, global_step_id, batch_idx = where_ids[:4]
        where = f"epoch_id={epoch_id}, step_id={step_id}, global_step_id={global_step_id}, batch_idx={batch_idx}"
        what = describe_losses(losses, model_outs)
        if loss_bad and losses is not None and _all_finite(losses):
            what = f"on another rank (this rank's: {what})"
        kind = "loss" if loss_bad else "gradient"
        if self.policy == "skip":
            state = engine.state
            state.nonfinite_skipped = getattr(state, "nonfinite_skipped", 0) + 1
            self._decided(where_ids[4] if len(where_ids) > 4 else global_step_id, global_step_id, dropped=True)
            logger.warning("Skipped the optimizer update (%d so far): non-finite %s at %s: %s.",
                           state.nonfinite_skipped, kind, where, what)
            return
        self.device_flags, self._losses, self._update_losses = None, [], []  # a later run starts with clear flags
        detail = f": {what}" if loss_bad else f" (losses: {what})"
        if self.skips_on_device:
            outcome = ("The optimizer skipped the update of that step and of every later one on the "
                       "device, so the parameters are those of the step before it.")
        else:
            outcome = (f"{type(engine.optimizer).__name__} cannot skip an update on the device, so the "
                       f"parameters in memory hold that step's update (do not save them); no checkpoint "
                       f"was written after it: resume from the last one.")
        raise NonFiniteLossError(
            f"Non-finite {kind} at {where}{detail}. {outcome} Lower the learning rate, check the data, "
            f"clip gradients, set nonfinite_policy='skip' on the batch processor to drop such steps, or "
            f"check_finite_loss=False to train on regardless."
        )

    def check_loss(self, engine: LoopBase, loss: torch.Tensor, losses: Any, model_outs: Any, batch_idx: int) -> None:
        """Raise, or mark the step's update as dropped, when ``loss`` is NaN or infinite."""
        local = math.isfinite(loss.item())
        if all_ranks_finite(local):
            return
        where = _where(engine.state, batch_idx)
        what = describe_losses(losses, model_outs)
        if local:  # only another rank's loss is non-finite; all stop or skip at the same step
            what = f"on another rank (this rank's: {what})"
        if self.policy == "skip":
            self.pending = self.pending or f"non-finite loss at {where}: {what}"
            return
        raise NonFiniteLossError(
            f"Non-finite loss at {where}: {what}. Training stopped before the optimizer update of "
            f"this step, so the parameters are those of the previous step. Lower the learning rate, "
            f"check the data, set nonfinite_policy='skip' on the batch processor to drop such steps, "
            f"or check_finite_loss=False to train on regardless."
        )

    def allow_update(self, engine: LoopBase, scaler: Any) -> bool:
        """Whether the optimizer step may run now; raises under the ``"raise"`` policy."""
        if self.pending is None and self.check_grad and (scaler is None or not scaler.is_enabled()):
            finite = grads_finite(self._params.grads(engine.optimizer))
            if engine.multi_process:
                finite = all_ranks_finite(finite)
            if not finite:
                where = _where(engine.state, getattr(engine.state, "batch_idx", 0))
                names = ", ".join(_nonfinite_parameter_names(engine)) or "on another rank"
                if self.policy == "raise":
                    raise NonFiniteLossError(
                        f"Non-finite gradient at {where} (losses: {describe_losses(engine.state.losses)}): "
                        f"parameters {names}. Training stopped before the optimizer update of this "
                        f"step, so the parameters are those of the previous step. Lower the learning "
                        f"rate, clip gradients, or set nonfinite_policy='skip' on the batch processor "
                        f"to drop such steps."
                    )
                self.pending = f"non-finite gradient at {where}: parameters {names}"
        step = engine.state.iteration - 1
        first = self._group_first(step)
        if self.pending is None:
            self._decided(first, step, dropped=False)
            return True
        self._decided(first, step, dropped=True)
        state = engine.state
        state.nonfinite_skipped = getattr(state, "nonfinite_skipped", 0) + 1
        logger.warning(
            "Skipped the optimizer update (%d so far): %s.", state.nonfinite_skipped, self.pending
        )
        self.pending = None
        engine.optimizer.zero_grad(set_to_none=True)
        return False
