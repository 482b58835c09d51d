"""`CallbackMixin`: HAT's callback interface, attached as Ignite handlers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ignite.engine.events import RemovableEventHandle

from hat_ignite.engine.dispatch import attach_hooks, is_noop
from hat_ignite.engine.events import HOOK_EVENTS

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["CallbackMixin"]


class CallbackMixin:
    """Callback interface: override any of the thirteen ``on_*`` hooks.

    Each hook receives HAT's keyword arguments (see :data:`hat_ignite.engine.HOOK_KWARGS`) and
    should take ``**kwargs`` for the ones it does not use. :meth:`attach` registers only the hooks
    a subclass overrides with a method that does something (a body of only ``pass`` or a
    docstring is a no-op and is not attached), each as one Ignite handler on its
    :class:`~hat_ignite.engine.HatEvents` event; a hook that asks for a keyword it is never
    passed, or an ``on_*`` method that is no hook (``on_step_ends``), is rejected right there.

    Callbacks written for HAT need not subclass this class: any object with HAT hooks and no
    ``attach`` method is attached the same way (see
    :func:`~hat_ignite.engine.dispatch.attach_hat_callback`).

    Example:
        >>> class CountSteps(CallbackMixin):
        ...     def __init__(self):
        ...         self.steps = 0
        ...     def on_step_end(self, global_step_id, **kwargs):
        ...         self.steps = global_step_id + 1
        >>> CountSteps().overridden_hooks()
        ['on_step_end']
    """

    def on_loop_begin(self, *args: Any, **kwargs: Any) -> None:
        """Once, before the first epoch."""

    def on_epoch_begin(self, *args: Any, **kwargs: Any) -> None:
        """At the start of each epoch (after the sampler's ``set_epoch``)."""

    def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
        """At the start of each step."""

    def on_batch_begin(self, *args: Any, **kwargs: Any) -> None:
        """Before each batch; a multitask step may have several batches."""

    def on_forward_begin(self, *args: Any, **kwargs: Any) -> None:
        """Right before each batch's forward (after the device move and batch transforms)."""

    def on_forward_end(self, *args: Any, **kwargs: Any) -> None:
        """Right after each batch's forward (and inverse transforms)."""

    def on_backward_begin(self, *args: Any, **kwargs: Any) -> None:
        """Right before each batch's backward (training only)."""

    def on_backward_end(self, *args: Any, **kwargs: Any) -> None:
        """After each batch's backward (training only)."""

    def on_optimizer_step_begin(self, *args: Any, **kwargs: Any) -> None:
        """Right before each optimizer update (gradients final, not yet checked or clipped)."""

    def on_batch_end(self, *args: Any, **kwargs: Any) -> None:
        """After each batch; a multitask step may have several batches."""

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        """At the end of each step, after the batch processor returns."""

    def on_epoch_end(self, *args: Any, **kwargs: Any) -> None:
        """At the end of each epoch, or when a step limit ends the run inside one."""

    def on_loop_end(self, *args: Any, **kwargs: Any) -> None:
        """Once, after the last epoch."""

    def overridden_hooks(self) -> list[str]:
        """The hook names this callback's class implements (not as a no-op), in firing order."""
        cls = type(self)
        return [h for h in HOOK_EVENTS if not is_noop(getattr(cls, h))]

    def hook_methods(self) -> dict[str, Callable[..., Any]]:
        """The bound method to attach for each hook of :meth:`overridden_hooks`."""
        return {h: getattr(self, h) for h in self.overridden_hooks()}

    def attach(self, engine: LoopBase) -> list[RemovableEventHandle]:
        """Register the overridden hooks on ``engine``; return handles to detach them."""
        return attach_hooks(engine, self, self.hook_methods())

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
