"""`StopVote`: every process of a multi-process run stops at the same step.

A stop request (``loop.request_stop``, e.g. from a SIGTERM handler) reaches one process, or
several at slightly different moments. If each process acted on its own flag, one rank would
leave the loop while the others wait for it in the next gradient all-reduce. So in a run of
more than one process the training loop votes at every step boundary: each rank contributes
its request code (0: none) to one all-reduce (``MAX``) of a single ``int32``, and every rank
acts on the agreed code. With one process there is no collective at all.

The vote is asynchronous so that its latency hides behind the next step: at the end of step
``k`` a rank reads the result of the vote started at the end of step ``k - 1`` and starts the
next one. Every rank reads the same result at the same step, so all stop after the same step,
one step after the request reached them. A request that arrives while a vote runs is counted
in the next one. Cost: one 4-byte all-reduce per training step, overlapped with the step (see
docs/reliability.md for the figures). With gloo the flag stays on the CPU; with NCCL it lives
on the process's GPU.

>>> vote = StopVote.for_this_run(torch.device("cpu"))
>>> vote is None    # one process: nothing to agree on
True
"""

from __future__ import annotations

from typing import Any

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
        self._work: Any = None

    @classmethod
    def for_this_run(cls, device: torch.device) -> StopVote | None:
        """A vote over the default process group, or ``None`` when only one process trains."""
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
            return None
        on_cpu = dist.get_backend() == "gloo" or device.type == "cpu"
        return cls(torch.device("cpu") if on_cpu else device)

    def agree(self, code: int) -> int:
        """The largest code any rank gave to the previous call (0: none); all ranks must call it.

        ``code`` itself is all-reduced in the background and answered by the next call.
        """
        agreed = 0
        if self._work is not None:
            self._work.wait()
            self._work = None
            agreed = int(self._flag.item())
            if agreed:
                return agreed
        self._flag.fill_(int(code))
        self._work = torch.distributed.all_reduce(self._flag, op=torch.distributed.ReduceOp.MAX, async_op=True)
        return agreed

    def close(self) -> None:
        """Wait for the vote still running (all ranks call it at the same point)."""
        if self._work is not None:
            self._work.wait()
            self._work = None
