"""SaveTraced: a model trained on digits, traced at loop end, reloaded in a fresh process."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch
from torch.utils.data import DataLoader

from hat_ignite.callbacks import SaveTraced
from hat_ignite.data.digits import DigitsDataset
from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index
from hat_ignite.models.mlp import MLPClassifier
from conftest import time_limit

RELOAD = """
import sys, torch
cases = torch.load(sys.argv[1])
traced = torch.jit.load(sys.argv[2])
print("traced", max((traced(*inputs) - expected).abs().max().item() for inputs, expected in cases))
if len(sys.argv) > 3:
    program = torch.export.load(sys.argv[3]).module()
    inputs, expected = cases[0]  # the program is specialised to the traced batch size
    print("exported", (program(*inputs) - expected).abs().max().item())
"""


def _train(saver: SaveTraced, steps: int = 30) -> MLPClassifier:
    torch.manual_seed(0)
    model = MLPClassifier(in_features=64, hidden_features=32, num_classes=10)
    trainer = Trainer(
        model=model, data_loader=DataLoader(DigitsDataset("train"), batch_size=64, shuffle=True),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
        device=None, stop_by="step", num_steps=steps, callbacks=[saver],
    )
    trainer.fit()
    return model


def _reload_in_fresh_process(tmp_path, cases, *paths) -> dict[str, float]:
    """Load the saved files in a new Python process; the largest output difference of each."""
    data = tmp_path / "cases.pt"
    torch.save(cases, data)
    proc = subprocess.run([sys.executable, "-c", RELOAD, str(data), *map(str, paths)],
                          capture_output=True, text=True, timeout=time_limit(180))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {line.split()[0]: float(line.split()[1]) for line in proc.stdout.splitlines() if line.strip()}


@pytest.mark.parametrize("save_hash", [True, False])
def test_the_trained_model_reloads_in_a_fresh_process_with_equal_outputs(tmp_path, save_hash):
    images = torch.stack([DigitsDataset("val")[i]["img"] for i in range(8)])
    saver = SaveTraced(str(tmp_path / "deploy"), trace_inputs=(images,), name_prefix="float-", save_hash=save_hash)
    model = _train(saver)
    assert model.training  # the training model itself is left as it was
    with torch.no_grad():
        expected = model.eval()(images)
    name = os.path.basename(saver.traced_path)
    if save_hash:
        assert re.fullmatch(r"float-deploy-checkpoint-last-[0-9a-f]{8}\.pt", name)
        data = open(saver.traced_path, "rb").read()
        assert name[-11:-3] == hashlib.sha256(data).hexdigest()[:8]  # sha256sum checks a copy
    else:
        assert name == "float-deploy-checkpoint-last.pt"
    assert saver.exported_path.endswith(".pt2")
    plain = ["float-deploy-checkpoint-last.pt", "float-deploy-checkpoint-last.pt2"]  # always, as in HAT
    hashed = [name, os.path.basename(saver.exported_path)] if save_hash else []
    assert sorted(os.listdir(tmp_path / "deploy")) == sorted(plain + hashed)
    fresh = torch.stack([DigitsDataset("val")[i]["img"] for i in range(8, 40)])  # another batch size too
    with torch.no_grad():
        expected_fresh = model(fresh)
    cases = [((images,), expected), ((fresh,), expected_fresh)]
    diffs = _reload_in_fresh_process(tmp_path, cases, saver.traced_path, saver.exported_path)
    assert diffs["traced"] <= 1e-6 and diffs["exported"] <= 1e-6


def test_a_new_run_replaces_the_hashed_files_of_the_previous_one(tmp_path):
    images = torch.rand(2, 64)
    saver = SaveTraced(str(tmp_path), trace_inputs=(images,))
    _train(saver, steps=2)
    first = saver.traced_path
    _train(saver, steps=5)  # other weights: another hash
    assert saver.traced_path != first and not os.path.exists(first)
    assert sorted(f for f in os.listdir(tmp_path) if f.endswith(".pt")) == sorted(
        ["deploy-checkpoint-last.pt", os.path.basename(saver.traced_path)]
    )


def test_the_deploy_file_is_left_beside_the_hashed_copy_with_hats_names(tmp_path):
    # HAT's own SaveTraced + generate_sha256_file (run outside the repository) leave, for
    # name_prefix "" and save_hash=True: deploy-checkpoint-last.pt and a copy of the same bytes,
    # deploy-checkpoint-last-<first 8 hex digits of its sha256>.pt; an old hashed file is removed.
    from hat_ignite.callbacks.save_traced import DEPLOY_FILE_FORMAT

    assert DEPLOY_FILE_FORMAT % ("", "last") == "deploy-checkpoint-last.pt"
    (tmp_path / "deploy-checkpoint-last-0badc0de.pt").write_bytes(b"an earlier run")
    saver = SaveTraced(str(tmp_path), trace_inputs=(torch.rand(2, 64),), save_exported=False)
    _train(saver, steps=2)
    plain = tmp_path / "deploy-checkpoint-last.pt"
    digest = hashlib.sha256(plain.read_bytes()).hexdigest()[:8]
    assert sorted(os.listdir(tmp_path)) == ["deploy-checkpoint-last-%s.pt" % digest, "deploy-checkpoint-last.pt"]
    assert saver.traced_path == str(tmp_path / ("deploy-checkpoint-last-%s.pt" % digest))
    assert open(saver.traced_path, "rb").read() == plain.read_bytes()


def test_hat_imports_deploy_file_format_from_save_traced(hat_alias):
    from hat.callbacks.save_traced import DEPLOY_FILE_FORMAT, SaveTraced as HatSaveTraced

    assert HatSaveTraced is SaveTraced
    assert DEPLOY_FILE_FORMAT % ("qat-", "last") == "qat-deploy-checkpoint-last.pt"


class Named(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, batch):
        logits = self.fc(batch["img"])
        return {"logits": logits, "probs": logits.softmax(-1)}


def test_output_names_are_stored_and_required_without_allow_anno_miss(tmp_path):
    batch = {"img": torch.rand(2, 4)}
    saver = SaveTraced(str(tmp_path / "named"), trace_inputs=batch, allow_anno_miss=False, save_exported=False)
    path = saver.save(Named())
    extra = {"output_names.json": ""}
    loaded = torch.jit.load(path, _extra_files=extra)
    assert json.loads(extra["output_names.json"]) == ["logits", "probs"]
    assert sorted(loaded(batch)) == ["logits", "probs"]

    unnamed = SaveTraced(str(tmp_path / "bare"), trace_inputs=(torch.rand(2, 4),), allow_anno_miss=False)
    with pytest.raises(ValueError, match=r"output tensors \[0\] of the traced Linear have no name"):
        unnamed.save(torch.nn.Linear(4, 3))
    assert not (tmp_path / "bare").exists() or not os.listdir(tmp_path / "bare")


class Branchy(torch.nn.Module):
    """Data-dependent control flow: traces (one branch) but does not export."""

    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


def test_a_model_that_does_not_export_still_gets_its_traced_file(tmp_path, caplog, capfd):
    saver = SaveTraced(str(tmp_path), trace_inputs=(torch.ones(2, 3),))
    with caplog.at_level(logging.WARNING, logger="hat_ignite.callbacks.save_traced"):
        with pytest.warns(torch.jit.TracerWarning):  # the model's own branch on data: still said
            path = saver.save(Branchy())
    assert os.path.isfile(path) and saver.exported_path is None
    assert "Branchy does not export with torch.export" in caplog.text
    assert "def forward" not in capfd.readouterr().err  # the graph torch printed went to the debug log


def test_lazy_modules_need_forward_before_trace(tmp_path):
    model = torch.nn.Sequential(torch.nn.LazyLinear(3))
    with pytest.raises(RuntimeError, match="forward_before_trace=True"):
        SaveTraced(str(tmp_path), trace_inputs=(torch.ones(2, 5),), save_exported=False).save(model)
    path = SaveTraced(str(tmp_path), trace_inputs=(torch.ones(2, 5),), forward_before_trace=True,
                      save_exported=False).save(model)
    assert torch.jit.load(path)(torch.ones(1, 5)).shape == (1, 3)


class SmallConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 2))

    def forward(self, x):
        return {"logits": self.body(x)}


def test_an_int8_model_is_saved_without_torchs_warnings_about_its_exported_parts(tmp_path):
    """Deep-copying and tracing the quantized submodules (made by torch.export, with its input
    checks) gave a FutureWarning and a TracerWarning that are torch's own, not the model's."""
    from hat_ignite.quantization import Float2QAT, QAT2Quantize

    x = torch.rand(2, 3, 8, 8)
    int8 = QAT2Quantize(inductor=False)(Float2QAT(example_inputs=x)(SmallConvNet()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = SaveTraced(str(tmp_path), trace_inputs=(x,)).save(int8)
    noise = [f"{w.category.__name__}: {w.message}" for w in caught
             if issubclass(w.category, (torch.jit.TracerWarning, FutureWarning))]
    assert noise == []
    assert torch.equal(torch.jit.load(path)(x)["logits"], int8(x)["logits"])
