"""How a loop runs from a position: Ignite's counters set to a resume point or a start, and ``run()``.

Mixed into :class:`~hat_ignite.engine.loop.LoopBase` (an Ignite ``Engine``): ``fit()`` positions the
counters with :meth:`LoopRunMixin._position` and runs with :meth:`LoopRunMixin._run_positioned`;
``run()`` is Ignite's, with the loop's own length for a new run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, cast

from ignite.engine import Engine

from hat_ignite.engine.bridge import loader_length
from hat_ignite.engine.outputs import note_model_outputs

if TYPE_CHECKING:
    from hat_ignite.engine.loop import LoopBase

    _EngineBase = Engine  # the mixin's ``super()`` calls reach Ignite's Engine (see LoopBase's bases)
else:
    _EngineBase = object

__all__ = ["LoopRunMixin"]


class LoopRunMixin(_EngineBase):
    """Positioning and ``run()`` for ``LoopBase``."""

    state: Any
    data_loader: Any
    stop_by: str
    num_epochs: int | None
    num_steps: int | None
    start_epoch: int
    start_step: int

    if TYPE_CHECKING:  # provided by ResumableLoopMixin

        def _make_data(self, length: int | None, start_iteration: int) -> Any: ...

    def _position(self, iteration: int, length: int, limit: dict[str, Any]) -> None:
        """Set Ignite's counters to ``iteration`` (a resume point or ``start_epoch``/``start_step``).

        Ignite's ``load_state_dict`` also asks for every ``state_dict_user_keys`` entry; this is
        no load of a user's state (those attributes stay on ``state`` as they are), so the keys
        are set aside for the call.
        """
        user_keys = self.state_dict_user_keys
        kept = list(user_keys)
        user_keys.clear()
        try:
            Engine.load_state_dict(self, {"iteration": iteration, "epoch_length": length, **limit})
        finally:
            user_keys.extend(kept)

    def _run_positioned(self, length: int, iteration: int) -> None:
        """Run from ``iteration`` with the limit :meth:`_position` set.

        A ``stop_by="step"`` run is Ignite's ``max_iters`` mode, where Ignite leaves
        ``state.max_epochs`` ``None``; for the run's length it is the number of epochs the steps
        reach, ``ceil(num_steps / len(data_loader))``, so that handlers reading it (Ignite's
        ``BasicTimeProfiler`` sizes its tables by it) work. It is ``None`` again once ``run()``
        returns, so that Ignite's ``run(max_iters=...)`` may follow.
        """
        by_step = self.stop_by == "step" and self.state.max_iters is not None
        if by_step:
            self.state.max_epochs = -(-self.state.max_iters // length)
        try:
            self.run(self._make_data(length, iteration))
        finally:
            if by_step:
                self.state.max_epochs = None

    def _nothing_to_run(self, start_epoch: int | None = None, start_step: int | None = None) -> bool:
        start_epoch = self.start_epoch if start_epoch is None else start_epoch
        start_step = self.start_step if start_step is None else start_step
        if self.stop_by == "epoch":
            assert self.num_epochs is not None  # __init__ requires num_epochs with stop_by='epoch'
            if start_step and not start_epoch:  # a restored iteration
                length = loader_length(self.data_loader)
                return self.num_epochs == 0 or bool(length) and start_step >= self.num_epochs * (length or 0)
            return self.num_epochs == 0 or start_epoch >= self.num_epochs
        assert self.num_steps is not None  # __init__ requires num_steps with stop_by='step'
        return self.num_steps == 0 or start_step >= self.num_steps

    def run(
        self, data: Iterable | None = None, max_epochs: int | None = None, max_iters: int | None = None,
        epoch_length: int | None = None,
    ) -> Any:
        """Ignite's ``run``; a new run without ``max_epochs`` / ``max_iters`` runs the loop's own
        ``num_epochs`` (``stop_by="epoch"``) or ``num_steps`` (``stop_by="step"``), not Ignite's one epoch.

        ``run(data)`` skips what :meth:`fit` does first (resumers, ``start_epoch`` /
        ``start_step``); HAT's hooks fire as in :meth:`fit`.
        """
        state = self.state
        done = (state.max_iters is not None and state.iteration >= state.max_iters) or (
            state.max_epochs is not None and (state.epoch >= state.max_epochs or (
                state.epoch_length is not None and state.iteration >= state.epoch_length * state.max_epochs))
        )  # as Ignite's run() decides it
        new_run = (state.max_epochs is None and state.max_iters is None) or (
            done and self._internal_run_generator is None
        )
        if max_epochs is None and max_iters is None and new_run:
            if self.stop_by == "epoch" and self.num_epochs:
                max_epochs = self.num_epochs
            elif self.stop_by == "step" and self.num_steps:
                max_iters = self.num_steps
        try:
            return super().run(data, max_epochs=max_epochs, max_iters=max_iters, epoch_length=epoch_length)
        except Exception as exc:
            note_model_outputs(cast("LoopBase", self), exc)
            raise
