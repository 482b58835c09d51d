"""`ResumableLoopMixin`: the part of :class:`~hat_ignite.engine.loop.LoopBase` that resumes.

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

Stopping on request lives in :mod:`~hat_ignite.engine.stopping`.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Callable

import torch

from hat_ignite.engine.resume import ResumableData, rng_state, set_rng_state
from hat_ignite.engine.stop_vote import StopVote
from hat_ignite.engine.stopping import StoppableLoopMixin

__all__ = ["ResumableLoopMixin", "RESUME_KEY"]

#: The key of a loop's ``state_dict()`` holding its data position and generator states.
RESUME_KEY = "hat_ignite_resume"

logger = logging.getLogger(__name__)


class ResumableLoopMixin(StoppableLoopMixin):
    """Resume support mixed into ``LoopBase`` (which is an Ignite ``Engine``); stopping on request
    comes from :class:`~hat_ignite.engine.stopping.StoppableLoopMixin`."""

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
        self._init_stopping()

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
