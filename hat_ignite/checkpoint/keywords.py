"""`KeywordsLoop`: what a checkpoint hook was given, seen as the loop it saves from.

HAT's loop, HAT's unit tests and users' own loops call :class:`~.checkpoint.Checkpoint`'s hooks
with the objects to save as keywords (``model``, ``ema_model``, ``optimizer``, ``epoch_id``,
``global_step_id``) and no ``loop``. The checkpoint code reads a loop (its model, optimizer,
EMA copy, progress); this view answers those reads from the keywords alone, so such a call
writes the same payload layout as a run of our loop, from exactly the objects it was given.
Nothing a view cannot know is made up: no callback states, no data state, no grad scaler, and
``stop_by`` / run lengths are those of the keywords (``None`` when not given).

>>> import torch
>>> view = KeywordsLoop(model=torch.nn.Linear(1, 1), ema_model=None, optimizer=None, epoch_id=2,
...                     global_step_id=9)
>>> view.state.epoch, view.state.iteration
(3, 10)
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from torch import nn

__all__ = ["KeywordsLoop"]


class KeywordsLoop:
    """The loop attributes :func:`~hat_ignite.checkpoint.payload.training_state` and ``Checkpoint`` read.

    Args:
        model: the model to save; ``None`` saves ``ema_model`` in its place (as HAT does when
            only the EMA copy is given).
        ema_model: the EMA copy, saved as ``ema_state_dict`` too.
        optimizer: the optimizer whose state is saved (``None``: none).
        epoch_id, global_step_id: the position the hook was called at (0-based).
        storage, num_epochs, num_steps: as the hook received them, when it did.
    """

    batch_processor = None
    callbacks: tuple[()] = ()
    stop_by = "epoch"

    def __init__(self, model: nn.Module | None, ema_model: nn.Module | None, optimizer: Any, epoch_id: int,
                 global_step_id: int, storage: Any = None, num_epochs: int | None = None,
                 num_steps: int | None = None) -> None:
        if model is None and ema_model is None:
            raise ValueError("Checkpoint: the hook was given neither a model nor an ema_model to save.")
        self.model = model if model is not None else ema_model
        self.ema_model = ema_model
        self.optimizer = optimizer
        self.num_epochs = num_epochs
        self.num_steps = num_steps
        self.stop_by = "step" if num_epochs is None and num_steps is not None else "epoch"
        self.state = SimpleNamespace(
            epoch=int(epoch_id) + 1, iteration=int(global_step_id) + 1, epoch_length=None, metrics=None,
            storage=storage if storage is not None else {},
        )

    def settle_updates(self) -> None:
        """Nothing in flight: the caller's own loop has finished the step it calls the hook for."""
