"""`FreezeModule` and `FreezeBNStatistics`: stop parts of the model from changing during training.

What "freeze" means here, as in HAT:

* ``FreezeModule(only_batchnorm=False)``: the named sub-modules go to eval mode (BatchNorm uses
  and keeps its running statistics, dropout is off) and their parameters stop receiving
  gradients (``requires_grad=False``, and any gradient already accumulated for the current
  update is dropped), so neither their weights nor their statistics change any more; the rest
  of the model trains on.
* ``FreezeModule(only_batchnorm=True)``: the named modules go to eval mode as above (their
  BatchNorm running statistics stop changing, their dropout is off, as HAT's ``module.eval()``
  does), but every parameter, BatchNorm's affine weight and bias included, keeps a valid
  gradient and trains on ("only freeze batchnorm, with valid gradient").
* ``FreezeBNStatistics()``: every BatchNorm layer of the model in eval mode, at each epoch begin.
  The loop puts the model in train mode when it begins (also when it resumes), so this is the
  way to keep the statistics frozen from the first step of any run.

The freeze holds for the rest of the run: it is applied again at each epoch begin (a callback
or user code calling ``model.train()`` does not undo it for long), and
:class:`~hat_ignite.callbacks.validation.Validation` restores every module's mode after
validating. Under ``DistributedDataParallel`` a module whose parameters stop receiving
gradients needs the wrapper's ``find_unused_parameters=True``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from hat_ignite.callbacks.base import CallbackMixin
from hat_ignite.checkpoint.payload import unwrap_model
from hat_ignite.callbacks.module_schedule import ModuleScheduleBase, get_submodule

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["FreezeModule", "FreezeBNStatistics", "freeze_batchnorm"]


def freeze_batchnorm(module: nn.Module) -> int:
    """Put every BatchNorm layer inside ``module`` in eval mode; return how many there are.

    >>> net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)).train()
    >>> freeze_batchnorm(net), net[1].training, net[0].training
    (1, False, True)
    """
    count = 0
    for m in module.modules():
        if isinstance(m, _BatchNorm):
            m.eval()
            count += 1
    return count


class FreezeModule(ModuleScheduleBase):
    """Freeze sub-modules from a given step or epoch on (what freezing does: module docs).

    Args:
        modules: one list of sub-module names per entry, e.g. ``[["backbone"], ["neck"]]``.
        step_or_epoch: when each entry is frozen (``global_step_id`` or ``epoch_id``, 0-based).
        update_by: ``"step"`` or ``"epoch"``.
        only_batchnorm: put those modules in eval mode only (BatchNorm statistics and dropout
            frozen, as HAT does); their parameters keep training.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2), nn.Linear(2, 1))
        >>> freeze = FreezeModule(modules=[["0", "1"]], step_or_epoch=[10], update_by="step")
        >>> freeze.process(net, "0")
        >>> net[0].weight.requires_grad, net[0].training, net[2].weight.requires_grad
        (False, False, True)
    """

    def __init__(
        self,
        modules: Sequence[Sequence[str] | str],
        step_or_epoch: Sequence[int],
        update_by: str,
        only_batchnorm: bool = False,
    ) -> None:
        super().__init__(modules, step_or_epoch, update_by)
        self.only_batchnorm = bool(only_batchnorm)

    def process(self, model: nn.Module, name: str) -> None:
        """Freeze the sub-module ``name`` of ``model`` in place."""
        module = get_submodule(unwrap_model(model), name, type(self).__name__)
        module.eval()
        if self.only_batchnorm:
            return
        for p in module.parameters():
            p.requires_grad_(False)
            p.grad = None  # what was accumulated for the running update is not applied

    def apply(self, model: nn.Module, names: list[str], loop: LoopBase | None = None) -> None:
        for name in names:
            self.process(model, name)

    def on_epoch_begin(self, epoch_id: int, model: nn.Module | None = None, loop: LoopBase | None = None,
                       **kwargs: Any) -> None:
        model = self._model(model, loop)
        for entry, done in zip(self.modules, self.done):  # keep earlier freezes in place
            if done:
                self.apply(model, entry, loop)
        super().on_epoch_begin(epoch_id=epoch_id, model=model, loop=loop, **kwargs)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, only_batchnorm={self.only_batchnorm})"


class FreezeBNStatistics(CallbackMixin):
    """Keep every BatchNorm layer's running statistics frozen (eval mode) at each epoch begin.

    Unlike ``FreezeModule(..., step_or_epoch=[0], only_batchnorm=True)`` it needs no module
    names and acts on every epoch, whatever the run resumed from. Parameters keep training.

    Example:
        >>> FreezeBNStatistics().overridden_hooks()
        ['on_epoch_begin']
    """

    def on_epoch_begin(self, model: nn.Module, **kwargs: Any) -> None:
        freeze_batchnorm(unwrap_model(model))
