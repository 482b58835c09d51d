"""Run a command on a real pseudo-terminal and collect everything it draws there."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import termios
import threading
from typing import Sequence
from conftest import time_limit


def run_on_a_pty(cmd: Sequence[str], cwd, rows: int, columns: int, stdout_too: bool = True,
                 timeout: float = 240) -> tuple[int, str]:
    """``(exit code, text)`` of ``cmd`` run with stderr (and stdout, with ``stdout_too``) on a
    ``rows`` x ``columns`` pseudo-terminal; ``text`` is all it wrote there, undecoded escapes kept."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    proc = subprocess.Popen(list(cmd), cwd=cwd, stdout=terminal if stdout_too else subprocess.DEVNULL,
                            stderr=terminal)
    os.close(terminal)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(controller, 4096)
            except OSError:  # the terminal closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=time_limit(timeout))
    finally:
        proc.kill()
    reader.join(timeout=10)
    os.close(controller)
    return code, b"".join(chunks).decode("utf-8", "replace")
