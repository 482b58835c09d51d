"""Pieces the distributed tests load into their worker processes (importable as ``dist_helpers``).

* ``DumpParams``: a callback writing each rank's final parameters and buffers to
  ``params_rank{r}.pt`` (and the initial ones to ``initial_rank{r}.pt``);
* ``ProcessIds``: a callback writing the id of each rank's process and of its parent, the world
  size and the model's class to ``process_rank{r}.json``;
* ``FailingMLP``: the digits MLP, raising on one rank at one training step;
* ``NanLossMLP``: the digits MLP, whose loss is NaN on one rank at one training step;
* ``python tests/dist_helpers.py allreduce OUT_DIR``: trains DDP models in two gloo processes
  with a comm hook counting all-reduces, for ``delay_sync`` and gradient accumulation on and off,
  and writes the counts and final parameters to ``OUT_DIR/allreduce.pt``;
* ``python tests/dist_helpers.py release OUT_DIR``: trains a DDP model in two gloo processes with
  the automatic garbage collector off and the trainer in a reference cycle, and writes at each
  process's exit whether the model was still alive (``OUT_DIR/release_rank{r}.txt``).
"""

from __future__ import annotations

import json
import os
import sys

import torch

from hat_ignite.callbacks.base import CallbackMixin
from hat_ignite.models.mlp import MLPClassifier


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


class DumpParams(CallbackMixin):
    """Save this rank's parameters and buffers at loop end to ``out_dir/params_rank{rank}.pt``
    (and, with ``initial=True``, at loop begin to ``out_dir/initial_rank{rank}.pt``)."""

    def __init__(self, out_dir: str, initial: bool = False) -> None:
        self.out_dir, self.initial = out_dir, initial

    def _save(self, model, name: str) -> None:
        import ignite.distributed as idist

        os.makedirs(self.out_dir, exist_ok=True)
        state = {k: v.detach().clone() for k, v in _unwrap(model).state_dict().items()}
        torch.save(state, os.path.join(self.out_dir, f"{name}_rank{idist.get_rank()}.pt"))

    def on_loop_begin(self, model, **kwargs) -> None:
        if self.initial:
            self._save(model, "initial")

    def on_loop_end(self, model, **kwargs) -> None:
        self._save(model, "params")


class ProcessIds(CallbackMixin):
    """Write ``{"pid", "ppid", "world_size", "model"}`` of the process that trains, at loop begin,
    to ``out_dir/process_rank{rank}.json``."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir

    def on_loop_begin(self, model, **kwargs) -> None:
        import ignite.distributed as idist

        os.makedirs(self.out_dir, exist_ok=True)
        with open(os.path.join(self.out_dir, f"process_rank{idist.get_rank()}.json"), "w") as f:
            json.dump({"pid": os.getpid(), "ppid": os.getppid(), "world_size": idist.get_world_size(),
                       "model": type(model).__name__}, f)


class _OneBadStepMLP(MLPClassifier):
    """An MLPClassifier that misbehaves at training forward number ``step`` on rank ``rank``."""

    def __init__(self, rank: int, step: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.bad_rank, self.bad_step, self.calls = rank, step, 0

    def _bad_now(self) -> bool:
        """Whether this training forward is the bad one (counts the training forwards)."""
        import ignite.distributed as idist

        if not self.training:
            return False
        self.calls += 1
        return idist.get_rank() == self.bad_rank and self.calls - 1 == self.bad_step


class FailingMLP(_OneBadStepMLP):
    """An MLPClassifier that raises at training forward number ``fail_step`` on rank ``fail_rank``."""

    def __init__(self, fail_rank: int = 1, fail_step: int = 2, **kwargs) -> None:
        super().__init__(fail_rank, fail_step, **kwargs)

    def forward(self, data, labels=None):
        if self._bad_now():
            raise RuntimeError(f"injected failure on rank {self.bad_rank} at step {self.bad_step}")
        return super().forward(data, labels)


class NanLossMLP(_OneBadStepMLP):
    """An MLPClassifier whose training loss is NaN at forward number ``nan_step`` on rank ``nan_rank``."""

    def __init__(self, nan_rank: int = 1, nan_step: int = 2, **kwargs) -> None:
        super().__init__(nan_rank, nan_step, **kwargs)

    def forward(self, data, labels=None):
        bad = self._bad_now()
        out = super().forward(data, labels)
        if bad:
            losses, logits = out
            out = {"cls_loss": losses["cls_loss"] * float("nan")}, logits
        return out


def _train_counting(delay_sync: bool, accumulation: int, num_batches: int) -> tuple[int, dict]:
    """Train a DDP digits MLP for 4 steps of ``num_batches`` sub-batches; count the all-reduces."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.utils.data import DataLoader, Subset

    from hat_ignite.data.digits import DigitsDataset
    from hat_ignite.engine import DistributedDataParallelTrainer, MultiBatchProcessor, collect_loss_by_index

    torch.manual_seed(0)
    dataset = Subset(DigitsDataset("train"), range(256))
    loader = DataLoader(dataset, batch_size=8, shuffle=False)

    class Split:
        """Each loader batch as a tuple of ``num_batches`` sub-batches (one step, many batches)."""

        def __init__(self, inner):
            self.inner, self.sampler = inner, inner.sampler

        def __len__(self):
            return len(self.inner) // num_batches

        def __iter__(self):
            it = iter(self.inner)
            for _ in range(len(self)):
                yield tuple(next(it) for _ in range(num_batches))

    model = MLPClassifier(in_features=64, hidden_features=16, num_classes=10)
    trainer = DistributedDataParallelTrainer(
        model=model, data_loader=loader, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), device=None,
        batch_processor=MultiBatchProcessor(
            need_grad_update=True, delay_sync=delay_sync, grad_accumulation_step=accumulation,
            loss_collector=collect_loss_by_index(0),
        ),
        stop_by="step", num_steps=4, find_unused_parameters=False,
    )
    trainer.data_loader = Split(trainer.data_loader)  # the DistributedSampler stays inside
    count = [0]

    def counting_hook(state, bucket):
        count[0] += 1
        return allreduce_hook(state, bucket)

    trainer.model.register_comm_hook(None, counting_hook)
    trainer.fit()
    return count[0], {k: v.detach().clone() for k, v in _unwrap(trainer.model).state_dict().items()}


def allreduce_main(device, out_dir: str) -> None:
    import ignite.distributed as idist

    results = {}
    for name, delay_sync, accumulation in (("sync", False, 1), ("delay", True, 1), ("accum", True, 2)):
        results[name] = _train_counting(delay_sync, accumulation, num_batches=3)
    if idist.get_rank() == 0:
        torch.save(results, os.path.join(out_dir, "allreduce.pt"))


def release_main(device, out_dir: str) -> None:
    """Train 2 steps, leave the trainer in a cycle, report at exit whether its DDP model lived on."""
    import atexit
    import gc
    import weakref

    import ignite.distributed as idist
    from torch.utils.data import DataLoader, Subset

    from hat_ignite.data.digits import DigitsDataset
    from hat_ignite.engine import BasicBatchProcessor, DistributedDataParallelTrainer, collect_loss_by_index

    gc.disable()  # only an explicit collection frees a cycle now
    model = MLPClassifier(in_features=64, hidden_features=16, num_classes=10)
    trainer = DistributedDataParallelTrainer(
        model=model, data_loader=DataLoader(Subset(DigitsDataset("train"), range(64)), batch_size=8),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1), device=None,
        batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
        stop_by="step", num_steps=2,
    )
    trainer.fit()
    trainer.itself = trainer  # a reference cycle, whatever the engine's own references are
    ddp_model = weakref.ref(trainer.model)
    path = os.path.join(out_dir, f"release_rank{idist.get_rank()}.txt")

    def report() -> None:
        with open(path, "w") as f:
            f.write("alive" if ddp_model() is not None else "freed")

    atexit.register(report)


def whoami_main(device, out_dir: str) -> None:
    """Each rank writes its device, rank, world size and rendezvous port."""
    import ignite.distributed as idist

    with open(os.path.join(out_dir, f"whoami{idist.get_rank()}.json"), "w") as f:
        json.dump({"device": device, "rank": idist.get_rank(), "world_size": idist.get_world_size(),
                   "backend": idist.backend(), "port": os.environ.get("MASTER_PORT")}, f)


if __name__ == "__main__":
    from hat_ignite.engine.launcher import build_launcher, launch_distributed

    if sys.argv[1] == "hat_positional":
        # HAT's launch signature, every argument by position: main_func, device_ids, dist_url,
        # dist_launcher, num_processes, backend, args.
        launch = build_launcher({"type": "distributed_data_parallel_trainer"})
        launch(whoami_main, None, f"tcp://127.0.0.1:{sys.argv[3]}", None, 2, "GLOO", (sys.argv[2],))
        sys.exit(0)

    if sys.argv[1] == "allreduce":
        launch_distributed(allreduce_main, num_processes=2, timeout=60, args=(sys.argv[2],))
    elif sys.argv[1] == "release":
        launch_distributed(release_main, num_processes=2, timeout=60, args=(sys.argv[2],))
