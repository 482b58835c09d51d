"""Two-process (gloo) runs for test_host_reads.py: host reads per step, and a NaN on rank 1 only.

Run as ``python tests/host_reads_dist.py {count|nan} OUT_DIR [OPTIMIZER]`` (a name of
:data:`OPTIMIZERS`, default ``"fused SGD"``); each rank writes its results to ``OUT_DIR/<mode>_rank<r>.pt``.
"""

from __future__ import annotations

import os
import sys

import torch

STEPS, NAN_STEP = 40, 5

OPTIMIZERS = {
    "fused SGD": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, fused=True),
    "SGD momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "AdamW": lambda params: torch.optim.AdamW(params, lr=0.01),
}


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
               os.path.join(out_dir, f"count_rank{idist.get_rank()}.pt"))


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
               os.path.join(out_dir, f"nan_rank{idist.get_rank()}.pt"))


if __name__ == "__main__":
    from hat_ignite.engine.launcher import launch_distributed

    main = {"count": count_main, "nan": nan_main}[sys.argv[1]]
    optimizer = sys.argv[3] if len(sys.argv) > 3 else "fused SGD"
    launch_distributed(main, num_processes=2, timeout=60, args=(sys.argv[2], optimizer))
