"""`DataWait`: how long the training loop has been waiting for its next batch, and a watchdog.

A data loader can hang: a dataset blocked on a file or the network, a deadlock inside a worker,
a worker that died without a word. The loop then waits in ``next(iterator)`` forever, printing
nothing. :class:`DataWait` wraps the epoch's data iterator so that each fetch records when it
began (a clock read before and a flag cleared after: no host-device sync, well under a
microsecond), and a daemon thread that wakes a few times per limit (at most every 30 s) reads
that time. Once a fetch has waited ``limit`` seconds it logs a warning naming the wait, the
batch being fetched, the loader's settings and what to do; it repeats every further ``limit``
seconds of the same wait.

A stop request (SIGTERM) that arrives while the loop waits would otherwise wait for a batch
that may never come: :meth:`DataWait.interrupt` (called by the signal handler, in the main
thread) raises :class:`DataWaitInterrupted` inside the fetch, and the wrapped iterator hands it
to the loop, which writes the resumable checkpoint of the last finished step and stops.

>>> wait = DataWait([1, 2], limit=60.0, where=lambda: "epoch_id=0")
>>> it = wait.watch(iter([1, 2]), on_interrupt=lambda: None)
>>> next(it), wait.since is None, wait.waiting()
(1, True, False)
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["DataWait", "DataWaitInterrupted", "loader_settings", "DEFAULT_DATA_WAIT_LIMIT"]

logger = logging.getLogger("hat_ignite.engine.data_wait")

#: Seconds a training step may wait for its batch before the watchdog reports a stuck loader.
DEFAULT_DATA_WAIT_LIMIT = 300.0


class DataWaitInterrupted(BaseException):
    """Raised inside a batch fetch to end the wait (a stop was requested while waiting).

    A ``BaseException``, like ``KeyboardInterrupt``, so a dataset's ``except Exception`` retry
    loop does not swallow it.
    """


def loader_settings(loader: Any) -> str:
    """The loader's class and the settings that matter for a stuck fetch.

    >>> import torch
    >>> loader_settings(torch.utils.data.DataLoader(list(range(4)), batch_size=2))
    'DataLoader(dataset=list, batch_size=2, num_workers=0, timeout=0, prefetch_factor=None, persistent_workers=False, pin_memory=False)'
    >>> loader_settings(iter([]))
    'list_iterator'
    """
    names = ("batch_size", "num_workers", "timeout", "prefetch_factor", "persistent_workers", "pin_memory")
    found = [f"{n}={getattr(loader, n)!r}" for n in names if hasattr(loader, n)]
    if not found:
        return type(loader).__name__
    dataset = getattr(loader, "dataset", None)
    head = [f"dataset={type(dataset).__name__}"] if dataset is not None else []
    return f"{type(loader).__name__}({', '.join(head + found)})"


class _WatchedIterator:
    """An epoch's data iterator whose ``next()`` records the wait in a :class:`DataWait`."""

    __slots__ = ("_it", "_wait", "_on_interrupt")

    def __init__(self, iterator: Iterator, wait: DataWait, on_interrupt: Callable[[], Any]) -> None:
        self._it = iterator
        self._wait = wait
        self._on_interrupt = on_interrupt

    def __iter__(self) -> _WatchedIterator:
        return self

    def __next__(self) -> Any:
        wait = self._wait
        try:  # everything inside: a signal may land between any two of these lines
            wait.since = time.monotonic()
            batch = next(self._it)
            wait.since = None
            return batch
        except DataWaitInterrupted:
            wait.since = None
            return self._on_interrupt()
        except BaseException:
            wait.since = None
            raise


class DataWait:
    """The fetch-time record of one loop's data iterator, and its watchdog thread.

    Args:
        loader: the data loader (named with its settings in the report).
        limit: seconds a fetch may wait before it is reported; ``0`` or ``None``: no watchdog
            (the fetch is still recorded, so a stop can end it).
        where: returns the batch being fetched, for the report (``"epoch_id=1, global_step_id=40"``).
        owner: the loop's name in the report.
    """

    def __init__(self, loader: Any, limit: float | None, where: Callable[[], str], owner: str = "training loop") -> None:
        self.loader = loader
        self.limit = float(limit or 0)
        self.where = where
        self.owner = owner
        #: ``time.monotonic()`` when the running fetch began; ``None`` while not fetching.
        self.since: float | None = None
        self._thread_id: int | None = None
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None

    def watch(self, iterator: Iterator, on_interrupt: Callable[[], Any]) -> Iterator:
        """Wrap an epoch's iterator; ``on_interrupt()`` supplies ``next()``'s result after an interrupt."""
        self._thread_id = threading.get_ident()
        return _WatchedIterator(iterator, self, on_interrupt)

    def waiting(self) -> bool:
        """Whether the calling thread is the one inside a fetch right now."""
        return self.since is not None and self._thread_id == threading.get_ident()

    def interrupt(self, reason: str) -> None:
        """End the running fetch of the calling thread by raising :class:`DataWaitInterrupted`.

        For a signal handler: it runs in the main thread, between two bytecodes of whatever the
        main thread runs. Does nothing when that thread is not waiting for a batch.
        """
        if self.waiting():
            raise DataWaitInterrupted(reason)

    def start(self) -> None:
        """Start the watchdog thread (no-op without a limit, or when it runs already)."""
        if self.limit <= 0 or (self._watchdog is not None and self._watchdog.is_alive()):
            return
        self._stop.clear()
        ref = weakref.ref(self)
        interval = min(max(self.limit / 4, 0.05), 30.0)
        self._watchdog = threading.Thread(
            target=_watch, args=(ref, self._stop, interval), name="hat-ignite-data-watchdog", daemon=True,
        )
        self._watchdog.start()

    def stop(self) -> None:
        """Stop the watchdog thread."""
        self._stop.set()
        self._watchdog = None

    def report(self, waited: float) -> str:
        """The warning for a fetch that has waited ``waited`` seconds."""
        return (
            f"No batch from the data loader for {waited:.0f} s: the {self.owner} waits for the batch of "
            f"{self.where()} (the limit is {self.limit:g} s). Loader: {loader_settings(self.loader)}. The input "
            f"pipeline looks stuck: a dataset blocked on a file or the network, a deadlock in a worker, or a "
            f"worker that died silently. `py-spy dump --pid {os.getpid()}` (and each worker's pid) shows where "
            f"it waits; DataLoader(timeout=...) makes a stuck worker fail instead of wait; SIGTERM stops the "
            f"run now with a resumable checkpoint of the last finished step. If fetching a batch really "
            f"takes this long, raise the limit (hat-train --data-wait-limit SECONDS, or the loop's "
            f"data_wait_limit; 0 turns the check off)."
        )


def _watch(ref: weakref.ReferenceType, stop: threading.Event, interval: float) -> None:
    """The watchdog thread: wakes every ``interval`` seconds and reports a fetch past the limit."""
    reported: float | None = None  # the fetch reported last (its start time)
    next_report = 0.0
    while not stop.wait(interval):
        wait = ref()
        if wait is None:  # the loop is gone
            return
        since = wait.since
        if since is None:
            continue
        waited = time.monotonic() - since
        if since != reported:
            reported, next_report = since, wait.limit
        if waited >= next_report:
            logger.warning(wait.report(waited))
            next_report = waited + wait.limit
        del wait
