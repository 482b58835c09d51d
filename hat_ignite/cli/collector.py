"""When the garbage collector of ``hat-train`` and ``hat-predict`` runs: not while the command
starts, never again over what it built before its loop, not over the heap as the process exits.

Such a process holds about a million Python objects once torch and Ignite are imported, and keeps
them to its end. Python's cyclic collector goes through every object it tracks at each full
collection, and starts one whenever what it tracks has grown by a quarter: dozens of passes while
torch is imported, more as the interpreter shuts down, and, now and then, one in the loop: a pause
of the steps as long as a pass over the whole heap. On the shipped config these passes were a third
of the command's CPU time (docs/benchmarks.md).

:func:`collector_phases` wraps a command's body:

* while the command starts, the collector is off: importing creates modules, classes and
  functions, which stay, and hardly any garbage;
* :func:`imports_done` (the config and torch imported): what exists is frozen (``gc.freeze``: the
  collector no longer looks at it) and the collector is on again, for the stage's build, which may
  make much cyclic garbage (a model exported and converted for int8);
* :func:`loop_starts`: one collection (the build's garbage), then what exists is frozen too: the
  loop's collections go through what the loop itself creates;
* as the command ends: nothing frozen, the collector on or off as it was before. A caller running
  the command in its own process (a test, a notebook) finds the collector as it left it, and a
  rank's last collection (:func:`hat_ignite.engine.launcher._release_run_objects`) reaches every
  object of the run;
* as the interpreter exits (an ``atexit`` handler): everything is frozen, so the collections of
  Python's own shutdown skip the heap, whose memory the operating system takes back at once. The
  run's files, logs, event writers and process groups are closed before; Python never promised
  to finalize what is still alive at exit.

An object that exists when the loop starts and becomes garbage in a reference cycle during it is
freed when the command ends, not before; whatever its reference count frees is freed at once, as
always.
"""

from __future__ import annotations

import atexit
import functools
import gc
from typing import Callable, Sequence

__all__ = ["collector_phases", "imports_done", "loop_starts"]


def collector_phases(command: Callable[[Sequence[str]], int]) -> Callable[[Sequence[str]], int]:
    """Run ``command(argv)`` with the collector off until :func:`imports_done`; afterwards nothing
    stays frozen and the collector is as it was.

    >>> @collector_phases
    ... def command(argv):
    ...     return int(gc.isenabled())
    >>> command([]), gc.isenabled(), gc.get_freeze_count()
    (0, True, 0)
    """

    @functools.wraps(command)
    def run(argv: Sequence[str]) -> int:
        _freeze_at_exit()
        enabled = gc.isenabled()
        gc.disable()
        try:
            return command(argv)
        finally:
            gc.unfreeze()
            (gc.enable if enabled else gc.disable)()

    return run


_freezes_at_exit = False


def _freeze_at_exit() -> None:
    """Have the interpreter's exit freeze every object (once per process)."""
    global _freezes_at_exit
    if not _freezes_at_exit:
        atexit.register(gc.freeze)
        _freezes_at_exit = True


def imports_done() -> None:
    """Freeze what the command imported, and turn the collector on for the stage's build."""
    gc.freeze()
    gc.enable()


def loop_starts() -> None:
    """Collect the build's garbage, then freeze what the loop starts with."""
    gc.collect()
    gc.freeze()
