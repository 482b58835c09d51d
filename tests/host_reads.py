"""Counting the host reads of device values a training step makes (helpers of test_host_reads.py).

A host read is any call that makes the host wait for a tensor's value: ``.item()``, ``float(t)``,
``int(t)``, ``bool(t)``, ``.tolist()``, ``.cpu()``, ``.numpy()``, formatting or printing a tensor.
On a GPU each one drains the device's queue. :class:`HostReads` counts them through a
``TorchFunctionMode`` (every tensor method passes through it), per training iteration, with the
line of the package that asked, so the same count on the CPU tells what a GPU run would wait for.
``.to(device)`` is not counted: on the CPU a move to the compute device cannot be told from a
read back to the host (the package reads values with ``.item()``/``.cpu()``, which are counted).
"""

from __future__ import annotations

import traceback
from collections import Counter, defaultdict
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_T = torch.Tensor
#: The tensor methods that hand a value to the host.
READS = {
    _T.item, _T.tolist, _T.cpu, _T.numpy, _T.__float__, _T.__int__, _T.__bool__, _T.__index__,
    _T.__format__, _T.__repr__, _T.__array__,
}


class HostReads(TorchFunctionMode):
    """Count host reads per ``iteration`` (set it from a STEP_BEGIN handler), with their callers."""

    def __init__(self) -> None:
        super().__init__()
        self.iteration = 0
        self.per_step: Counter[int] = Counter()
        self.where: dict[int, list[str]] = defaultdict(list)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in READS:
            self.per_step[self.iteration] += 1
            frames = [f for f in traceback.extract_stack()[:-1] if "/hat_ignite/" in f.filename]
            caller = frames[-1] if frames else traceback.extract_stack()[-2]
            self.where[self.iteration].append(f"{getattr(func, '__name__', func)} at {caller.filename}:{caller.lineno}")
        return func(*args, **kwargs)

    def attach(self, engine: Any) -> HostReads:
        """Follow ``engine``'s iterations (counted from 1, as Ignite's ``state.iteration``)."""
        from ignite.engine import Events

        # Ignite fetches a step's batch before ITERATION_STARTED: the fetch counts for that step
        engine.add_event_handler(Events.GET_BATCH_STARTED, lambda e: setattr(self, "iteration", e.state.iteration + 1))
        engine.add_event_handler(Events.ITERATION_STARTED, lambda e: setattr(self, "iteration", e.state.iteration))
        return self

    def reads(self, iterations: range) -> dict[int, list[str]]:
        """The host reads of those iterations that had any: ``{iteration: [what at file:line]}``."""
        return {i: self.where[i] for i in iterations if self.per_step[i]}
