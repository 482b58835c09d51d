"""DumpData: a real run's pickle equals the one HAT's own DumpData writes for the same steps.

``tests/data/hat_dump_data_figures.json`` is the content of the pickle HAT's ``DumpData``
wrote when driven as HAT's Basic (no batch index) and Multi (``batch_idx``) batch processors
call it: the same model, data and SGD as below, 3 steps (every step dumped; every 2nd step for
the two-batch case), arrays as nested lists. The one change to HAT's code for the CPU: its
``convert_numpy`` takes ``.cpu()`` of each tensor, a copy on a GPU but the live tensor on a CPU,
where later updates would rewrite the dumped gradients and weights; the measurement copied there,
as a GPU does (and so does our DumpData, on any device).
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from hat_ignite.callbacks.dump_data import DumpData
from hat_ignite.engine import BasicBatchProcessor, MultiBatchProcessor, Predictor, Trainer
from hat_ignite.registry import build_from_cfg

FIGURES = json.loads((Path(__file__).parent / "data" / "hat_dump_data_figures.json").read_text())


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x, y):
        pred = self.fc(x)
        return {"pred": pred, "loss": ((pred - y) ** 2).mean()}


def batches(n: int) -> list:
    g = torch.Generator().manual_seed(1)
    return [[torch.randn(2, 3, generator=g), torch.randn(2, 2, generator=g)] for _ in range(n)]


def as_lists(obj):
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, dict):
        return {k: as_lists(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [as_lists(v) for v in obj]
    return obj


def assert_close(got, want, where=""):
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), (where, sorted(got), sorted(want))
        for k in want:
            assert_close(got[k], want[k], f"{where}/{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want)):
            assert_close(a, b, f"{where}[{i}]")
    else:
        assert got == pytest.approx(want, rel=1e-6, abs=1e-7), where


def train(tmp_path, multi: bool, **kwargs) -> list:
    torch.manual_seed(0)
    model = Net()
    data = batches(6 if multi else 3)
    loader = [(data[2 * i], data[2 * i + 1]) for i in range(3)] if multi else data
    processor = (MultiBatchProcessor if multi else BasicBatchProcessor)(
        need_grad_update=True, loss_collector=lambda outs: [outs["loss"]])
    dump = build_from_cfg({"type": "DumpData", "output_dir": str(tmp_path), "name_prefix": "d", **kwargs})
    Trainer(model=model, data_loader=loader, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            batch_processor=processor, device=None, num_epochs=1, callbacks=[dump]).fit()
    with open(tmp_path / "d.pkl", "rb") as f:
        return as_lists(pickle.load(f))


def test_basic_processor_dump_equals_hats(tmp_path):
    assert_close(train(tmp_path, multi=False), FIGURES["basic-every-step"])


def test_multi_batch_dump_with_an_interval_equals_hats(tmp_path):
    assert_close(train(tmp_path, multi=True, save_interval=2), FIGURES["multi-every-2nd-step"])


def test_predictor_dumps_batches_and_outputs_only(tmp_path):
    torch.manual_seed(0)
    model = Net().eval()
    Predictor(model=model, data_loader=batches(4), device=None,
              batch_processor=BasicBatchProcessor(need_grad_update=False),
              callbacks=[DumpData(output_dir=str(tmp_path), name_prefix="p")]).fit()
    [rank0] = pickle.load(open(tmp_path / "p.pkl", "rb"))
    assert sorted(rank0) == [f"epoch_0_step_{g}" for g in range(4)]
    assert all(sorted(entries) == ["batch_data", "model_outs"] for entries in rank0.values())


def test_overwrite_false_refuses_an_old_dump(tmp_path):
    (tmp_path / "d.pkl").write_bytes(b"old")
    with pytest.raises(FileExistsError, match=r"d\.pkl exists and overwrite=False"):
        train(tmp_path, multi=False, overwrite=False)
    assert (tmp_path / "d.pkl").read_bytes() == b"old"
    with pytest.raises(ValueError, match="interval_by='iter'"):
        DumpData(output_dir=str(tmp_path), interval_by="iter")
    assert os.listdir(tmp_path) == ["d.pkl"]
