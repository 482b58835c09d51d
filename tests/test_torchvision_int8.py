"""torchvision's own ResNet-18 and MobileNetV2 through calibration, QAT and int8, beside plain torchao.

torchvision's ``BasicBlock`` applies its one ``self.relu`` twice and MobileNetV2 mixes depthwise
convs, ReLU6 and functional pooling: the shapes of ``tests/projects/perception``, here as
torchvision writes them. Each net is trained briefly on the digits (32x32, three channels) until it
clearly has learnt them, then goes through the converters with each ``qat_mode``:
``Float2Calibration``, calibration under ``observing``, ``Calibration2QAT``, a few QAT steps,
``QAT2Quantize``. The int8 model must stay within one point of the float model on the held-out
split, and within one point of what plain torchao's own flow makes of the same trained model
(strict ``torch.export``, ``prepare_pt2e`` with the same quantizer, calibration on the same
batches, ``convert_pt2e``), which also inserts as many fake-quantize modules as ours: each call of
a shared layer observed on its own.
The int8 program saved as the ``int_infer`` stage saves it loads and gives the same outputs.

torchvision is not a dependency, and the wheel built for one torch does not load beside another
(``operator torchvision::nms does not exist``): without a torchvision that imports, the tests skip
(as in this project's CI, on the CPU torch it pins).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.nn import functional as F

try:
    import torchvision
except (ImportError, RuntimeError) as exc:  # RuntimeError: a wheel built for another torch
    pytest.skip("torchvision is not installed (it is optional)" if getattr(exc, "name", None) == "torchvision"
                else f"torchvision does not import beside torch {torch.__version__}: {exc}", allow_module_level=True)

from hat_ignite.data.digits_image import DigitsImageDataset
from hat_ignite.quantization import (
    Calibration2QAT, Float2Calibration, QAT2Quantize, default_quantizer, load_quantized_model, observing,
    save_quantized_model,
)

BATCH = 64
#: float training: steps of SGD with a one-cycle schedule peaking at lr (enough for > 90 % held out)
TRAINING = {"resnet18": (80, 0.1), "mobilenet_v2": (120, 0.1)}
CALIBRATION_BATCHES = 4
QAT_STEPS = 8
QAT_LR = 1e-4


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: on a small shared CPU, more threads ran these nets several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _digits(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    data = DigitsImageDataset(split, size=32)
    return data.images.expand(-1, 3, -1, -1).contiguous(), data.labels


@pytest.fixture(scope="module")
def digits():
    return {"train": _digits("train"), "val": _digits("val")}


def _draw(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(len(images), (BATCH,), generator=generator)


@torch.no_grad()
def _accuracy(model, data) -> float:
    images, labels = data
    return float((model(images).argmax(1) == labels).float().mean())


def _fake_quantizers(model) -> int:
    return sum(hasattr(m, "observer_enabled") for m in model.modules())


@pytest.fixture(scope="module", params=sorted(TRAINING))
def trained(request, digits):
    """``(name, float model trained on the digits, eval mode)``."""
    name = request.param
    steps, lr = TRAINING[name]
    images, labels = digits["train"]
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=4e-5)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps, pct_start=0.2)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        idx = _draw(images, generator)
        loss = F.cross_entropy(model(images[idx]), labels[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    return name, model.eval()


@pytest.fixture(scope="module")
def batches(digits):
    """The calibration batches (images) and the QAT batches (indices), the same for every flow."""
    images, _ = digits["train"]
    generator = torch.Generator().manual_seed(1)
    calibration = [images[_draw(images, generator)] for _ in range(CALIBRATION_BATCHES)]
    return calibration, [_draw(images, generator) for _ in range(QAT_STEPS)]


@pytest.fixture(scope="module")
def plain_torchao(trained, batches):
    """``(int8 model, fake-quantize modules inserted)`` from torchao's own post-training flow."""
    from torch.export import Dim
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    _, model = trained
    calibration, _ = batches
    program = torch.export.export(copy.deepcopy(model).eval(), (calibration[0],),
                                  dynamic_shapes=({0: Dim.AUTO},), strict=True)
    prepared = prepare_pt2e(program.module(), default_quantizer())  # folds BatchNorm into the convs
    with torch.no_grad():
        for x in calibration:
            prepared(x)
    return convert_pt2e(prepared), _fake_quantizers(prepared)


@pytest.mark.parametrize("qat_mode", ["fuse_bn", "with_bn"])
def test_torchvisions_net_in_int8_loses_at_most_a_point_to_float_and_to_plain_torchao(
    trained, digits, batches, plain_torchao, qat_mode, record_property, tmp_path,
):
    name, model = trained
    float_accuracy = _accuracy(model, digits["val"])
    assert float_accuracy > 0.9, f"{name} did not learn the digits: {float_accuracy:.4f}"
    calibration, qat_batches = batches
    images, labels = digits["train"]

    prepared = Float2Calibration(example_inputs=calibration[0], qat_mode=qat_mode)(copy.deepcopy(model))
    assert type(prepared).__name__ == "PreparedModule"  # the whole net, shared ReLUs included
    with observing(prepared):
        for x in calibration:
            prepared.eval()(x)
    prepared = Calibration2QAT()(prepared).train()
    torch.manual_seed(2)  # MobileNetV2's dropout draws the same masks whatever ran before
    optimizer = torch.optim.SGD(prepared.parameters(), lr=QAT_LR, momentum=0.9)
    for idx in qat_batches:
        loss = F.cross_entropy(prepared(images[idx]), labels[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    inserted = _fake_quantizers(prepared)
    int8 = QAT2Quantize()(prepared)
    int8_accuracy = _accuracy(int8, digits["val"])

    reference, reference_inserted = plain_torchao
    reference_accuracy = _accuracy(reference, digits["val"])
    figures = (f"{name} {qat_mode} torch {torch.__version__} torchvision {torchvision.__version__}: float "
               f"{float_accuracy:.4f}, int8 {int8_accuracy:.4f}, plain torchao int8 {reference_accuracy:.4f}")
    record_property("accuracies", figures)
    print(figures)
    # every call of a layer (BasicBlock's two ReLU calls) has its own observers, as in the strict flow
    assert inserted == reference_inserted, figures
    assert int8_accuracy >= float_accuracy - 0.01, figures
    assert int8_accuracy >= reference_accuracy - 0.01, figures
    # the int8 program as the int_infer stage writes it loads and answers as the model it came from
    program = load_quantized_model(save_quantized_model(int8, tmp_path / "int8.pt2", calibration[0]))
    val_images = digits["val"][0][:16]
    with torch.no_grad():
        assert torch.equal(program(val_images), int8(val_images))
