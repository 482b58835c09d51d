"""`StopVote`: every process of a multi-process run stops at the same step.

A stop request (``loop.request_stop``, e.g. from a SIGTERM handler) reaches one process, or
several at slightly different moments. If each process acted on its own flag, one rank would
leave the loop while the others wait for it in the next gradient all-reduce. So in a run of
more than one process the training loop votes at every step boundary: each rank contributes
its request code (0: none) to one all-reduce (``MAX``) of a single ``int32``, and every rank
acts on the agreed code. A request that arrives while a vote is running is counted at the next
step. With one process there is no collective at all.

Cost: one all-reduce of 4 bytes per training step. With gloo on the CPU the flag stays on the
CPU; with NCCL it lives on the process's GPU and reading it waits for the step's queued work
(the loss check reads the loss once per step already).

>>> vote = StopVote.for_this_run(torch.device("cpu"))
>>> vote is None    # one process: nothing to agree on
True
"""

from __future__ import annotations

import torch

__all__ = ["StopVote"]


class StopVote:
    """All-reduces a stop code across the processes of the default process group.

    Args:
        device: where the flag lives: the CPU for gloo, the process's GPU for NCCL.

    Build it with :meth:`for_this_run`, which returns ``None`` for a single process.
    """

    def __init__(self, device: torch.device) -> None:
        self._flag = torch.zeros(1, dtype=torch.int32, device=device)

    @classmethod
    def for_this_run(cls, device: torch.device) -> StopVote | None:
        """A vote over the default process group, or ``None`` when only one process trains."""
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
            return None
        on_cpu = dist.get_backend() == "gloo" or device.type == "cpu"
        return cls(torch.device("cpu") if on_cpu else device)

    def agree(self, code: int) -> int:
        """Every rank's largest stop code (0: no rank asked to stop); all ranks must call it."""
        self._flag.fill_(int(code))
        torch.distributed.all_reduce(self._flag, op=torch.distributed.ReduceOp.MAX)
        return int(self._flag.item())
