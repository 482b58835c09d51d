"""bench/convnet_report.py parses its arguments (the full run is the benchmark itself, not a test)."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT, time_limit

SCRIPT = ROOT / "bench" / "convnet_report.py"


def test_help_names_the_options_and_bad_rounds_are_refused():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=time_limit(60))
    assert out.returncode == 0 and all(opt in out.stdout for opt in ("--work-dir", "--reuse", "--rounds"))
    bad = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "0"], capture_output=True, text=True, timeout=time_limit(60))
    assert bad.returncode == 2 and "--rounds must be at least 1" in bad.stderr
