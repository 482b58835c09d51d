"""A callback the history/best/metrics resume tests put into the shipped config with ``--opts``.

``KillAt`` sends a real signal to its own process at a precise point of a ``hat-train`` run:

- ``step=K``: in ``on_step_end`` of global step ``K`` (before the later callbacks of that step);
- ``best_write=N``: right before the ``N``-th write of the ``best`` file of the trainer's
  ``Checkpoint`` callback in this process, i.e. after that save point's periodic file and
  ``last`` are written.

- ``validation=N``: among a ``Validation``'s callbacks, in the first step of the ``N``-th
  validation run (its ``Predictor``), i.e. while the trainer waits for that validation.

``signal_name`` is ``"SIGKILL"`` (default) or ``"SIGTERM"``. Without ``step``, ``best_write`` or ``validation`` it
does nothing, so a straight run and a resumed run carry the same callback list as the killed run.
The tests import it as ``kill_hooks.KillAt`` (the ``tests`` directory is on the child's path).
"""

from __future__ import annotations

import os
import signal
from typing import Any

from hat_ignite.callbacks import CallbackMixin


class KillAt(CallbackMixin):
    """Signals this process at ``step`` or before the ``best_write``-th ``best`` write."""

    def __init__(self, step: int | None = None, best_write: int | None = None, signal_name: str = "SIGKILL",
                 validation: int | None = None) -> None:
        self.step = step
        self.best_write = best_write
        self.validation = validation
        self.runs = 0  # loops begun (validation runs, when among a Validation's callbacks)
        self.signum = getattr(signal, signal_name)

    def _fire(self) -> None:
        os.kill(os.getpid(), self.signum)

    def on_loop_begin(self, loop: Any = None, **kwargs: Any) -> None:
        self.runs += 1
        if self.best_write is None:
            return
        writers = [cb for cb in loop.callbacks if type(cb).__name__ == "Checkpoint"]
        assert len(writers) == 1, writers
        writer, calls = writers[0], []
        original = writer._write_best

        def write_best(payload: Any, path: Any) -> None:
            calls.append(path)
            if len(calls) == self.best_write:
                self._fire()
            original(payload, path)

        writer._write_best = write_best

    def on_step_end(self, global_step_id: int = 0, step_id: int = 0, **kwargs: Any) -> None:
        if self.step is not None and global_step_id == self.step:
            self._fire()
        if self.validation is not None and self.runs == self.validation and step_id == 0:
            self._fire()
