"""bench/gpu_step.py runs on the CPU with tiny sizes (no GPU here) and prints every row."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
from conftest import time_limit

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "gpu_step.py"


@pytest.mark.parametrize("optimizer", ["sgd-fused", "adamw"])
def test_quick_cpu_run_prints_every_variant_and_skips_the_sync_check(optimizer):
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--quick", "--optimizer", optimizer], cwd=ROOT,
                          capture_output=True, text=True, timeout=time_limit(300))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for row in ("raw loop", "bare Ignite Engine", "Trainer + shipped per-step callbacks"):
        line = next(line for line in out.splitlines() if line.startswith(row))
        assert float(line[len(row):].split()[0]) > 0  # steps/s
    assert "sync check: skipped" in out


def test_asking_for_cuda_without_a_gpu_says_what_to_pass():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the default --device cuda runs")
    proc = subprocess.run([sys.executable, str(BENCH)], cwd=ROOT, capture_output=True, text=True, timeout=time_limit(120))
    assert proc.returncode == 2 and "pass --device cpu" in proc.stderr
