"""What ``hat-train`` shows while it trains: a tqdm bar on a terminal, a line per epoch otherwise.

A terminal that reports no size (0 columns: a pseudo-terminal nobody sized, as some job runners
and containers give) cannot show a bar, so it gets the line per epoch too
(:func:`has_room_for_a_bar`).

On a terminal the bar and the log share stderr: :class:`ConsoleHandler` writes each log line
through ``tqdm.write``, which lifts the bar, prints the line whole and redraws the bar under it,
so no line is ever printed into the bar. The bar of an epoch disappears when the epoch ends
(StatsMonitor's ``Epoch[n] done`` line records it), and :meth:`TerminalBar.close` removes a bar
left open by an error before the error is reported, so nothing stale is drawn after the command
exits. The loss and lr shown by the bar are read only when the bar redraws (tqdm's
``mininterval``), never on every step.
"""

from __future__ import annotations

import logging
import os
import time
from typing import IO, Any, Callable

__all__ = ["ConsoleHandler", "TerminalBar", "attach_epoch_line", "has_room_for_a_bar"]

logger = logging.getLogger("hat_ignite.cli.train")


def has_room_for_a_bar(stream: IO[str]) -> bool:
    """Whether ``stream`` is a terminal with a size (at least one column) to draw a bar in.

    >>> import io
    >>> has_room_for_a_bar(io.StringIO())
    False
    """
    isatty = getattr(stream, "isatty", None)
    if not (isatty and isatty()):
        return False
    try:
        return os.get_terminal_size(stream.fileno()).columns > 0
    except (OSError, ValueError):  # no size to read
        return False


class ConsoleHandler(logging.StreamHandler):
    """A ``StreamHandler`` that writes through ``tqdm.write`` when its stream is a terminal.

    Args:
        stream: the stream to write to (``sys.stderr``).
    """

    def __init__(self, stream: IO[str]) -> None:
        super().__init__(stream)
        isatty = getattr(stream, "isatty", None)
        self.terminal = bool(isatty and isatty())

    def emit(self, record: logging.LogRecord) -> None:
        if not self.terminal:
            super().emit(record)
            return
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # as StreamHandler does: a failing log line never stops the run
            self.handleError(record)


class TerminalBar:
    """A tqdm bar per epoch of ``trainer``, showing the latest loss and lr.

    Args:
        trainer: the engine (an Ignite ``Engine`` with ``state.losses`` and an ``optimizer``).
        stream: the terminal stream.
        values: returns the ``{name: value}`` shown beside the bar (called only on redraws).
    """

    def __init__(self, trainer: Any, stream: IO[str], values: Callable[[], dict[str, float]]) -> None:
        from ignite.engine import Events

        self.stream = stream
        self.values = values
        self.bar: Any = None
        trainer.add_event_handler(Events.EPOCH_STARTED, self._open)
        trainer.add_event_handler(Events.ITERATION_COMPLETED, self._step)
        trainer.add_event_handler(Events.EPOCH_COMPLETED, self._end_epoch)

    def _open(self, engine: Any) -> None:
        from tqdm import tqdm

        self.close()
        state = engine.state
        self.bar = tqdm(
            total=state.epoch_length, desc=f"Epoch[{state.epoch - 1}]", leave=False, file=self.stream,
            dynamic_ncols=True, initial=(state.iteration % state.epoch_length) if state.epoch_length else 0,
        )

    def _step(self, _engine: Any) -> None:
        bar = self.bar
        if bar is not None and bar.update(1):  # True when tqdm redrew: show fresh values next time
            bar.set_postfix(self.values(), refresh=False)

    def _end_epoch(self, _engine: Any) -> None:
        if self.bar is not None:  # draw the epoch's last state once, then remove the bar
            self.bar.set_postfix(self.values(), refresh=False)
            self.bar.refresh()
        self.close()

    def close(self, _engine: Any = None) -> None:
        """Remove the bar from the terminal (no-op when none is open)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def attach_epoch_line(trainer: Any, values: Callable[[], dict[str, float]]) -> None:
    """Log ``Epoch[n] last loss=... lr=...`` when an epoch ends (0-based ``n``, as HAT's ``epoch_id``)."""
    from ignite.engine import Events

    start = time.perf_counter()

    def epoch_line(engine: Any) -> None:
        shown = " ".join(f"{name}={value:.4g}" for name, value in values().items())
        logger.info("Epoch[%d] last %s (%.1f s)", engine.state.epoch - 1, shown or "step done", time.perf_counter() - start)

    trainer.add_event_handler(Events.EPOCH_COMPLETED, epoch_line)
