"""Calibration in one process and in two gloo processes on the same batches (importable as ``calibration_ranks``).

``python tests/calibration_ranks.py OUT_DIR`` calibrates a small conv net with each of HAT's
activation observers (and the ``mse`` weight observer) on eight generated batches with outliers:
first in this process on all of them (``OUT_DIR/one.pt``), then in two processes, rank ``r``
on batches ``r, r + 2, ...`` (``OUT_DIR/rank{r}.pt``). Each file maps the observer to the
calibrated model's ranges, scales and zero points. One intra-op thread everywhere, so the
activations of a batch are computed the same way in every process.
"""

from __future__ import annotations

import copy
import os
import sys

import torch
from torch import nn

OBSERVERS = ("min_max", "percentile", "mse", "kl", "mix", "weight_mse")


def batches() -> list[torch.Tensor]:
    """Eight batches of 1x8x8 images: Gaussian, with a few large outliers in two of them."""
    g = torch.Generator().manual_seed(3)
    out = [torch.randn(16, 1, 8, 8, generator=g) for _ in range(8)]
    out[2][3, 0, 4, 4] = 25.0
    out[5][0, 0, 1, 2] = -17.0
    return out


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(128, 10))


def calibrate_each(data: list[torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """For each observer: the ranges, scales and zero points after a Calibrator run over ``data``.

    The model is prepared once; each Calibrator gets a copy, its observers set by a
    ``ModelConvertPipeline``'s ``qconfig_params``.
    """
    from hat_ignite.engine import BasicBatchProcessor
    from hat_ignite.engine.calibrator import Calibrator
    from hat_ignite.quantization import Float2Calibration, ModelConvertPipeline

    prepared = Float2Calibration(example_inputs=batches()[0])(model())
    out = {}
    for observer in OBSERVERS:
        qconfig = (dict(activation_calibration_observer="min_max", weight_calibration_observer="mse")
                   if observer == "weight_mse" else dict(activation_calibration_observer=observer))
        calibrator = Calibrator(
            model=copy.deepcopy(prepared), data_loader=data, batch_processor=BasicBatchProcessor(need_grad_update=False),
            model_convert_pipeline=ModelConvertPipeline(converters=[], qconfig_params=qconfig),
        )
        calibrator.fit()
        out[observer] = {k: v.clone() for k, v in calibrator.model.state_dict().items()
                         if k.endswith(("min_val", "max_val", "scale", "zero_point"))}
    return out


def rank_main(device, out_dir: str) -> None:
    import ignite.distributed as idist

    torch.set_num_threads(1)
    rank = idist.get_rank()
    torch.save(calibrate_each(batches()[rank::idist.get_world_size()]), os.path.join(out_dir, f"rank{rank}.pt"))


if __name__ == "__main__":
    from hat_ignite.engine.launcher import launch_distributed

    torch.set_num_threads(1)
    torch.save(calibrate_each(batches()), os.path.join(sys.argv[1], "one.pt"))
    launch_distributed(rank_main, num_processes=2, timeout=60, args=(sys.argv[1],))
