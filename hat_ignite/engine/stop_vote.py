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
on the process's GPU and its result is copied into pinned host memory behind the reduction,
so reading it a step later waits at most for the previous step's queued work, never drains
the queue. The result is read from host memory, not with a tensor read (``.item()``).

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
        cuda = device.type == "cuda"
        # the agreed code is read on the host from this buffer's numpy view, never with a tensor
        # read: on a GPU it is pinned memory the reduced flag is copied into without blocking
        self._host = torch.zeros(1, dtype=torch.int32, pin_memory=cuda) if cuda else self._flag
        self._view = self._host.numpy()
        self._event = torch.cuda.Event() if cuda else None

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
            self._wait()
            agreed = int(self._view[0])
            if agreed:
                return agreed
        self._flag.fill_(int(code))
        self._work = torch.distributed.all_reduce(self._flag, op=torch.distributed.ReduceOp.MAX, async_op=True)
        if self._event is not None:  # NCCL: the copy queues behind the reduction; nothing waits now
            self._work.wait()  # the current stream waits for the reduction, the host does not
            self._host.copy_(self._flag, non_blocking=True)
            self._event.record()
        return agreed

    def _wait(self) -> None:
        """Wait until the last vote's result is on the host (gloo: the reduction; NCCL: the copy)."""
        if self._event is not None:
            self._event.synchronize()  # the previous step's work, not the one queued since
        else:
            self._work.wait()
        self._work = None

    def close(self) -> None:
        """Wait for the vote still running (all ranks call it at the same point)."""
        if self._work is not None:
            self._wait()
