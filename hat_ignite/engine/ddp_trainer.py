"""`DistributedDataParallelTrainer` and `DataParallelTrainer`: a `Trainer` with a wrapped model.

They differ from :class:`~hat_ignite.engine.trainer.Trainer` only in where the model runs and how
it is wrapped; the loop, the batch processors and the callbacks are the same. Start the
processes of a DDP run with :func:`hat_ignite.engine.launcher.build_launcher` (``hat-train
--nproc`` / ``--device-ids`` / ``--nnodes``) or ``torchrun``: the trainer itself spawns nothing and
expects the ``torch.distributed`` process group to exist.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hat_ignite.engine.dist_data import distributed_loader, shared_seed
from hat_ignite.engine.loop import build_if_config
from hat_ignite.engine.sync_batch_norm import CpuSyncBatchNorm, convert_sync_batchnorm
from hat_ignite.engine.trainer import Trainer

__all__ = ["DistributedDataParallelTrainer", "DataParallelTrainer"]

logger = logging.getLogger(__name__)


def _host_group() -> Any:
    """The process group of this node's ranks (every rank creates every node's group, in order)."""
    import ignite.distributed as idist

    nproc, nnodes, node = idist.get_nproc_per_node(), idist.get_nnodes(), idist.get_node_rank()
    mine = None
    for host in range(nnodes):
        group = torch.distributed.new_group(list(range(host * nproc, (host + 1) * nproc)))
        if host == node:
            mine = group
    return mine


@contextlib.contextmanager
def _no_sync_all(wrappers: Sequence[DistributedDataParallel]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for wrapper in wrappers:
            stack.enter_context(wrapper.no_sync())
        yield


class DistributedDataParallelTrainer(Trainer):
    """A :class:`Trainer` whose model is wrapped in ``DistributedDataParallel``, one per process.

    Each process trains on its shard of the data: a training loader without a distributed
    sampler gets a ``DistributedSampler`` (shuffling when the loader shuffled, with a seed shared
    by all ranks), keeping its per-process batch size, and the loop calls ``set_epoch`` at each
    epoch begin. Gradients are averaged over the processes in the backward; ``MultiBatchProcessor
    (delay_sync=True)`` and gradient accumulation skip that all-reduce (``no_sync``) on every
    backward but the last of an update.

    Args:
        model: model or model config (built, converted by ``model_convert_pipeline``, moved to
            ``device``, then wrapped).
        data_loader: training data loader or its config.
        optimizer: optimizer or optimizer config (built on the unwrapped model's parameters).
        batch_processor: batch processor or its config.
        device: this process's GPU id (an int), or ``None`` to train on the CPU (gloo).
        stop_by: see :class:`~hat_ignite.engine.loop.LoopBase`.
        num_epochs: see :class:`~hat_ignite.engine.loop.LoopBase`.
        start_epoch: see :class:`~hat_ignite.engine.loop.LoopBase`.
        num_steps: see :class:`~hat_ignite.engine.loop.LoopBase`.
        start_step: see :class:`~hat_ignite.engine.loop.LoopBase`.
        callbacks: see :class:`~hat_ignite.engine.loop.LoopBase`. Checkpoint writing, metric
            logging and the progress bar happen on rank 0 only; a checkpoint is loaded by every
            rank.
        sync_bn: convert ``BatchNorm`` layers to ``SyncBatchNorm``: in training each layer
            normalises with the mean and variance of the batches of all ranks, and its running
            statistics follow them. On GPUs torch's ``SyncBatchNorm``; on the CPU (gloo)
            :class:`~hat_ignite.engine.sync_batch_norm.CpuSyncBatchNorm`, the same computation
            with ``all_reduce``. Either blocks at each layer until every rank has sent its
            statistics. The checkpoint keys stay ``BatchNorm``'s.
        sync_bn_by_host: with ``sync_bn``, synchronise the statistics only among the ranks of
            the same node.
        train_metrics: see :class:`~hat_ignite.engine.loop.LoopBase`.
        val_metrics: see :class:`~hat_ignite.engine.loop.LoopBase`.
        profiler: see :class:`~hat_ignite.engine.loop.LoopBase`.
        task_sampler: a :class:`~hat_ignite.engine.task_sampler.TaskSampler` (or config) for
            multitask training; handed to the ``MultitaskLoader`` data loader, which then chooses
            each step's tasks with it. Every rank draws the same tasks (the sampler is seeded).
        convert_submodule_list: names (``"backbone"``, ``"head.cls"``) of the submodules to wrap
            in DDP each on its own (one name may be given bare, ``"backbone"``, as HAT allows),
            instead of the whole model; the model then gets a ``no_sync()`` covering all of them.
            After quantization preparation the names are the same; a name lying inside a graph
            that was exported whole (no submodule of that name is left) wraps that prepared graph
            instead.
        find_unused_parameters: passed to ``DistributedDataParallel``; keep ``True`` when a step
            may leave parameters unused (a multitask step without some task).
        assign_module_buffers: HAT's switch to re-read the module's buffers before DDP
            broadcasts them. The DDP of torch >= 1.11 always does (the behaviour ``True`` asked
            for), so both values train identically.
        **kwargs: other :class:`~hat_ignite.engine.loop.LoopBase` arguments
            (``model_convert_pipeline``, ``resume_optimizer``, ``resume_dataloader``,
            ``log_interval``, ``compiler`` ...). ``compiler`` compiles the model's forward before
            the ``DistributedDataParallel`` wrapping (HAT compiles the wrapper; the gradients and
            their all-reduce are the same).

    Raises:
        RuntimeError: no ``torch.distributed`` process group is initialised.
    """

    def __init__(
        self,
        model: nn.Module | dict,
        data_loader: Any,
        optimizer: Any,
        batch_processor: Any,
        device: int | None,
        stop_by: str | None = "epoch",
        num_epochs: int | None = None,
        start_epoch: int | None = 0,
        num_steps: int | None = None,
        start_step: int | None = 0,
        callbacks: Sequence[Any] | None = None,
        sync_bn: bool | None = False,
        sync_bn_by_host: bool | None = False,
        train_metrics: Any = None,
        val_metrics: Any = None,
        profiler: Any = None,
        task_sampler: Any = None,
        convert_submodule_list: list[str] | str | None = None,
        find_unused_parameters: bool | None = True,
        assign_module_buffers: bool | None = True,
        **kwargs: Any,
    ) -> None:
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "DistributedDataParallelTrainer needs a torch.distributed process group, and none is "
                "initialised in this process. Start training with `hat-train CONFIG --nproc N` (CPU), "
                "`--device-ids 0,1` (GPUs), under torchrun, or through "
                "hat_ignite.engine.launcher.build_launcher; use Trainer for a single process."
            )
        if device is not None and (isinstance(device, bool) or not isinstance(device, int)):
            raise TypeError(
                f"DistributedDataParallelTrainer: device must be this process's GPU id (an int) or None "
                f"for the CPU, got {device!r}; the launcher sets it per process."
            )
        rank, world = dist.get_rank(), dist.get_world_size()
        data_loader = build_if_config(data_loader, "data_loader")
        task_sampler = build_if_config(task_sampler, "task_sampler")
        if task_sampler is not None:
            if not hasattr(data_loader, "task_sampler"):
                raise ValueError(
                    f"DistributedDataParallelTrainer(task_sampler=...) chooses the tasks of a multitask "
                    f"data loader, but data_loader is a {type(data_loader).__name__}. Use a "
                    f"MultitaskLoader with one loader per task."
                )
            data_loader.task_sampler = task_sampler
        data_loader = distributed_loader(data_loader, num_replicas=world, rank=rank, seed=shared_seed())
        super().__init__(
            model=model, data_loader=data_loader, optimizer=optimizer, batch_processor=batch_processor,
            device=device, stop_by=stop_by, num_epochs=num_epochs, start_epoch=start_epoch,
            num_steps=num_steps, start_step=start_step, callbacks=callbacks, train_metrics=train_metrics,
            val_metrics=val_metrics, profiler=profiler, **kwargs,
        )
        self.task_sampler = task_sampler if task_sampler is not None else getattr(data_loader, "task_sampler", None)
        self.sync_bn = bool(sync_bn)
        self.sync_bn_by_host = bool(sync_bn_by_host)
        self.find_unused_parameters = bool(find_unused_parameters)
        if self.find_unused_parameters and rank == 0:
            logger.info(
                "DistributedDataParallel runs with find_unused_parameters=True (HAT's default: a step may "
                "leave parameters without gradients, as a multitask step without some task or a frozen "
                "module does). torch warns once per process when a step used every parameter; a model that "
                "uses all of its parameters in every step trains faster with find_unused_parameters=False "
                "(e.g. --opts float_trainer.find_unused_parameters=False)."
            )
        self.assign_module_buffers = bool(assign_module_buffers)
        names = [convert_submodule_list] if isinstance(convert_submodule_list, str) else convert_submodule_list
        self.convert_submodule_list = list(names or [])
        self.model = self._wrap(self.model)

    def _wrap(self, model: nn.Module) -> nn.Module:
        if self.sync_bn:
            model = self._convert_sync_bn(model)
        ids = [self.device] if self.device is not None else None
        wrap: Callable[[nn.Module], DistributedDataParallel] = lambda m: DistributedDataParallel(  # noqa: E731
            m, device_ids=ids, output_device=self.device, find_unused_parameters=self.find_unused_parameters,
        )
        if not self.convert_submodule_list:
            return wrap(model)
        targets: list[str] = []
        for name in self.convert_submodule_list:
            target = _submodule_to_wrap(model, name)
            if target not in targets:
                targets.append(target)
        if "" in targets:  # a name inside a model exported whole: the whole model is one graph
            return wrap(model)
        targets = [t for t in targets if not any(t.startswith(f"{o}.") for o in targets)]  # outermost only
        wrappers = []
        for name in targets:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            wrapper = wrap(parent.get_submodule(child))
            setattr(parent, child, wrapper)
            wrappers.append(wrapper)
        model.no_sync = lambda: _no_sync_all(wrappers)  # type: ignore[assignment]
        return model

    def _convert_sync_bn(self, model: nn.Module) -> nn.Module:
        """``model`` with its BatchNorm layers synchronised over all ranks (or this node's)."""
        group = _host_group() if self.sync_bn_by_host else None
        if self.device is None:  # torch's SyncBatchNorm runs on accelerators only, DDP refuses it on the CPU
            model = convert_sync_batchnorm(model, process_group=group)
        else:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group=group)
        layers = [m for m in model.modules() if isinstance(m, (nn.SyncBatchNorm, CpuSyncBatchNorm))]
        if torch.distributed.get_rank() != 0:
            return model
        if layers:
            logger.info(
                "sync_bn: %d BatchNorm layers (%s) normalise over the batches of %d ranks%s",
                len(layers), type(layers[0]).__name__, torch.distributed.get_world_size(group),
                " (this node's)" if self.sync_bn_by_host else "",
            )
        else:
            logger.info(
                "sync_bn: the model has no BatchNorm layer to synchronise (after a quantization converter, "
                "qat_mode='fuse_bn' has folded BatchNorm into the convs, and with 'with_bn' it lies inside the "
                "exported graph, where each rank normalises its own batch)"
            )
        return model


def _submodule_to_wrap(model: nn.Module, name: str) -> str:
    """The path of the module to wrap in DDP for the ``convert_submodule_list`` entry ``name``.

    ``name`` itself, or, when quantization exported it inside a graph (a model converted whole
    keeps no ``backbone`` attribute), the prepared module holding that graph: the name stays
    addressable and its gradients are synchronised with the graph's.

    Raises:
        ValueError: the model has no such submodule.
    """
    try:
        model.get_submodule(name)
        return name
    except AttributeError as exc:
        error = exc
    from hat_ignite.quantization.prepared import PreparedModule  # only models with prepared modules get here

    holders = [
        path for path, module in model.named_modules()
        if isinstance(module, PreparedModule) and (not path or name == path or name.startswith(f"{path}."))
    ]
    if holders:
        holder = max(holders, key=len)
        logger.info(
            "convert_submodule_list: %r was exported for quantization inside %s: wrapping that in DDP",
            name, repr(holder) if holder else "the whole model's graph",
        )
        return holder
    names = [n for n, _ in model.named_children()]
    raise ValueError(
        f"DistributedDataParallelTrainer: convert_submodule_list names {name!r}, which the "
        f"model has not ({error}). Its top-level submodules are {names}."
    ) from None


class DataParallelTrainer(Trainer):
    """A :class:`Trainer` whose model is wrapped in ``torch.nn.DataParallel`` over several GPUs.

    One process: each batch is split along its first dimension over ``device``'s GPUs and the
    gradients are gathered on the first. Prefer :class:`DistributedDataParallelTrainer` for
    speed; this trainer exists for HAT configs that use it.

    Args:
        model: model or model config (moved to the first GPU, then wrapped).
        data_loader: training data loader or its config; its batch size is the total over GPUs.
        optimizer: optimizer or optimizer config.
        batch_processor: batch processor or its config.
        device: GPU ids (a list of ints, or one int). ``None`` trains on the CPU with the model
            left unwrapped (DataParallel has nothing to split over).
        stop_by: see :class:`~hat_ignite.engine.loop.LoopBase`.
        num_epochs: see :class:`~hat_ignite.engine.loop.LoopBase`.
        start_epoch: see :class:`~hat_ignite.engine.loop.LoopBase`.
        num_steps: see :class:`~hat_ignite.engine.loop.LoopBase`.
        start_step: see :class:`~hat_ignite.engine.loop.LoopBase`.
        callbacks: see :class:`~hat_ignite.engine.loop.LoopBase`.
        train_metrics: see :class:`~hat_ignite.engine.loop.LoopBase`.
        val_metrics: see :class:`~hat_ignite.engine.loop.LoopBase`.
        profiler: see :class:`~hat_ignite.engine.loop.LoopBase`.
        **kwargs: other :class:`~hat_ignite.engine.loop.LoopBase` arguments. ``compiler`` is
            refused with several GPUs: ``DataParallel`` copies the module at each forward, and
            the copies would not run the compiled forward; use
            :class:`DistributedDataParallelTrainer` to compile a multi-GPU run.
    """

    def __init__(
        self,
        model: nn.Module | dict,
        data_loader: Any,
        optimizer: Any,
        batch_processor: Any,
        device: int | Sequence[int] | None,
        stop_by: str | None = "epoch",
        num_epochs: int | None = None,
        start_epoch: int | None = 0,
        num_steps: int | None = None,
        start_step: int | None = 0,
        callbacks: Sequence[Any] | None = None,
        train_metrics: Any = None,
        val_metrics: Any = None,
        profiler: Any = None,
        **kwargs: Any,
    ) -> None:
        if device is None:
            ids: list[int] = []
        elif isinstance(device, int) and not isinstance(device, bool):
            ids = [device]
        elif isinstance(device, (list, tuple)) and device and all(
            isinstance(d, int) and not isinstance(d, bool) for d in device
        ):
            ids = list(device)
        else:
            raise TypeError(
                f"DataParallelTrainer: device must be a list of GPU ids (e.g. [0, 1]), one id, or None "
                f"for the CPU, got {device!r}."
            )
        if len(ids) > 1 and kwargs.get("compiler") not in (None, False):
            raise ValueError(
                f"DataParallelTrainer(device={ids}, compiler=...): a compiled model cannot be split over "
                f"several GPUs with DataParallel (it copies the module at every forward). Use "
                f"DistributedDataParallelTrainer (hat-train --device-ids ...) to compile a multi-GPU run, "
                f"or drop compiler."
            )
        super().__init__(
            model=model, data_loader=data_loader, optimizer=optimizer, batch_processor=batch_processor,
            device=ids[0] if ids else None, stop_by=stop_by, num_epochs=num_epochs, start_epoch=start_epoch,
            num_steps=num_steps, start_step=start_step, callbacks=callbacks, train_metrics=train_metrics,
            val_metrics=val_metrics, profiler=profiler, **kwargs,
        )
        #: The GPUs the batch is split over (empty on the CPU).
        self.device_ids = ids
        if ids:
            self.model = nn.DataParallel(self.model, device_ids=ids, output_device=ids[0])
        else:
            logger.info("DataParallelTrainer(device=None): training on the CPU, the model is not wrapped")
