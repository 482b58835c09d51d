"""`StoppableLoopMixin`: the part of :class:`~hat_ignite.engine.loop.LoopBase` that stops on request.

Stopping. :meth:`~StoppableLoopMixin.request_stop` (safe to call from a signal handler: it only
stores the reason) makes the loop stop at the next step boundary: the NaN/Inf flags still in
flight are read first (:meth:`~StoppableLoopMixin.settle_updates`: an update the guard skipped
raises :class:`~hat_ignite.errors.NonFiniteLossError` naming its step, and nothing is written),
then each callback with a ``save_resume_point(loop)`` method (``Checkpoint``) writes a resumable
checkpoint, the loop terminates without closing the partial epoch (no ``on_epoch_end``), and
``on_loop_end`` fires.
In a run of several processes the ranks vote at every step boundary
(:class:`~hat_ignite.engine.stop_vote.StopVote`), so a request that reaches any rank stops all of
them after the same step; rank 0 writes the checkpoint and the others wait for it.

A stop can also end a wait for the next batch (:meth:`~StoppableLoopMixin.interrupt_data_wait`):
the data-loader watchdog (:mod:`~hat_ignite.engine.data_wait`) reports a stuck loader and lets a
requested stop end the wait.
"""

from __future__ import annotations

import functools
import logging
import weakref
from typing import TYPE_CHECKING, Any

import torch

from hat_ignite.engine.data_wait import DEFAULT_DATA_WAIT_LIMIT, DataWait
from hat_ignite.engine.resume import ResumableData
from hat_ignite.engine.stop_vote import StopVote

if TYPE_CHECKING:  # pragma: no cover
    from ignite.engine import Engine

    _EngineBase = Engine  # the mixin's ``super()`` calls reach Ignite's Engine (see LoopBase's bases)
else:
    _EngineBase = object

__all__ = ["StoppableLoopMixin"]


class StoppableLoopMixin(_EngineBase):
    """Stop requests, the update settling a stop needs, and the data-loader watchdog."""

    state: Any
    data_loader: Any
    batch_processor: Any
    optimizer: Any
    callbacks: list[Any]
    logger: logging.Logger
    _data: ResumableData | None

    def _init_stopping(self) -> None:
        #: The reason passed to :meth:`request_stop`, until the loop acts on it.
        self.stop_requested: str | None = None
        #: The code of the request (the CLI passes the signal number); after a stop, the code
        #: all ranks agreed on.
        self.stop_code = 0
        self._stop_vote: StopVote | None = None
        #: The reason the last ``fit()`` stopped early on request (``None``: it did not).
        self.stopped_by: str | None = None
        #: What each ``save_resume_point`` returned when the loop stopped on request.
        self.resume_points: list[Any] = []
        #: Seconds a step may wait for its batch before a watchdog thread reports the data loader
        #: as stuck (repeated every further limit); ``0`` or ``None``: no watchdog. See
        #: :mod:`hat_ignite.engine.data_wait`; ``hat-train --data-wait-limit`` sets it.
        self.data_wait_limit: float | None = DEFAULT_DATA_WAIT_LIMIT
        self._data_wait: DataWait | None = None

    def request_stop(self, reason: str, code: int = 1) -> None:
        """Stop at the next step boundary, after saving a resumable checkpoint.

        Only records ``reason``; the loop acts on it once the running step (and its
        ``on_step_end`` hooks) has finished. Safe to call from a signal handler or another thread.
        In a multi-process run every rank stops after the same step (see the module docstring).

        Args:
            reason: why, for the log (``"received SIGTERM"``).
            code: a positive number saying why to the other ranks (the CLI passes the signal
                number); where ranks ask with different codes, all take the largest.
        """
        if int(code) <= 0:
            raise ValueError(f"request_stop: code must be a positive int, got {code!r}.")
        self.stop_code = int(code)
        self.stop_requested = str(reason)

    def interrupt_data_wait(self) -> None:
        """End a wait for the next batch now, when a stop was requested during it.

        For the main thread's signal handler, right after :meth:`request_stop`: when the loop is
        inside ``next()`` of its data iterator (a slow or stuck loader), this raises
        :class:`~hat_ignite.engine.data_wait.DataWaitInterrupted` there; the loop then writes the
        resumable checkpoint of the last finished step (``save_resume_point``) and stops, as at a
        step boundary. Does nothing when the loop is not waiting for data, or in a run of several
        processes (their ranks agree on stopping at step boundaries).
        """
        wait = self._data_wait
        if wait is not None and self._stop_vote is None and self.stop_requested is not None:
            wait.interrupt(self.stop_requested)

    def settle_updates(self) -> None:
        """Make known whether every queued optimizer update really ran; call before saving.

        With a fused optimizer the NaN/Inf guard lets the optimizer skip an update on the device
        and reads the flag a step later (:mod:`~hat_ignite.engine.processors.nonfinite_device`).
        This reads the flags still in flight now (a blocking read), so a skipped update raises
        :class:`~hat_ignite.errors.NonFiniteLossError` naming its step before a checkpoint of it
        is written. ``Checkpoint`` calls it before each write; the loop calls it before it stops
        on request. All ranks must call it at the same step (their flags are all-reduced, so
        they all raise together). Does nothing when no flag is pending.
        """
        settle = getattr(self.batch_processor, "settle_updates", None)
        if settle is not None and self.optimizer is not None:
            settle(self)

    @property
    def drops_updates(self) -> bool:
        """Whether a step's update may be dropped (``nonfinite_policy="skip"``): then what a step
        fed into metrics counts only once :meth:`update_dropped` says its update was done."""
        guard = getattr(self.batch_processor, "nonfinite", None)
        return (self.optimizer is not None and getattr(guard, "policy", None) == "skip"
                and bool(getattr(self.batch_processor, "check_finite_loss", False)))

    def update_dropped(self, global_step_id: int) -> bool | None:
        """Whether the NaN/Inf guard dropped the update step ``global_step_id`` fed (skip policy).

        ``None`` while not known yet: with a fused optimizer the flag is read a step or more later
        (:meth:`settle_updates` reads it at once, a blocking read). ``False`` without a guard.
        """
        guard = getattr(self.batch_processor, "nonfinite", None)
        if guard is None or not self.drops_updates:
            return False
        return guard.update_dropped(global_step_id)

    def _watch_data(self, data: ResumableData) -> None:
        """Record each batch fetch's start, start the watchdog, and let a stop end a wait."""
        if self._data_wait is not None:
            self._data_wait.stop()
        ref = weakref.ref(self)  # the watchdog refers to the loop weakly: no cycle keeps a finished loop alive

        def where() -> str:
            loop = ref()
            return "" if loop is None else loop._fetch_position()

        wait = DataWait(self.data_loader, self.data_wait_limit, where, f"{type(self).__name__} loop")

        def interrupted() -> Any:
            loop = ref()
            return None if loop is None else loop._stop_while_waiting()

        data.wrap = functools.partial(wait.watch, on_interrupt=interrupted)
        self._data_wait = wait
        wait.start()

    def _fetch_position(self) -> str:
        state = self.state
        return f"epoch_id={max(state.epoch - 1, 0)}, global_step_id={state.iteration}"

    def _stop_while_waiting(self) -> None:
        """A stop requested while the loop waited for a batch: stop now, after the last finished step."""
        data, state = self._data, self.state
        if data is not None and state.iteration == state.epoch_first_step:
            data.restore_epoch_start()  # nothing of the epoch is done: its iterator is made again
        if not getattr(self.data_loader, "num_workers", 0):
            self.logger.warning(
                "Stopped while the data loader (no worker processes) was loading the batch of %s in this process: "
                "random numbers the dataset drew for it are not rewound, so a resumed run equals a straight "
                "one only when loading draws none (DataLoader workers do their drawing in their own processes).",
                self._fetch_position(),
            )
        reason = self.stop_requested or "stop requested"
        self._stop_now(f"{reason}, while waiting for the data loader", self.stop_code or 1)
        return None  # the batch Ignite gets; terminate() ends the run before any step sees it

    def _stop_if_requested(self) -> None:
        """At a step boundary: save resume points and terminate when a stop was requested.

        With several processes every rank calls this at every step: the ranks vote, and all
        of them stop when any asked to.
        """
        reason = self.stop_requested  # read once: a signal may set it during the vote
        code = self.stop_code if reason is not None else 0
        vote = self._stop_vote
        if vote is not None:
            code = vote.agree(code)
            if code and reason is None:
                reason = self.stop_requested or f"another process asked to stop (code {code})"
        if not code:
            return
        self._stop_now(reason, code)

    def _stop_now(self, reason: str | None, code: int) -> None:
        """Save the resume points of the state after the last finished step, and terminate."""
        vote = self._stop_vote
        self.settle_updates()  # a skipped update raises here, before any checkpoint is written
        self.stop_requested = None
        self.stopped_by, self.stop_code = reason, code
        for cb in self.callbacks:
            save = getattr(cb, "save_resume_point", None)
            if callable(save):
                self.resume_points.append(save(self))
        if vote is not None:
            torch.distributed.barrier()  # rank 0 has written the checkpoint when any rank goes on
        self.logger.warning("Stopping after global step %d: %s.", self.state.iteration - 1, reason)
        self.terminate()
