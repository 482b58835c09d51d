"""A model holding a prepared (PT2E) submodule moves and casts like any module.

``PreparedModule`` once named its private mode switch ``_apply``, shadowing ``nn.Module._apply``,
which ``.to()``, ``.cpu()``, ``.cuda()`` and ``.float()`` call on every submodule: any of them on
a calibration or QAT model raised ``TypeError`` (the trainer calls ``model.to(device)`` on GPUs).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hat_ignite.quantization import Float2Calibration, Float2QAT, prepared_modules


@pytest.mark.parametrize("convert", [Float2Calibration, Float2QAT])
def test_to_and_casts_reach_the_prepared_graph(convert):
    torch.manual_seed(0)
    x = torch.rand(5, 4)
    model = convert(example_inputs=torch.rand(3, 4))(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
    (prepared,) = prepared_modules(model)
    model.eval()
    before = model(x)
    assert model.to("cpu") is model and model.to(torch.device("cpu")) is model
    assert model.cpu() is model and model.float() is model
    after = model(x)
    assert prepared.stage in ("calibration", "qat") and after.shape == (5, 3)
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    if torch.cuda.is_available():  # the move the trainer makes with device=0
        model.to("cuda:0")
        assert all(p.is_cuda for p in model.parameters())
