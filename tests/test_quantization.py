"""int8 conversion over torchao PT2E: prepare, calibrate, QAT, convert, save/reload, misuse errors."""

from __future__ import annotations

import copy
import logging
import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from hat_ignite.callbacks.checkpoint_io import atomic_save, with_content_hash
from hat_ignite.callbacks.checkpoint_state import LoadCheckpoint
from hat_ignite.data import DigitsDataset
from hat_ignite.errors import QuantizationError
from hat_ignite.models import MLPClassifier
from hat_ignite.quantization import (
    Calibration2QAT,
    Calibration2Quantize,
    Float2Calibration,
    Float2QAT,
    ModelConvertPipeline,
    QAT2Quantize,
    load_quantized_model,
    observing,
    save_quantized_model,
    tensor_bytes,
)
from hat_ignite.registry import build_from_cfg

from conftest import ROOT, time_limit


@pytest.fixture(scope="module")
def digits():
    torch.manual_seed(0)
    train = DataLoader(DigitsDataset(split="train"), batch_size=64, shuffle=True)
    val = DataLoader(DigitsDataset(split="val"), batch_size=360)
    model = MLPClassifier(hidden_features=64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(4):
        model.train()
        for batch in train:
            losses, _ = model(batch)
            opt.zero_grad()
            losses["cls_loss"].backward()
            opt.step()
    return model, train, val


def accuracy(model, val):
    model.eval()
    with torch.no_grad():
        batch = next(iter(val))
        return (model(batch).argmax(1) == batch["labels"]).float().mean().item()


def calibrate(model, train, steps=5):
    model.eval()
    with torch.no_grad(), observing(model):
        for i, batch in enumerate(train):
            if i == steps:
                break
            model(batch)
    return model


def test_calibrated_and_int8_models_keep_float_accuracy(digits):
    float_model, train, val = digits
    float_acc = accuracy(float_model, val)
    assert float_acc > 0.9
    cal = calibrate(Float2Calibration(example_data_loader=train, modules=["net"])(copy.deepcopy(float_model)), train)
    assert abs(accuracy(cal, val) - float_acc) <= 0.01
    int8 = Calibration2Quantize()(cal)
    assert int8.net.stage == "quantized"
    assert abs(accuracy(int8, val) - float_acc) <= 0.01
    weights = [t for t in int8.state_dict().values() if t.dtype == torch.int8]
    assert len(weights) == 2  # both Linear weights are int8 tensors; the float ones are gone
    assert tensor_bytes(int8) < tensor_bytes(float_model) / 2


def test_calibration_checkpoint_reloads_into_a_model_prepared_again(digits, tmp_path):
    float_model, train, val = digits
    prepare = Float2Calibration(example_data_loader=train, modules=["net"])
    cal = calibrate(prepare(copy.deepcopy(float_model)), train)
    path = atomic_save(with_content_hash({"state_dict": cal.state_dict()}), tmp_path / "cal.pth.tar")
    again = LoadCheckpoint(path)(prepare(MLPClassifier(hidden_features=64)))  # strict shapes and keys
    batch = next(iter(val))
    with torch.no_grad():
        assert torch.equal(again.eval()(batch), cal.eval()(batch))
        assert torch.equal(QAT2Quantize()(again)(batch), QAT2Quantize()(cal)(batch))


def test_validation_does_not_move_calibrated_ranges(digits):
    float_model, train, val = digits
    cal = calibrate(Float2Calibration(example_data_loader=train, modules=["net"])(copy.deepcopy(float_model)), train)
    before = {k: v.clone() for k, v in cal.state_dict().items()}
    accuracy(cal, val)  # eval outside a calibration step: fake-quantized, observers frozen
    after = cal.state_dict()
    ranges = [k for k in after if k.endswith(("min_val", "max_val"))]  # scales are derived from these
    assert ranges and all(torch.equal(before[k], after[k]) for k in ranges)


def test_qat_trains_through_fake_quant_and_converts(digits):
    float_model, train, val = digits
    model = Float2QAT(example_data_loader=train, modules=["net"])(copy.deepcopy(float_model))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model.train()
    for i, batch in enumerate(train):
        losses, _ = model(batch)
        opt.zero_grad()
        losses["cls_loss"].backward()
        opt.step()
    qat_acc = accuracy(model, val)
    assert qat_acc > 0.9
    assert abs(accuracy(QAT2Quantize()(model), val) - qat_acc) <= 0.01


def test_int8_model_reloads_in_a_fresh_process_with_identical_outputs(digits, tmp_path):
    float_model, train, val = digits
    int8 = QAT2Quantize()(calibrate(Float2Calibration(example_data_loader=train, modules=["net"])(copy.deepcopy(float_model)), train))
    batch = next(iter(val))
    path = save_quantized_model(int8, tmp_path / "int8.pt2", batch)
    with torch.no_grad():
        torch.save({"batch": batch, "out": int8(batch)}, tmp_path / "ref.pt")
    # readable like every other file the run writes (rw-r--r-- under the usual umask 022)
    assert os.stat(path).st_mode & 0o777 == os.stat(tmp_path / "ref.pt").st_mode & 0o777
    code = (
        "import sys, torch\n"
        "from hat_ignite.quantization import load_quantized_model\n"
        f"ref = torch.load({str(tmp_path / 'ref.pt')!r})\n"
        f"model = load_quantized_model({path!r})\n"
        "with torch.no_grad():\n"
        "    assert torch.equal(model(ref['batch']), ref['out'])\n"
        "    small = {k: v[:7] for k, v in ref['batch'].items()}\n"
        "    assert torch.equal(model(small), ref['out'][:7])\n"
        "print('identical')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=time_limit(120), cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("identical")


def test_a_model_prepared_whole_saves_and_loads_with_its_batch_entries_it_does_not_use(tmp_path):
    """A prepared module at the root, and a dict batch with labels the model ignores: the program
    takes the entries the model uses and a whole batch still."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))

        def forward(self, data):
            return self.body(data["img"])

    batch = dict(img=torch.randn(4, 3, 8, 8), labels=torch.zeros(4, dtype=torch.long))
    model = Float2Calibration(example_inputs=batch)(Net())
    assert type(model).__name__ == "PreparedModule"
    with observing(model):
        model.eval()(batch)
    int8 = QAT2Quantize(inductor=False)(model)
    loaded = load_quantized_model(save_quantized_model(int8, tmp_path / "int8.pt2", batch), inductor=False)
    assert torch.equal(loaded(batch), int8(batch))
    assert torch.equal(loaded(dict(img=batch["img"][:3])), int8(batch)[:3])


def test_a_prepared_model_copies_without_torchs_deprecation_warning():
    """EMA, validation and SaveTraced copy models; copying a graph made by torch.export gave a
    FutureWarning of torch's own (its input structure's LeafSpec)."""
    x = torch.rand(2, 3, 8, 8)
    qat = Float2QAT(example_inputs=x)(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()))
    for model in (qat, QAT2Quantize(inductor=False)(copy.deepcopy(qat))):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            copied = copy.deepcopy(model)
        assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == []
        assert copied is not model and torch.equal(copied.eval()(x), model.eval()(x))


class _DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # a Python branch on tensor data: torch.export cannot capture it
            return x * 2
        return x


def test_unexportable_model_names_the_failing_module(capfd, caplog):
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), _DataDependent()))
    with caplog.at_level(logging.DEBUG, "hat_ignite.pt2.export"), pytest.raises(QuantizationError) as err:
        Float2Calibration(example_inputs=torch.rand(3, 4))(model)
    text = str(err.value)
    assert "'1.1' (_DataDependent)" in text and "x.sum() > 0" in text and "modules=[...]" in text
    # the graph torch printed before it raised (once per failed try) is in the debug log, not on stderr
    assert "def forward" not in capfd.readouterr().err
    graphs = [r for r in caplog.records if r.name == "hat_ignite.pt2.export" and "def forward" in r.getMessage()]
    assert graphs and "torch.export of Sequential failed (GuardOnDataDependentSymNode)" in graphs[0].getMessage()


def test_misuse_errors_name_the_fix(digits):
    float_model, train, _ = digits
    with pytest.raises(QuantizationError, match="never prepared.*Float2Calibration"):
        Calibration2QAT()(copy.deepcopy(float_model))
    with pytest.raises(QuantizationError, match="never prepared"):
        QAT2Quantize()(copy.deepcopy(float_model))
    cal = Float2Calibration(example_data_loader=train, modules=["net"])(copy.deepcopy(float_model))
    with pytest.raises(QuantizationError, match="Calibration2QAT"):
        cal.train()(next(iter(train)))  # QAT on a calibration model that was never prepared for QAT
    with pytest.raises(QuantizationError, match="already prepared"):
        Float2Calibration(example_data_loader=train, modules=["net"])(cal)
    with pytest.raises(QuantizationError, match="does not have"):
        Float2Calibration(example_data_loader=train, modules=["body"])(copy.deepcopy(float_model))
    with pytest.raises(QuantizationError, match="example_inputs"):
        Float2Calibration()(copy.deepcopy(float_model))
    with pytest.raises(QuantizationError, match="cannot be trained"):
        QAT2Quantize()(cal).train()(next(iter(train)))


def test_pipeline_builds_registered_converters():
    pipeline = build_from_cfg(dict(type="ModelConvertPipeline", converters=[
        dict(type="Float2QAT", example_inputs=torch.rand(2, 3)), dict(type="QAT2Quantize"),
    ]))
    assert isinstance(pipeline, ModelConvertPipeline)
    model = pipeline(nn.Linear(3, 2))
    assert model.stage == "quantized" and model(torch.rand(5, 3)).shape == (5, 2)
    with pytest.raises(TypeError, match="list of converters"):
        ModelConvertPipeline(converters=dict(type="QAT2Quantize"))


def test_load_missing_int8_model_names_the_stage(tmp_path):
    from hat_ignite.errors import CheckpointError

    with pytest.raises(CheckpointError, match="int_infer"):
        load_quantized_model(tmp_path / "nope.pt2")
