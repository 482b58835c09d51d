"""What a rank of a 2-process job sees as it starts (for tests/test_rank_start.py).

:func:`probe_main` runs in each rank, launched in the test's own process by
``launch_distributed``; it writes ``probe{rank}.json`` with its parent process, whether
``torch._dynamo`` (which the server preloads) is already imported, whether the collector is on and
what the server froze before forking it, its environment variable
``PROBE_VALUE``, its SIGTERM action and mask and the start method of the processes it would
start, and registers an ``atexit`` handler that writes ``atexit{rank}.txt``.
"""

from __future__ import annotations

import atexit
import gc
import json
import multiprocessing
import os
import signal
import sys


def probe_main(device, out_dir: str) -> None:
    import ignite.distributed as idist

    rank = idist.get_rank()
    with open(os.path.join(out_dir, f"probe{rank}.json"), "w") as f:
        json.dump({
            "pid": os.getpid(), "ppid": os.getppid(),
            "value": os.environ.get("PROBE_VALUE"),
            "sigterm_default": signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
            "sigterm_blocked": signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, []),
            "start_method": multiprocessing.get_start_method(),
            # nothing of the job imports it before a step: there, only the server's preload did
            "dynamo_imported": "torch._dynamo" in sys.modules,
            "collector_on": gc.isenabled(),
            "frozen": gc.get_freeze_count(),
        }, f)

    def at_exit() -> None:
        with open(os.path.join(out_dir, f"atexit{rank}.txt"), "w") as f:
            f.write("ran")

    atexit.register(at_exit)
