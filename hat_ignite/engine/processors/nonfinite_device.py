"""The NaN/Inf guard without a host-device sync: a flag on the device, read a step or more later.

Used by :class:`~hat_ignite.engine.processors.nonfinite.NonFiniteGuard` when no enabled
``GradScaler`` steps the optimizer and either the optimizer can skip its own update on the device
(``_step_supports_amp_scaling``: torch's ``fused=True`` SGD, Adam, AdamW, Adagrad) or the policy
is ``"raise"`` (then a plain optimizer steps as usual, step 2 below does not skip, and the flags
only name the step that went wrong). Per update:

1. :meth:`DeviceFlags.check` sets ``flags = [loss_bad, any_bad]`` on the device with torch's
   fused finite check (the one ``GradScaler`` runs, with a factor of exactly 1, which leaves the
   tensors bit for bit as they are): ``any_bad`` over the update's losses and gradients, in one
   call. Under several processes ``loss_bad`` is set over the losses too, and the two flags are
   all-reduced (``MAX``), so every rank skips and stops together and knows whether a loss went
   bad on another rank; in one process, whether the loss or only a gradient went bad is told
   from the update's losses when a set flag is read (a rare path).
2. The optimizer steps with ``optimizer.found_inf = any_bad``: its fused kernel does nothing
   (parameters, moments and step counts stay as they are) when the flag is 1.
3. :meth:`DeviceFlags.record` notes the step the update belongs to and takes the flags' values:
   on a GPU (any device but the CPU) it copies them into a slot of a small host buffer (pinned
   memory and a CUDA event, so the copy does not block); on the CPU the flags are host memory
   already, and their values are read as they are (no copy, no device to wait for).
4. :meth:`DeviceFlags.ready` hands over the recorded updates whose flags are in: on a GPU those
   whose event completed (it waits only when four steps are pending), on the CPU the previous
   step's (a step later, as on a GPU).
   At an epoch end, before any checkpoint is written and before the loop stops on request,
   every pending slot is read at once (``final=True``; ``loop.settle_updates()``), so no
   checkpoint holds a step whose update was skipped.

Under the ``"raise"`` policy the flags are never reset, so once set every later update skips as
well, until the guard raises one or more steps later naming the step that went wrong. Under
``"skip"`` they are reset at each update, and a bad step is counted when its flags are read.

>>> flags = DeviceFlags(torch.device("cpu"), sticky=True)
>>> flags.check([torch.tensor(0.5)], [torch.ones(2), torch.tensor([1.0, float("inf")])])
>>> flags.record(("where",), None)
>>> flags.ready(final=True)
[(('where',), False, True, None)]
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch

__all__ = ["DeviceFlags", "RING"]

_NOTHING: list = []  # returned (never changed) when no flag is set

#: Host slots for flags in flight: on a GPU the host waits for a copy only when this many are pending.
RING = 4


class DeviceFlags:
    """Sticky (or per-update) NaN/Inf flags on a device and their non-blocking host copies.

    Args:
        device: where the gradients and losses live.
        sticky: keep a set flag set for every later update (the ``"raise"`` policy).
    """

    def __init__(self, device: torch.device, sticky: bool) -> None:
        self.device = device
        self.sticky = sticky
        self.flags = torch.zeros(2, device=device)
        self.loss_bad, self.any_bad = self.flags[0], self.flags[1]
        self._one = torch.ones((), device=device)
        cuda = device.type == "cuda"
        self._async = cuda
        #: On the CPU: the flags' own memory, read where a device's flags are copied to the host.
        self._live = self.flags.numpy() if device.type == "cpu" else None
        # elsewhere a (RING, 2) host buffer; its numpy view is read without a tensor op
        self._mirror = torch.zeros(RING, 2, pin_memory=cuda)
        self._slots = list(self._mirror)  # one view per slot, made once
        self._view = self._mirror.numpy()
        self._events = [torch.cuda.Event() for _ in range(RING)] if cuda else None
        # (slot, or the flags' values on the CPU; where; losses), oldest first
        self._pending: deque[tuple[Any, Any, Any]] = deque()
        #: The ``where`` of the newest update whose flags were read (``None``: none yet).
        self.read_through: Any = None
        self._count = 0

    def check(self, losses: list[torch.Tensor], grads: list[torch.Tensor], multi_process: bool = False) -> None:
        """Set the flags for this update: ``any_bad`` from ``losses`` and ``grads``; with
        ``multi_process`` also ``loss_bad`` from ``losses``, then both are all-reduced (every rank
        must call it at the same update). In one process ``loss_bad`` stays 0: the caller tells a
        bad loss from the losses themselves when ``any_bad`` is read set.
        """
        if not self.sticky:
            self.flags.zero_()
        one = self._one
        tensors = grads + losses if losses else grads
        try:
            if multi_process and losses:
                torch._amp_foreach_non_finite_check_and_unscale_(losses, self.loss_bad, one)
            if tensors:
                torch._amp_foreach_non_finite_check_and_unscale_(tensors, self.any_bad, one)
        except RuntimeError:  # tensors on several devices or of dtypes the fused check refuses
            checks = ((self.loss_bad, losses), (self.any_bad, tensors)) if multi_process else ((self.any_bad, tensors),)
            for flag, group in checks:
                for t in group:
                    bad = (~torch.isfinite(t.detach())).any().to(device=flag.device, dtype=flag.dtype)
                    torch.maximum(flag, bad, out=flag)
        if multi_process:
            work = torch.distributed.all_reduce(self.flags, op=torch.distributed.ReduceOp.MAX, async_op=True)
            work.wait()  # NCCL: the compute stream waits for the reduction, the host does not

    def step(self, optimizer: torch.optim.Optimizer, skip: bool = True) -> None:
        """``optimizer.step()``, told to skip itself on the device when ``any_bad`` is set.

        ``skip=False`` for an optimizer that takes no ``found_inf`` (a plain, non-fused one): it
        steps as it is, and the flags only name the step when they are read.
        """
        if not skip:
            optimizer.step()
            return
        optimizer.found_inf = self.any_bad  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf  # type: ignore[attr-defined]

    def record(self, where: Any, losses: Any) -> None:
        """Take the flags of the update just queued (on a GPU: start their host copy);
        ``where``/``losses`` name it."""
        live = self._live
        if live is not None:  # the CPU: the values are in host memory now, as a copy would hold them
            self._pending.append(((live.item(0), live.item(1)), where, losses))
            return
        slot = self._count % RING
        self._slots[slot].copy_(self.flags, non_blocking=self._async)
        if self._events is not None:
            self._events[slot].record()
        self._pending.append((slot, where, losses))
        self._count += 1

    def ready(self, final: bool = False) -> list[tuple[Any, bool, bool, Any]]:
        """``(where, loss_bad, any_bad, losses)`` of every recorded update whose flags are read now.

        ``final`` reads all of them (waiting for the device if needed): the end of an epoch.
        Only updates with a flag set are returned.
        """
        pending = self._pending
        events = self._events
        if events is None and not final and len(pending) < 2:  # the CPU: read the previous update's flags
            return _NOTHING
        out = _NOTHING
        view = self._view
        while pending:
            slot, where, losses = pending[0]
            if events is not None:
                if not events[slot].query():
                    if not final and len(pending) < RING:
                        break
                    events[slot].synchronize()
            elif not final and len(pending) < 2:
                break
            pending.popleft()
            self.read_through = where
            loss_bad, any_bad = slot if self._live is not None else (view.item(slot, 0), view.item(slot, 1))
            if any_bad:  # Python floats from host memory
                out = out or []
                out.append((where, bool(loss_bad), True, losses))
        return out

    def pending(self) -> int:
        """How many updates' flags are not read yet."""
        return len(self._pending)
