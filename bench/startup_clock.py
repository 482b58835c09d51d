"""A HAT-style callback (a plain class, no base) that notes when training starts and ends.

``bench/startup.py`` appends it to the shipped config's callbacks. It writes one JSON line per
moment to ``out_file``: ``first_step`` (the first ``on_step_begin``: everything before it is
start-up) and ``loop_end`` (after it, only the command's end-of-run work), each with the wall
clock (``time.time()``, comparable across processes), the CPU time this process has used so
far (``time.process_time()``, all its threads: the start-up's cost without the time spent
waiting for a core that another program held) and the process id, and prints a line
``startup_clock: first_step`` (``loop_end``) to stderr, where ``-X importtime`` writes, so the
imports before the first step can be told from the later ones. It imports nothing that the
command would not import anyway, so it moves no import cost into the measured window.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


class StartupClock:
    """Note the wall clock at the first step's begin and at the loop's end."""

    def __init__(self, out_file: str) -> None:
        self.out_file = out_file
        self.started = False

    def _note(self, moment: str) -> None:
        with open(self.out_file, "a") as f:
            f.write(json.dumps({"moment": moment, "t": time.time(), "cpu": time.process_time(),
                                "pid": os.getpid()}) + "\n")
        sys.stderr.write(f"startup_clock: {moment}\n")
        sys.stderr.flush()

    def on_step_begin(self, **kwargs: Any) -> None:
        if not self.started:
            self.started = True
            self._note("first_step")

    def on_loop_end(self, **kwargs: Any) -> None:
        self._note("loop_end")
