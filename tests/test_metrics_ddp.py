"""In 2-process DDP, every HAT metric reports the value one process computes over all the data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import time_limit

sys.path.insert(0, str(Path(__file__).parent))
from metrics_ddp_worker import metric_values  # noqa: E402

WORKER = Path(__file__).parent / "metrics_ddp_worker.py"


def test_two_process_metrics_equal_the_single_process_values(tmp_path):
    out_file = tmp_path / "values.pt"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).parents[1]))
    proc = subprocess.run([sys.executable, str(WORKER), str(out_file)], capture_output=True, text=True,
                          timeout=time_limit(180), env=env, start_new_session=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    two = torch.load(out_file, weights_only=True)
    one = metric_values(rank=0, world_size=1)
    assert set(two) == set(one) == {"acc", "top2", "loss", "miou", "map", "acc_ignore", "acc_index", "losses",
                                    "first_only", "loss_first"}
    for key in one:
        name_one, value_one = one[key]
        name_two, value_two = two[key]
        assert name_two == name_one
        assert value_two == pytest.approx(value_one, rel=1e-6), key
    # each rank alone saw different data, so the agreement above is the cross-rank reduction's doing
    assert metric_values(rank=0, world_size=2)["acc"][1] != pytest.approx(one["acc"][1])
