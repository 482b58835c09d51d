"""`ResumableLoopMixin`: the part of :class:`~hat_ignite.engine.loop.LoopBase` that resumes and stops.

Resuming. Objects with a ``resume(loop)`` method restore a saved training state into the loop.
The converters of ``model_convert_pipeline`` that have one (``LoadCheckpoint``) are called when
the loop is built, as HAT restores its pipeline's checkpoint in the loop's constructor (so
``loop.checkpoint``, the optimizer state and ``start_epoch`` / ``start_step`` are there before
``fit()``), and again at the start of the next ``fit()`` only if ``resume_optimizer`` /
``resume_epoch_or_step`` changed since (a later ``fit()`` calls them again); those passed to
:meth:`~ResumableLoopMixin.schedule_resume` (``hat-train --resume``) are called at the start of
``fit()``, after them. They restore what
``resume_optimizer`` / ``resume_epoch_or_step`` ask for and call
:meth:`~ResumableLoopMixin.load_data_state_dict` with the saved data position and generators,
which the loop puts back at the last moment before training goes on:

==========================================  ==================================================
the checkpoint was written ...              generators are set ...
==========================================  ==================================================
inside an epoch (``0 < steps_done < L``)    after the epoch's data iterator is re-created from
                                            the epoch-start states and moved to the position
after an epoch's last step, before its      before that epoch's ``on_epoch_end`` hooks, which
``on_epoch_end`` hooks                      the resumed run then fires (they had not run)
at an epoch end (``on_epoch_end``)          before the next epoch's ``on_epoch_begin`` hooks
==========================================  ==================================================

So ``on_loop_begin`` hooks of the resumed run, which the straight run did not have at that
point, cannot shift the random streams. The engine never imports ``hat_ignite.callbacks``: it
only calls these duck-typed methods.

With ``resume_dataloader=False`` (HAT's flag) a checkpoint written inside an epoch is resumed
without its data position: the rest of that epoch comes from the start of a fresh pass of the
loader (the generators are set before the epoch's ``on_epoch_begin`` hooks), and the next epoch
starts a pass of its own.

Ignite's own recipes. A state loaded with :meth:`~ResumableLoopMixin.load_state_dict` (as
``ignite.handlers.Checkpoint.load_objects`` does) makes the next ``fit()`` start at the loaded
iteration; a run paused by Ignite's ``interrupt()`` is continued by the next ``fit()``. The
loop's :meth:`~ResumableLoopMixin.state_dict` carries the data position and the generator states
(:data:`RESUME_KEY`), so a state Ignite's ``Checkpoint`` saved inside an epoch resumes exactly as
above.

Stopping. :meth:`~ResumableLoopMixin.request_stop` (safe to call from a signal handler: it only
stores the reason) makes the loop stop at the next step boundary: the NaN/Inf flags still in
flight are read first (:meth:`~ResumableLoopMixin.settle_updates`: an update the guard skipped
raises :class:`~hat_ignite.errors.NonFiniteLossError` naming its step, and nothing is written),
then each callback with a ``save_resume_point(loop)`` method (``Checkpoint``) writes a resumable
checkpoint, the loop terminates without closing the partial epoch (no ``on_epoch_end``), and
``on_loop_end`` fires.
In a run of several processes the ranks vote at every step boundary
(:class:`~hat_ignite.engine.stop_vote.StopVote`), so a request that reaches any rank stops all of
them after the same step; rank 0 writes the checkpoint and the others wait for it.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable

import torch

from hat_ignite.engine.data_wait import DEFAULT_DATA_WAIT_LIMIT, DataWait
from hat_ignite.engine.resume import ResumableData, rng_state, set_rng_state
from hat_ignite.engine.stop_vote import StopVote

if TYPE_CHECKING:  # pragma: no cover
    from ignite.engine import Engine

    _EngineBase = Engine  # the mixin's ``super()`` calls reach Ignite's Engine (see LoopBase's bases)
else:
    _EngineBase = object

__all__ = ["ResumableLoopMixin", "RESUME_KEY"]

#: The key of a loop's ``state_dict()`` holding its data position and generator states.
RESUME_KEY = "hat_ignite_resume"

logger = logging.getLogger(__name__)


class ResumableLoopMixin(_EngineBase):
    """Resume and stop-request support mixed into ``LoopBase`` (which is an Ignite ``Engine``)."""

    state: Any
    data_loader: Any
    batch_processor: Any
    optimizer: Any
    callbacks: list[Any]
    model_convert_pipeline: Any
    start_epoch: int
    start_step: int
    logger: logging.Logger
    _internal_run_generator: Any  # Ignite's paused run (Engine)
    _dataloader_iter: Any
    #: Whether a loop without an optimizer also records its data position and generators (so
    #: a stop and resume continues its data stream exactly) and votes on stopping: ``True`` for
    #: a ``Calibrator``, whose observers depend on every batch they saw. Loops with an optimizer
    #: always do.
    keeps_data_position = False

    def _init_resumable(self) -> None:
        self._state_restored = False  # load_state_dict() was called since the last fit()
        self._resumers: list[Any] = []
        #: the resume flags the pipeline's resumers last ran with when the loop was built, until fit()
        self._pipeline_resumed_with: tuple[Any, Any] | None = None
        self._data: ResumableData | None = None
        self._pending_position: dict[str, Any] | None = None
        self._boundary_rng: Mapping[str, Any] | None = None
        self._replay_epoch_end = False
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

    # -- public API ------------------------------------------------------------------------
    def schedule_resume(self, resumer: Any) -> None:
        """Call ``resumer.resume(loop)`` at the start of the next ``fit()``.

        ``resumer`` restores a saved training state into the loop (see
        ``hat_ignite.checkpoint.restore``); it runs after the resumers of
        ``model_convert_pipeline``.
        """
        if not callable(getattr(resumer, "resume", None)):
            raise TypeError(f"schedule_resume needs an object with resume(loop), got {type(resumer).__name__}.")
        self._resumers.append(resumer)

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

    def data_state_dict(self) -> dict[str, Any] | None:
        """Where the training data stream stands: what an exact mid-epoch resume needs.

        Returns:
            ``None`` before ``fit()``; else ``{"iteration", "epoch_length", "steps_done"
            (steps of the running or last epoch done), "epoch_open" (its on_epoch_end hooks have
            not started), "generators" (generator states the epoch's data iterator started
            from, or None)}``, all loadable with ``torch.load(weights_only=True)``.
        """
        data = self._data
        if data is None:
            return None
        state = self.state
        length = int(state.epoch_length) if state.epoch_length else None
        done = int(state.iteration - state.epoch_first_step)
        return {
            "iteration": int(state.iteration),
            "epoch_length": length,
            "steps_done": done,
            "epoch_open": bool(state.epoch_open),
            "generators": data.epoch_generators,
        }

    def load_data_state_dict(self, data_state: Mapping[str, Any] | None,
                             rng: Mapping[str, Any] | None = None) -> None:
        """Continue the data stream (and set ``rng``) where :meth:`data_state_dict` was taken.

        Takes effect at the next ``fit()``, which must start at the saved iteration (the
        resumer sets ``start_step``). Without ``data_state`` (an older checkpoint) the generators
        are set at once and the epoch's position is not restored.

        Args:
            data_state: a :meth:`data_state_dict` result from the checkpoint.
            rng: the checkpoint's generator states (``hat_ignite.engine.resume.rng_state()``).
        """
        if data_state is None:
            if rng is not None:
                set_rng_state(rng)
            return
        self._pending_position = {**data_state, "rng": rng}

    def state_dict(self) -> OrderedDict:
        """Ignite's :meth:`~ignite.engine.Engine.state_dict`; once the loop has trained, also
        ``{RESUME_KEY: {"data": data_state_dict(), "rng": rng_state()}}`` (weights-only loadable),
        which Ignite's ``Checkpoint`` saves and :meth:`load_state_dict` puts back."""
        state = super().state_dict()
        data = self.data_state_dict()
        if data is not None:
            state[RESUME_KEY] = {"data": data, "rng": rng_state()}
        return state

    def load_state_dict(self, state_dict: Mapping) -> None:
        """Ignite's :meth:`~ignite.engine.Engine.load_state_dict`; the next :meth:`fit` continues from it.

        So Ignite's resume recipe (``Checkpoint.load_objects({"trainer": trainer, ...})`` or
        ``trainer.load_state_dict(sd)``, then ``fit()``) goes on at the restored iteration, as
        ``run()`` would, up to this loop's ``num_epochs`` / ``num_steps``, with the data position
        and generators of a :meth:`state_dict` (see :meth:`load_data_state_dict`).
        """
        super().load_state_dict(state_dict)
        self._state_restored = True
        saved = state_dict.get(RESUME_KEY)
        if isinstance(saved, Mapping):
            self.load_data_state_dict(saved.get("data"), saved.get("rng"))

    # -- used by fit() and the bridge handlers --------------------------------------------------
    def _drop_paused_run(self) -> None:
        """Close the run ``interrupt()`` paused, without Ignite logging the close as an error."""
        paused, self._internal_run_generator = self._internal_run_generator, None
        self._dataloader_iter = None
        level = self.logger.level
        self.logger.setLevel(logging.CRITICAL)
        try:
            paused.close()
        finally:
            self.logger.setLevel(level)

    def _pipeline_resumers(self) -> list[Any]:
        pipeline = self.model_convert_pipeline
        converters = pipeline if isinstance(pipeline, (list, tuple)) else [] if pipeline is None else [pipeline]
        nested = [c for conv in converters for c in getattr(conv, "converters", None) or []]
        return [c for c in [*converters, *nested] if callable(getattr(c, "resume", None))]

    def _resume_flags(self) -> tuple[Any, Any]:
        return (getattr(self, "resume_optimizer", None), getattr(self, "resume_epoch_or_step", None))

    def _resume_from_pipeline(self) -> None:
        """Restore the pipeline's checkpoint when the loop is built (called last in its constructor)."""
        resumers = self._pipeline_resumers()
        for resumer in resumers:
            resumer.resume(self)
        self._pipeline_resumed_with = self._resume_flags() if resumers else None

    def _run_resumers(self) -> None:
        """Call the resumers at the start of ``fit()``; a scheduled one (``--resume``) has the last word.

        The pipeline's resumers (``LoadCheckpoint``) ran when the loop was built; they run again only
        if the flags saying what to restore changed since. When a checkpoint of this run is
        scheduled, only that one is the run's training state: a converter's file (the previous
        stage's weights a calibration starts from) must not set the progress, data position,
        callback states or generators.
        """
        done_with, self._pipeline_resumed_with = self._pipeline_resumed_with, None
        scheduled, self._resumers = self._resumers, []
        pipeline = [] if done_with == self._resume_flags() else self._pipeline_resumers()
        if scheduled and (pipeline or done_with is not None):
            self.logger.info("Resuming from a checkpoint of this run: it replaces the training state of %s "
                             "(only its weights are kept until the resumed checkpoint loads its own).",
                             ", ".join(map(repr, self._pipeline_resumers())))
            pipeline = []
        for resumer in [*pipeline, *scheduled]:
            resumer.resume(self)

    def _make_data(self, length: int | None, start_iteration: int) -> Any:
        """The iterable ``run()`` goes over; places a pending position into it."""
        self.stopped_by = None
        self.resume_points = []
        if self.optimizer is None and not self.keeps_data_position:  # e.g. a Predictor: never resumes
            self._data = None
            self._stop_vote = None
            return self.data_loader
        self._stop_vote = StopVote.for_this_run(getattr(self, "torch_device", torch.device("cpu")))
        self._data = ResumableData(self.data_loader)
        self._watch_data(self._data)
        pending, self._pending_position = self._pending_position, None
        self._boundary_rng, self._replay_epoch_end = None, False
        if pending is None:
            return self._data
        rng = pending.get("rng")
        saved_length, done = pending.get("epoch_length"), int(pending.get("steps_done") or 0)
        if int(pending.get("iteration", -1)) != start_iteration or (length and saved_length != length):
            logger.warning(
                "The saved data position (iteration %s, %s steps per epoch) does not match this run "
                "(iteration %d, %s steps per epoch): the generators are restored, the epoch restarts.",
                pending.get("iteration"), saved_length, start_iteration, length,
            )
            if rng is not None:
                set_rng_state(rng)
            return self._data
        if saved_length and done >= saved_length and pending.get("epoch_open"):
            self._replay_epoch_end, self._boundary_rng = True, rng
        elif saved_length and 0 < done < saved_length and getattr(self, "resume_dataloader", None) is False:
            self._data.restart_for(saved_length - done)
            self._boundary_rng = rng
            self.logger.info("resume_dataloader=False: epoch %d goes on at step %d of %d with a fresh pass of "
                             "the data loader.", start_iteration // saved_length, done, saved_length)
        elif saved_length and 0 < done < saved_length:
            self._data.resume_at(done, pending.get("generators"), rng)
            self.logger.info("Resuming inside epoch %d at step %d of %d.", start_iteration // saved_length,
                             done, saved_length)
        else:
            self._boundary_rng = rng
        return self._data

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

    def _after_loop_begin(self, close_epoch: Callable[[Any], None]) -> None:
        """Fire the on_epoch_end hooks of an epoch whose last step was saved before them."""
        if not self._replay_epoch_end:
            return
        self._replay_epoch_end = False
        if self._boundary_rng is not None:
            set_rng_state(self._boundary_rng)
            self._boundary_rng = None
        self.logger.info("Running the on_epoch_end hooks of epoch %d, which the saved run had not run.",
                         self.state.epoch - 1)
        close_epoch(self)

    def _before_epoch_begin(self) -> None:
        if self._boundary_rng is not None:
            set_rng_state(self._boundary_rng)
            self._boundary_rng = None

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
