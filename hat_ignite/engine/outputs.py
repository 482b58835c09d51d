"""`loss_output`: an ``output_transform`` that gives stock Ignite handlers the step's loss.

A loop's ``engine.state.output`` is what the model returned (HAT hooks see it as
``model_outs``): a dict or a tuple of tensors, still attached to their autograd graph. Ignite
handlers that expect a loss (``RunningAverage``, ``ProgressBar``, ``FastaiLRFinder``,
``TerminateOnNan``) take an ``output_transform``; ``loss_output(engine)`` is one: it returns the
sum of the losses the batch processor's ``loss_collector`` picked this step, as a detached 0-dim
tensor (``float()`` of it gives the number; reading it is the handler's host-device sync, not
the step's).

>>> import torch
>>> from ignite.metrics import RunningAverage
>>> from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index
>>> _ = torch.manual_seed(0)
>>> class Net(torch.nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.fc = torch.nn.Linear(4, 2)
...     def forward(self, x, y):
...         logits = self.fc(x)
...         return logits, torch.nn.functional.cross_entropy(logits, y)
>>> model = Net()
>>> trainer = Trainer(model, [(torch.randn(8, 4), torch.randint(0, 2, (8,)))] * 3,
...                   torch.optim.SGD(model.parameters(), lr=0.1),
...                   BasicBatchProcessor(True, loss_collector=collect_loss_by_index(1)),
...                   device=None, num_epochs=1)
>>> RunningAverage(output_transform=loss_output(trainer)).attach(trainer, "loss")
>>> state = trainer.fit()
>>> isinstance(state.metrics["loss"], float)
True
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable

import torch
from ignite.engine import Events

from hat_ignite.engine.processors.batch_ops import total_loss

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["LossOutput", "loss_output", "state_output_function", "note_model_outputs", "STATE_OUTPUTS"]

#: The names ``state_output=`` takes (a callable ``model_outs -> value`` works too).
STATE_OUTPUTS = ("model_outs", "loss")


class LossOutput:
    """Callable ``output -> Tensor``: the summed loss of ``engine``'s latest step, detached.

    Holds the engine through a weak reference, so attaching it to the engine's own handlers
    makes no reference cycle.

    Args:
        engine: the loop whose ``state.losses`` is read.
    """

    def __init__(self, engine: LoopBase) -> None:
        self._engine = weakref.ref(engine)

    def __call__(self, output: Any) -> torch.Tensor:
        engine = self._engine()
        if engine is None:
            raise RuntimeError("loss_output: the engine it was made for no longer exists.")
        total = total_loss(engine.state.losses)
        if total is None:
            raise ValueError(
                f"loss_output: {type(engine).__name__} has no loss this step (state.losses is "
                f"{engine.state.losses!r}). Give its batch processor a loss_collector, or use an "
                f"output_transform that reads the model outputs (engine.state.output) instead."
            )
        return total.detach()

    def __repr__(self) -> str:
        engine = self._engine()
        return f"LossOutput({type(engine).__name__ if engine is not None else 'dead engine'})"


def loss_output(engine: LoopBase) -> LossOutput:
    """An Ignite ``output_transform`` giving ``engine``'s summed step loss (see the module docstring).

    Args:
        engine: a hat-ignite loop whose batch processor collects losses (a ``Trainer``).

    Returns:
        A :class:`LossOutput` to pass as ``output_transform=`` to Ignite handlers and metrics.
    """
    return LossOutput(engine)


def state_output_function(engine: LoopBase, state_output: Any) -> Callable[[Any], Any] | None:
    """What turns the model outputs into ``engine.state.output`` (``None``: they are kept as they are).

    Args:
        engine: the loop.
        state_output: ``"model_outs"`` (or ``None``): the model outputs, as HAT's loop has them;
            ``"loss"``: the step's summed loss, detached (:class:`LossOutput`), what Ignite's
            ``create_supervised_trainer`` gives; or a callable ``model_outs -> value``.

    Raises:
        ValueError: ``state_output`` is none of these.
    """
    if state_output is None or state_output == "model_outs":
        return None
    if state_output == "loss":
        return LossOutput(engine)
    if callable(state_output):
        return state_output
    raise ValueError(
        f"{type(engine).__name__}: state_output must be 'model_outs', 'loss' or a callable model_outs -> "
        f"value, got {state_output!r}."
    )


_NOTED = (TypeError, ValueError, KeyError, IndexError, AttributeError)


def note_model_outputs(engine: LoopBase, exc: BaseException) -> None:
    """Add a note to ``exc`` when an Ignite handler may have taken the model outputs for a loss
    (on Pythons before 3.11, which have no exception notes, the note goes into the message).

    The note is added when the error was raised while Ignite's ``ITERATION_COMPLETED`` or
    ``EPOCH_COMPLETED`` handlers ran and ``state.output`` held the model outputs (a dict, list or
    tuple): stock recipes written for Ignite's trainers (``f"{engine.state.output:.2f}"``,
    ``setup_common_training_handlers(output_names=...)``) read a loss there.
    """
    if not isinstance(exc, _NOTED) or engine.output_function is not None:
        return
    if engine.last_event_name not in (Events.ITERATION_COMPLETED, Events.EPOCH_COMPLETED):
        return
    output = engine.state.output
    if not isinstance(output, (Mapping, list, tuple)):
        return
    note = (
        f"hat-ignite: {type(engine).__name__}.state.output is the model outputs (a {type(output).__name__}), "
        f"not the loss Ignite's create_supervised_trainer leaves there. If an Ignite handler read it as a "
        f"loss, build the loop with state_output='loss' (state.output is then the step's loss), or give "
        f"the handler output_transform=loss_output(trainer) (from hat_ignite.engine import loss_output)."
    )
    add_note = getattr(exc, "add_note", None)  # Python 3.11+
    if callable(add_note):
        add_note(note)
    elif len(exc.args) == 1 and isinstance(exc.args[0], str):  # older Pythons: into the message
        exc.args = (f"{exc.args[0]}\n{note}",)
