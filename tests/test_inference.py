"""``hat.engine.Inference``: HAT's single-input runner, used as HAT's ``test_inference`` uses it (on the CPU,
with a model of our own instead of HAT's model zoo), then with a pipeline and pre/post processors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hat_ignite.callbacks.checkpoint_io import atomic_save, with_content_hash
from hat_ignite.registry import build_from_cfg


class Classifier(nn.Module):
    """A small conv classifier taking HAT's ``{"img": ...}`` batch, returning logits (``losses=None``)."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(4, num_classes)

    def forward(self, data):
        return self.head(self.backbone(data["img"]).flatten(1))


def test_inference_as_hats_test_inference(hat_alias):
    import hat
    from hat.engine.inference import Inference

    from hat_ignite.engine import Inference as ours

    assert hat.engine.Inference is Inference is ours
    torch.manual_seed(0)
    model = Classifier()
    runner = hat.engine.Inference(None, model, "bayes")  # HAT's test: device 0 (a GPU), march BAYES
    data = {"img": torch.randn(1, 3, 32, 32)}
    out = runner.forward(data)
    with torch.no_grad():
        expected = model.eval()(data)
    assert torch.equal(out, expected) and out.shape == (1, 10) and not out.requires_grad
    assert runner.model is model and not model.training  # eval mode: BatchNorm uses its running statistics
    assert runner.device == torch.device("cpu") and runner.march == "bayes"


def test_inference_converts_once_and_runs_the_processors_in_order(tmp_path, hat_alias):
    torch.manual_seed(0)
    trained = Classifier(num_classes=3)
    path = atomic_save(with_content_hash({"state_dict": trained.state_dict()}), str(tmp_path / "float.pth.tar"))
    seen = []

    def scale(data):
        seen.append("pre")
        return dict(data, img=data["img"] * 0.5)

    def to_probs(pred, data):
        seen.append("post")
        return pred.softmax(1), data

    runner = build_from_cfg({  # as a config gives it
        "type": "Inference", "device": [], "model": Classifier(num_classes=3),
        "model_convert_pipeline": {"type": "ModelConvertPipeline",
                                   "converters": [{"type": "LoadCheckpoint", "checkpoint_path": path}]},
        "pre_processors": [scale], "post_processors": [to_probs, lambda pred, data: (pred.argmax(1), data)],
    })
    data = {"img": torch.randn(4, 3, 16, 16)}
    with torch.no_grad():
        expected = trained.eval()({"img": data["img"] * 0.5}).softmax(1).argmax(1)
    assert torch.equal(runner.forward(data), expected)
    assert seen == ["pre", "post"]
    assert torch.equal(runner.model.head.weight, trained.head.weight)  # the pipeline loaded the weights

    with pytest.raises(ValueError, match=r"Inference runs on one device, got device=\[0, 1\]"):
        build_from_cfg({"type": "Inference", "device": [0, 1], "model": Classifier()})
    bad = build_from_cfg({"type": "Inference", "device": None, "model": Classifier(),
                          "post_processors": [lambda pred, data: pred]})
    with pytest.raises(TypeError, match=r"post_processors\[0\] \(<lambda>\) must return the pair \(pred, data\)"):
        bad.forward(data)
