"""int8 graphs through inductor (freezing), and the fall-back to the graph as saved.

One real compile in this file (a small trained conv net); the fall-back test makes inductor fail
for real, in a fresh process whose ``CXX`` names no compiler and whose inductor cache is empty.
"""

from __future__ import annotations

import copy
import logging
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, time_limit
from hat_ignite.data import DigitsImageDataset
from hat_ignite.models import ResNetClassifier
from hat_ignite.quantization import (
    Float2Calibration,
    QAT2Quantize,
    load_quantized_model,
    observing,
    save_quantized_model,
)
from hat_ignite.quantization.inductor import ENV_VAR, inductor_enabled

LOGGER = "hat_ignite.quantization.inductor"


@pytest.fixture(scope="module")
def calibrated():
    """A small ResNet (4 convs) trained for an epoch on the digits (8x8 images), calibrated; and val images."""
    torch.manual_seed(0)
    train = DigitsImageDataset("train", size=8)
    val = DigitsImageDataset("val", size=8)
    model = ResNetClassifier(stem_channels=8, widths=(16,), blocks=1)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()
    for i in range(0, len(train), 32):
        losses, _ = model({"img": train.images[i:i + 32], "labels": train.labels[i:i + 32]})
        opt.zero_grad()
        losses["cls_loss"].backward()
        opt.step()
    model = Float2Calibration(example_inputs=val.images[:4], modules=["net"])(model.eval())
    with observing(model), torch.no_grad():
        for i in range(0, 256, 64):
            model(train.images[i:i + 64])
    return model, val


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return (logits.argmax(1) == labels).float().mean().item()


def test_the_int8_model_runs_through_inductor_like_the_graph_as_converted(calibrated, caplog, tmp_path):
    model, val = calibrated
    int8 = QAT2Quantize(inductor=True)(copy.deepcopy(model))
    runner = int8.net.inductor
    assert runner.state == "pending"  # compiled lazily, at the first call
    x, labels = val.images, val.labels
    with torch.no_grad():
        as_converted = int8.net.graph(x)
    assert accuracy(as_converted, labels) > 0.75  # a model that learnt the digits (chance: 0.1)

    with caplog.at_level(logging.INFO, logger=LOGGER), torch.no_grad():
        first = int8(x[:64])
        other = int8(x[64:101])  # another batch size: the batch dimension is dynamic
    assert runner.state == "compiled" and runner.compile_seconds > 0
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 4  # each batch size compiles once (static shapes), with a start and a done line
    for start, done, shape in zip(lines[::2], lines[1::2], ("64x1x8x8", "37x1x8x8")):
        assert start.startswith(f"compiling the int8 module 'net' with inductor for inputs of shape {shape} ")
        assert done.startswith("compiled the int8 module 'net' in ") and done.endswith(" s")
    with caplog.at_level(logging.INFO, logger=LOGGER), torch.no_grad():
        again = int8(x[:64])
    assert len([r for r in caplog.records if r.name == LOGGER]) == 4 and torch.equal(again, first)
    # oneDNN's int8 kernels round where the reference ops round, give or take one step
    for out, ref in ((first, as_converted[:64]), (other, as_converted[64:101])):
        assert (out.argmax(1) == ref.argmax(1)).float().mean() >= 0.98
        assert (out - ref).abs().max() <= 0.1 * ref.abs().max()

    # an input the graph refuses: the graph's own error, and the compiled code stays
    with pytest.raises(AssertionError, match=r"Guard failed: input.size\(\)\[1\] == 1"), torch.no_grad():
        int8(x[:4].expand(4, 3, 8, 8))
    assert runner.state == "compiled"
    # a gradient wanted, or training: the graph as converted, not compiled code
    wanted = x[:5].clone().requires_grad_()
    out = int8(wanted)
    assert out.requires_grad and torch.equal(out.detach(), as_converted[:5])
    # exported after compiling: the program is the graph as converted
    path = save_quantized_model(int8, tmp_path / "int8.pt2", {"img": x[:8]})
    saved = load_quantized_model(path, inductor=False)
    assert saved.inductor.state == "off"
    with torch.no_grad():
        assert torch.equal(saved({"img": x}), as_converted)
    # copies compile their own graph; new weights (frozen into the code) compile again
    assert copy.deepcopy(int8).net.inductor.state == "pending"
    int8.net.load_state_dict(int8.net.state_dict())
    assert runner.state == "pending"


def test_off_by_keyword_or_environment(calibrated, monkeypatch):
    model, val = calibrated
    monkeypatch.setenv(ENV_VAR, "0")
    assert not inductor_enabled() and inductor_enabled(True)
    assert QAT2Quantize()(copy.deepcopy(model)).net.inductor.state == "off"
    monkeypatch.setenv(ENV_VAR, "1")
    assert inductor_enabled() and not inductor_enabled(False)
    int8 = QAT2Quantize(inductor=False)(copy.deepcopy(model))
    with torch.no_grad():
        assert torch.equal(int8(val.images[:9]), int8.net.graph(val.images[:9]))
    assert int8.net.inductor.state == "off"


def test_without_a_compiler_the_program_runs_as_saved_after_one_log_line(calibrated, tmp_path):
    model, val = calibrated
    int8 = QAT2Quantize(inductor=False)(copy.deepcopy(model))
    path = save_quantized_model(int8, tmp_path / "int8.pt2", {"img": val.images[:8]})
    torch.save({"x": val.images}, tmp_path / "x.pt")
    code = (
        "import logging, torch\n"
        "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s')\n"
        "from hat_ignite.quantization import load_quantized_model\n"
        f"x = torch.load({str(tmp_path / 'x.pt')!r})['x']\n"
        f"model = load_quantized_model({path!r})\n"
        "with torch.no_grad():\n"
        "    batches = [{'img': x[:64]}, {'img': x[64:100]}, {'img': x}]\n"
        "    outs = [model(b) for b in batches]\n"
        "    refs = [model.program(b) for b in batches]\n"
        "assert all(torch.equal(o, r) for o, r in zip(outs, refs))\n"
        "print('state', model.inductor.state)\n"
    )
    env = dict(os.environ, CXX=str(tmp_path / "no-such-c++"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"))
    env[ENV_VAR] = "1"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=time_limit(300), cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("state fallback")
    ours = [ln for ln in out.stderr.splitlines() if LOGGER in ln]
    assert len(ours) == 2, out.stderr[-3000:]  # the start line and one line saying why
    assert ours[0].startswith(f"INFO {LOGGER}: compiling the int8 model {path} with inductor")
    assert ours[1].startswith(f"WARNING {LOGGER}: the int8 model {path} runs as saved")
    assert "InvalidCxxCompiler" in ours[1] and "no-such-c++" in ours[1] and f"{ENV_VAR}=0" in ours[1]
