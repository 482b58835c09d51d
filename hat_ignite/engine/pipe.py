"""`PipeBase`: HAT's callbacks pipeline, for loops written by hand.

HAT's engines derive from ``hat.engine.loop_base.PipeBase``: a list of callbacks and one method
per hook (``on_loop_begin(**kwargs)``, ``on_step_end(**kwargs)``...) that calls that hook of
every callback, in list order, with the keywords given. HAT code subclasses it for loops of its
own (an inference runner, a test trainer) and implements :meth:`PipeBase.fit`.

hat-ignite's engines do not need it (they are Ignite engines that fire HAT's hooks as events;
see :mod:`hat_ignite.engine.events`), so ``PipeBase`` is only this small base for hand-written
loops: callbacks written for HAT or for hat-ignite run in it unchanged.

Example:
    >>> class Recorder:
    ...     def __init__(self): self.seen = []
    ...     def on_step_begin(self, step_id, **kwargs): self.seen.append(step_id)
    >>> class TwoSteps(PipeBase):
    ...     def fit(self):
    ...         for step_id in range(2):
    ...             self.on_step_begin(step_id=step_id, loop=self)
    >>> rec = Recorder()
    >>> TwoSteps(callbacks=[rec]).fit()
    >>> rec.seen
    [0, 1]
"""

from __future__ import annotations

import abc
import contextlib
from typing import Any, Iterator, Sequence

__all__ = ["PipeBase", "PIPE_HOOKS"]

#: The hooks a :class:`PipeBase` dispatches (HAT's thirteen plus ``on_optimizer_step_end``).
PIPE_HOOKS: tuple[str, ...] = (
    "on_loop_begin", "on_loop_end", "on_epoch_begin", "on_epoch_end", "on_step_begin", "on_step_end",
    "on_batch_begin", "on_batch_end", "on_forward_begin", "on_forward_end", "on_backward_begin",
    "on_backward_end", "on_optimizer_step_begin", "on_optimizer_step_end",
)


def _as_callbacks(callbacks: Any) -> list[Any]:
    if callbacks is None:
        return []
    return list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]


class PipeBase(abc.ABC):
    """Hold callbacks and call a hook of each, in order; subclasses implement :meth:`fit`.

    Args:
        callbacks: callback objects (HAT callbacks or hat-ignite ones); a single one is taken
            as a one-item list. A callback without a hook method is skipped for that hook.
        profiler: optional; each hook dispatch runs inside ``profiler.profile(name)`` when it
            has that method (HAT's profilers), or between ``profiler.begin(name)`` and
            ``profiler.end()`` (hat-ignite's). With ``None`` nothing is profiled (HAT's default
            writes a SimpleProfiler report under its log directory).

    Attributes:
        name: the class name, used in profiled section names (``on_<name>_step_begin``).
    """

    def __init__(self, callbacks: Sequence[Any] | Any | None = None, profiler: Any = None) -> None:
        self.name = type(self).__name__
        self.profiler = profiler
        self.callbacks: list[Any] = _as_callbacks(callbacks)

    def set_callbacks(self, callbacks: Sequence[Any] | Any | None = None) -> None:
        """Replace the callbacks."""
        self.callbacks = _as_callbacks(callbacks)

    @contextlib.contextmanager
    def _profiled(self, hook: str) -> Iterator[None]:
        profiler = self.profiler
        section = f"on_{self.name}_{hook[3:]}"
        if profiler is not None and hasattr(profiler, "profile"):
            with profiler.profile(section):
                yield
        elif profiler is not None and hasattr(profiler, "begin"):
            profiler.begin(section)
            try:
                yield
            finally:
                profiler.end()
        else:
            yield

    def _dispatch(self, hook: str, kwargs: dict[str, Any]) -> None:
        with self._profiled(hook):
            for callback in self.callbacks:
                method = getattr(callback, hook, None)
                if method is not None:
                    method(**kwargs)

    def on_loop_begin(self, **kwargs: Any) -> None:
        """Call every callback's ``on_loop_begin(**kwargs)``."""
        self._dispatch("on_loop_begin", kwargs)

    def on_loop_end(self, **kwargs: Any) -> None:
        """Call every callback's ``on_loop_end(**kwargs)``."""
        self._dispatch("on_loop_end", kwargs)

    def on_epoch_begin(self, **kwargs: Any) -> None:
        """Call every callback's ``on_epoch_begin(**kwargs)``."""
        self._dispatch("on_epoch_begin", kwargs)

    def on_epoch_end(self, **kwargs: Any) -> None:
        """Call every callback's ``on_epoch_end(**kwargs)``."""
        self._dispatch("on_epoch_end", kwargs)

    def on_step_begin(self, **kwargs: Any) -> None:
        """Call every callback's ``on_step_begin(**kwargs)``."""
        self._dispatch("on_step_begin", kwargs)

    def on_step_end(self, **kwargs: Any) -> None:
        """Call every callback's ``on_step_end(**kwargs)``."""
        self._dispatch("on_step_end", kwargs)

    def on_batch_begin(self, **kwargs: Any) -> None:
        """Call every callback's ``on_batch_begin(**kwargs)``."""
        self._dispatch("on_batch_begin", kwargs)

    def on_batch_end(self, **kwargs: Any) -> None:
        """Call every callback's ``on_batch_end(**kwargs)``."""
        self._dispatch("on_batch_end", kwargs)

    def on_forward_begin(self, **kwargs: Any) -> None:
        """Call every callback's ``on_forward_begin(**kwargs)``."""
        self._dispatch("on_forward_begin", kwargs)

    def on_forward_end(self, **kwargs: Any) -> None:
        """Call every callback's ``on_forward_end(**kwargs)``."""
        self._dispatch("on_forward_end", kwargs)

    def on_backward_begin(self, **kwargs: Any) -> None:
        """Call every callback's ``on_backward_begin(**kwargs)``."""
        self._dispatch("on_backward_begin", kwargs)

    def on_backward_end(self, **kwargs: Any) -> None:
        """Call every callback's ``on_backward_end(**kwargs)``."""
        self._dispatch("on_backward_end", kwargs)

    def on_optimizer_step_begin(self, **kwargs: Any) -> None:
        """Call every callback's ``on_optimizer_step_begin(**kwargs)``."""
        self._dispatch("on_optimizer_step_begin", kwargs)

    def on_optimizer_step_end(self, **kwargs: Any) -> None:
        """Call every callback's ``on_optimizer_step_end(**kwargs)`` (callbacks without it are skipped)."""
        self._dispatch("on_optimizer_step_end", kwargs)

    @abc.abstractmethod
    def fit(self, *args: Any, **kwargs: Any) -> Any:
        """Run the loop, calling the hooks above where they belong."""
