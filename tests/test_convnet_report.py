"""The conv-net and int8 speed benchmarks parse their arguments (the full runs are the benchmarks themselves, not tests)."""

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


def test_int8_speed_bench_names_its_options_and_refuses_bad_ones():
    script = ROOT / "bench" / "int8_speed.py"
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=time_limit(60))
    assert out.returncode == 0 and all(opt in out.stdout for opt in ("--work-dir", "--rounds", "--threads"))
    for args, message in ((["--rounds", "0"], "--rounds must be at least 1"),
                          (["--threads", "1,x"], "give comma-separated integers"),
                          (["--threads", "0"], "each count must be at least 1")):
        bad = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=time_limit(60))
        assert bad.returncode == 2 and message in bad.stderr, args
