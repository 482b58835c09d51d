"""How the processes of a job are started: forked from a server that has torch and Ignite imported.

A new interpreter spends seconds importing torch and Ignite before a rank does
anything, and a ``spawn``-started job pays that once per rank, on cores the other ranks are using
for the same imports. Where the platform has the ``forkserver`` start method (Linux, macOS),
:func:`rank_start_method` chooses it and :func:`prepare_rank_start` starts the server: a fresh
interpreter (no CUDA, no threads, none of the launching process's state) that imports what every
rank imports once (:mod:`hat_ignite.engine.rank_start.server_imports`: torch and Ignite, with the
garbage collector paused, then frozen); each rank is then forked from it, ready at once.

A forked rank would keep what the server had when it started, where a spawned one gets what the
launching process has when it starts the rank. Python's own preparation gives it the launching
process's ``sys.path``, working directory and main module; the :class:`RankSetup` passed with the
rank's arguments gives it the rest, as the rank unpickles them, before anything of the job runs:
the launching process's environment at launch, and SIGTERM's default action. Then
:func:`begin_rank` and :func:`end_rank`, around the rank's function:

* the processes a rank starts itself (its DataLoader workers) start as they do in the launching
  process, a one-process run or a ``torchrun`` rank: with the platform's default method (``fork``
  on Linux) unless the launching process chose another, or the DataLoader its
  ``multiprocessing_context``. Python would otherwise start them as the rank was started, each
  worker a new interpreter importing torch again at every epoch;
* a forked process ends with ``os._exit``, skipping the ``atexit`` handlers an interpreter runs
  as it exits: they run when the rank's function is done.

The server ignores SIGTERM: a SIGTERM to the whole process group (a scheduler, ``kill -TERM
-PGID``) reaches the ranks and the launching process, which stop the job in order; a server ended
by it would leave the launching process reading every rank as failed (the server reports their
exit codes). It still ends with the launching process, as Python's forkserver does.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import threading
from multiprocessing import forkserver
from typing import Any, Callable

__all__ = ["RankSetup", "begin_rank", "end_rank", "prepare_rank_start", "rank_start_method"]

#: The module the server imports first: torch and Ignite, with the garbage collector paused, then frozen.
SERVER_IMPORTS = "hat_ignite.engine.rank_start.server_imports"


def rank_start_method() -> str:
    """``"forkserver"`` where the platform has it, else ``"spawn"``.

    >>> rank_start_method() in ("forkserver", "spawn")
    True
    """
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def prepare_rank_start(main_func: Callable[..., Any]) -> RankSetup:
    """Start the server the ranks are forked from (once per process); what to pass to each rank.

    The server preloads :data:`SERVER_IMPORTS` and, when it is one of hat-ignite's (the command
    line's worker), the module of ``main_func``. A user's module is left to each rank to import, as a
    spawned rank would: its import may do anything.
    """
    if rank_start_method() == "forkserver":
        module = getattr(main_func, "__module__", None) or ""
        preload = [SERVER_IMPORTS, *([module] if module.startswith("hat_ignite.") else [])]
        multiprocessing.get_context("forkserver").set_forkserver_preload(preload)  # for a server not yet started
        _ensure_server_ignoring_sigterm()
    return RankSetup(dict(os.environ), multiprocessing.get_start_method(allow_none=True))


def _ensure_server_ignoring_sigterm() -> None:
    """Start the forkserver with SIGTERM ignored (a disposition it keeps through ``exec``).

    SIGTERM is blocked meanwhile, so one arriving here waits for this process's own handler,
    restored before it is unblocked (the server keeps it blocked too: each rank unblocks it).
    Outside the main thread no handler can be changed, and the server is started as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()
        return
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            forkserver.ensure_running()
        finally:
            signal.signal(signal.SIGTERM, previous)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


#: In a rank forked from the server: the launching process's start method (``""`` for the
#: platform's default); ``None`` elsewhere. Set as the rank unpickles its RankSetup.
_launch_start_method: str | None = None


def _in_the_rank(environ: dict[str, str], start_method: str | None) -> None:
    """Run in a rank as it unpickles its arguments: give it what a spawned rank starts with."""
    global _launch_start_method
    _launch_start_method = start_method or ""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # the server started with it blocked
    if os.environ != environ:
        os.environ.clear()
        os.environ.update(environ)


def begin_rank() -> None:
    """In a rank forked from the server, as its function begins: the processes it starts start as
    the launching process's would (Python's bootstrap has just made the rank's own start method
    the default); elsewhere nothing."""
    if _launch_start_method is not None:
        method = _launch_start_method or multiprocessing.get_all_start_methods()[0]  # the first is the default
        multiprocessing.set_start_method(method, force=True)


def end_rank() -> None:
    """In a rank forked from the server, run the ``atexit`` handlers now (an interpreter runs them
    as it exits, a forked process ends with ``os._exit``); elsewhere nothing."""
    if _launch_start_method is not None:
        atexit._run_exitfuncs()


class RankSetup:
    """Passed to each rank with its arguments; unpickling it there calls :func:`_in_the_rank`.

    The rank receives ``None`` in its place: the setup is done by then.

    >>> RankSetup({"RANK_SETUP_EXAMPLE": "1"}, None).__reduce__()
    (<function _in_the_rank at ...>, ({'RANK_SETUP_EXAMPLE': '1'}, None))
    """

    def __init__(self, environ: dict[str, str], start_method: str | None) -> None:
        self.environ, self.start_method = environ, start_method

    def __reduce__(self) -> tuple[Callable[[dict[str, str], str | None], None], tuple[dict[str, str], str | None]]:
        return _in_the_rank, (self.environ, self.start_method)
