"""`ModuleScheduleBase`: act on named sub-modules from a given step or epoch on.

Shared by :class:`~hat_ignite.callbacks.freeze.FreezeModule` and
:class:`~hat_ignite.callbacks.fuse_bn.FuseBN`, whose arguments are HAT's: ``modules`` (one list
of sub-module names per entry), ``step_or_epoch`` (when each entry acts) and ``update_by``.

An entry acts once per run, at the first ``on_step_begin`` whose ``global_step_id`` (or
``on_epoch_begin`` whose ``epoch_id``) is at least its ``step_or_epoch``: before that step's
forward, or before the epoch's first step. A run resumed past that point acts at its first step.
Names are dotted paths from the (unwrapped) model, as ``model.get_submodule`` takes them
(``"backbone"``, ``"backbone.stage1"``; ``""`` is the whole model); they are checked at loop
begin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from torch import nn

from hat_ignite.callbacks.base import CallbackMixin
from hat_ignite.checkpoint.payload import unwrap_model

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["ModuleScheduleBase", "get_submodule"]

_UPDATE_BY = ("step", "epoch")


def get_submodule(model: nn.Module, name: str, owner: str) -> nn.Module:
    """``model.get_submodule(name)`` with an error that lists the names there are.

    >>> net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    >>> get_submodule(net, "1", "FreezeModule") is net[1]
    True
    """
    try:
        return model.get_submodule(name)
    except AttributeError:
        children = [n for n, _ in model.named_children()]
        raise ValueError(
            f"{owner}: the model ({type(model).__name__}) has no sub-module {name!r}. Use a dotted path "
            f"from the model, e.g. one of its children {children[:10]}."
        ) from None


class ModuleScheduleBase(CallbackMixin):
    """Call :meth:`apply` on each entry's sub-modules once its step or epoch is reached.

    Args:
        modules: a list with one list of sub-module names per entry (a bare name is taken as a
            one-name list).
        step_or_epoch: when each entry acts (a ``global_step_id`` or an ``epoch_id``, 0-based);
            same length as ``modules``.
        update_by: ``"step"`` or ``"epoch"``.
    """

    def __init__(self, modules: Sequence[Sequence[str] | str], step_or_epoch: Sequence[int], update_by: str) -> None:
        owner = type(self).__name__
        if isinstance(modules, str) or not isinstance(modules, (list, tuple)):
            raise TypeError(f"{owner}: modules must be a list of lists of sub-module names, got {modules!r}.")
        entries = [[m] if isinstance(m, str) else list(m) for m in modules]
        for entry in entries:
            if not all(isinstance(n, str) for n in entry):
                raise TypeError(f"{owner}: every module name must be a string, got {entry!r} in modules.")
        if isinstance(step_or_epoch, int) and not isinstance(step_or_epoch, bool):
            step_or_epoch = [step_or_epoch] * len(entries)
        points = list(step_or_epoch)
        if len(points) != len(entries):
            raise ValueError(
                f"{owner}: step_or_epoch needs one value per modules entry; got {len(points)} values "
                f"for {len(entries)} entries."
            )
        if any(isinstance(p, bool) or not isinstance(p, int) or p < 0 for p in points):
            raise ValueError(f"{owner}: step_or_epoch values must be integers >= 0, got {points!r}.")
        update_by = update_by.lower() if isinstance(update_by, str) else update_by
        if update_by not in _UPDATE_BY:
            raise ValueError(f"{owner}: update_by must be 'step' or 'epoch', got {update_by!r}.")
        self.modules = entries
        self.step_or_epoch = points
        self.update_by = update_by
        self.done = [False] * len(entries)

    def apply(self, model: nn.Module, names: list[str], loop: LoopBase | None = None) -> None:
        """Act on the sub-modules ``names`` of ``model``; subclasses implement it.

        ``loop`` is the running loop, or ``None`` when the hooks are called by hand (HAT's unit
        tests, a :class:`~hat_ignite.engine.PipeBase` loop) with only the ``model`` keyword.
        """
        raise NotImplementedError

    def check_model(self, model: nn.Module) -> None:
        """Raise when a configured name is not a sub-module of ``model``."""
        inner = unwrap_model(model)
        for entry in self.modules:
            for name in entry:
                get_submodule(inner, name, type(self).__name__)

    def overridden_hooks(self) -> list[str]:
        """``on_loop_begin`` and the begin hook of ``update_by``'s unit (plus subclass hooks)."""
        unused = {"on_step_begin"} if self.update_by == "epoch" else {"on_epoch_begin"}
        if type(self).on_epoch_begin is not ModuleScheduleBase.on_epoch_begin:
            unused.discard("on_epoch_begin")  # a subclass wants epoch begins in either mode
        return [h for h in super().overridden_hooks() if h not in unused]

    @staticmethod
    def _model(model: nn.Module | None, loop: LoopBase | None) -> nn.Module:
        if model is None:
            if loop is None:
                raise TypeError("the hook needs the model: pass model= (or loop=).")
            return loop.model
        return model

    def _due(self, model: nn.Module, loop: LoopBase | None, now: int) -> None:
        for i, at in enumerate(self.step_or_epoch):
            if not self.done[i] and now >= at:
                self.apply(model, self.modules[i], loop)
                self.done[i] = True

    def on_loop_begin(self, model: nn.Module, **kwargs: Any) -> None:
        self.check_model(model)
        self.done = [False] * len(self.modules)

    def on_epoch_begin(self, epoch_id: int, model: nn.Module | None = None, loop: LoopBase | None = None,
                       **kwargs: Any) -> None:
        if self.update_by == "epoch":
            self._due(self._model(model, loop), loop, epoch_id)

    def on_step_begin(self, global_step_id: int, model: nn.Module | None = None, loop: LoopBase | None = None,
                      **kwargs: Any) -> None:
        if self.update_by == "step":
            self._due(self._model(model, loop), loop, global_step_id)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(modules={self.modules}, step_or_epoch={self.step_or_epoch}, update_by={self.update_by!r})"
