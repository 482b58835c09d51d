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
from typing import TYPE_CHECKING, Any

import torch

from hat_ignite.engine.processors.batch_ops import total_loss

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["LossOutput", "loss_output"]


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
