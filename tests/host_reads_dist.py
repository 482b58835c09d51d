"""Two-process (gloo) runs for test_host_reads.py and test_nonfinite_device.py: host reads per step,
and a NaN on rank 1 only.

Run as ``python tests/host_reads_dist.py {count|nan} OUT_DIR [OPTIMIZER,...]`` (names of
:data:`OPTIMIZERS`, default ``"fused SGD"``): one job, whose ranks run the mode once per optimizer,
in turn; each rank writes its results to ``OUT_DIR/``:func:`result_file`.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import torch

STEPS, NAN_STEP = 40, 5

OPTIMIZERS = {
    "fused SGD": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, fused=True),
    "SGD momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "AdamW": lambda params: torch.optim.AdamW(params, lr=0.01),
}


def result_file(mode: str, optimizer: str, rank: int) -> str:
    """The file a rank writes one run's results to, in OUT_DIR."""
    return f"{mode}_{optimizer.replace(' ', '_')}_rank{rank}.pt"


def run_job(mode: str, out_dir: pathlib.Path, optimizers: list[str], timeout: float) -> pathlib.Path:
    """Run this script's ``mode`` in a new 2-process job, once per optimizer in turn, into ``out_dir``
    (``timeout``: see ``conftest.time_limit``); return ``out_dir`` once the job has ended well."""
    from conftest import time_limit

    proc = subprocess.run([sys.executable, __file__, mode, str(out_dir), ",".join(optimizers)],
                          cwd=out_dir, capture_output=True, text=True, timeout=time_limit(timeout))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out_dir


def _trainer(model: torch.nn.Module, num_steps: int, callbacks: list, optimizer: str) -> object:
    from torch.utils.data import DataLoader, Subset

    from hat_ignite.data.digits import DigitsDataset
    from hat_ignite.engine import BasicBatchProcessor, DistributedDataParallelTrainer, collect_loss_by_index

    return DistributedDataParallelTrainer(
        model=model, data_loader=DataLoader(Subset(DigitsDataset("train"), range(1024)), batch_size=8),
        optimizer=OPTIMIZERS[optimizer](model.parameters()), device=None,
        batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
        stop_by="step", num_steps=num_steps, callbacks=callbacks, find_unused_parameters=False,
    )


def count_main(device, out_dir: str, optimizer: str) -> None:
    import ignite.distributed as idist
    from host_reads import HostReads

    from hat_ignite.models.mlp import MLPClassifier

    torch.manual_seed(0)
    trainer = _trainer(MLPClassifier(in_features=64, hidden_features=16, num_classes=10), STEPS, [], optimizer)
    reads = HostReads().attach(trainer)
    with reads:
        trainer.fit()
    torch.save({"reads": reads.reads(range(6, 36)), "per_step": [reads.per_step[i] for i in range(6, 36)],
                "iteration": trainer.state.iteration},
               os.path.join(out_dir, result_file("count", optimizer, idist.get_rank())))


def nan_main(device, out_dir: str, optimizer: str) -> None:
    import ignite.distributed as idist
    from dist_helpers import NanLossMLP

    from hat_ignite.callbacks import CallbackMixin
    from hat_ignite.errors import NonFiniteLossError

    snapshots: list = []

    class Snapshots(CallbackMixin):
        def on_step_end(self, model, **kwargs):
            snapshots.append([p.detach().clone() for p in model.parameters()])

    torch.manual_seed(0)
    trainer = _trainer(NanLossMLP(nan_rank=1, nan_step=NAN_STEP, in_features=64, hidden_features=16, num_classes=10),
                       STEPS, [Snapshots()], optimizer)
    error = ""
    try:
        trainer.fit()
    except NonFiniteLossError as exc:
        error = str(exc)
    torch.save({"error": error, "iteration": trainer.state.iteration, "snapshots": snapshots,
                "final": [p.detach().clone() for p in trainer.model.parameters()]},
               os.path.join(out_dir, result_file("nan", optimizer, idist.get_rank())))


def each_optimizer(device, mode: str, out_dir: str, optimizers: str) -> None:
    """Run ``mode`` (count or nan) once for each of the comma-separated ``optimizers``, in turn."""
    main = {"count": count_main, "nan": nan_main}[mode]
    for optimizer in optimizers.split(","):
        main(device, out_dir, optimizer)


if __name__ == "__main__":
    from hat_ignite.engine.launcher import launch_distributed

    launch_distributed(each_optimizer, num_processes=2, timeout=60,
                       args=(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "fused SGD"))
