"""`Calibrator`: run data through a calibration model so its observers record activation ranges.

In a run of several processes (``hat-train --nproc N``, ``--device-ids 0,1``, torchrun) each
process calibrates its shard of the data, and after every step the observers' statistics of the
step are summed over the processes (:func:`~hat_ignite.quantization.observers.statistics.all_reduce_statistics`):
every process then holds the statistics of all the data seen so far, exactly those of one process
that saw all of it, whatever the order (see docs/quantization.md).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Sequence, cast

import torch
from ignite.engine import Events

from hat_ignite.engine.loop import LoopBase, build_if_config

__all__ = ["Calibrator"]

logger = logging.getLogger(__name__)


class _ObservingStep:
    """The process function: the batch processor's step with the model's observers recording,
    then the step's recordings added to the observers' statistics (summed over the processes of
    a multi-process run)."""

    def __init__(self, processor: Callable, reduce_device: torch.device | None = None) -> None:
        self.processor = processor
        self.reduce_device = reduce_device

    def __call__(self, engine: LoopBase, batch: Any) -> Any:
        from hat_ignite.quantization.prepared import observing

        with observing(engine.model, commit=False) as modules:
            outputs = self.processor(engine, batch)
        for module in modules:
            module.commit_observations(self.reduce_device)
        return outputs


def _write_ranges(engine: LoopBase) -> None:
    """At the end of the run: the model's ranges are those of everything calibrated."""
    from hat_ignite.quantization.prepared import prepared_modules

    for module in prepared_modules(engine.model):
        if module.ranges_stale:
            module.update_ranges()


def _world() -> tuple[int, int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class Calibrator(LoopBase):
    """Calibrate a quantization-prepared model: ``num_steps`` forward passes, no gradients.

    An Ignite engine like the others: HAT's hooks fire and any callback or Ignite handler
    attaches (validation and a checkpoint at the end are the usual ones). The model is built,
    then converted by ``model_convert_pipeline`` — which must prepare it for quantization, e.g.
    ``[LoadCheckpoint(float best), Float2Calibration(...)]`` — and run in eval mode. During each
    step its observers record with fake quantization off (HAT's calibration observers, chosen
    by the pipeline's ``qconfig_params``; ``mse`` by default); outside the steps (validation,
    saving) it runs fake-quantized with the ranges of everything calibrated so far.

    Started in several processes (a ``torch.distributed`` process group of more than one), each
    process calibrates its shard of ``data_loader`` (a ``DistributedSampler`` is given to a loader
    without one, as for ``DistributedDataParallelTrainer``) and the observers' statistics are
    summed over the processes after every step, so the ranges are exactly those one process gets
    from all the batches. ``num_steps`` counts each process's steps, as for training. The
    statistics are saved in its checkpoints (a ``CalibrationStatistics`` entry among the
    callbacks' states), so a stopped calibration resumes to the ranges of a straight one.

    Args:
        model: a ``torch.nn.Module`` or its config.
        data_loader: calibration batches (a loader or its config).
        batch_processor: a processor with ``need_grad_update=False`` (or its config).
        device: ``None`` (CPU) or an int GPU id. A list of ids calibrates on the first, as HAT's
            Calibrator does (saying so once); ``hat-train --device-ids`` calibrates on each.
        model_convert_pipeline: converter(s) ``model -> model``; must leave observers in the model.
        num_steps: calibration steps (``None``: one pass over the loader; ``0``: only the loop
            begin/end hooks). More steps than the loader has batches run more epochs, as in HAT:
            the loader starts a new pass, and the epoch hooks (a ``Validation`` or ``Checkpoint``
            by epoch) fire at the end of each pass and of the last, partial one.
        callbacks: callbacks (or configs) attached in list order.
        val_metrics: metrics on validation data, passed to every hook.
        profiler: a profiler passed to every hook (see :class:`LoopBase`).
        log_interval: log progress after the steps whose ``step_id`` is a multiple of it, as HAT
            does (a float too; ``0`` or less: never); see :class:`~hat_ignite.engine.loop.LoopBase`.
        auto_calibration: HAT's observer search (horizon_plugin_pytorch); only ``False`` is
            supported (``True`` raises ``NotImplementedError``). ``auto_calibration_config`` is
            then unused.
        weight_reconstruction: HAT's weight reconstruction after calibration
            (horizon_plugin_pytorch); only ``False`` is supported, as above.
        compiler: compile the model (see :class:`~hat_ignite.engine.loop.LoopBase`).

    Raises:
        ValueError: the batch processor updates gradients, or ``num_steps`` is ``None`` with a
            loader that has no length.
        QuantizationError: the converted model has no observers to calibrate, or (in several
            processes) its activation observers average over batches in order.

    Example:
        >>> from hat_ignite.engine import BasicBatchProcessor
        >>> from hat_ignite.quantization import Float2Calibration
        >>> data = [torch.rand(8, 4) for _ in range(3)]
        >>> calibrator = Calibrator(
        ...     model=torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), data_loader=data,
        ...     batch_processor=BasicBatchProcessor(need_grad_update=False),
        ...     model_convert_pipeline=[Float2Calibration(example_inputs=data[0])], num_steps=3)
        >>> calibrator.fit().iteration
        3
    """

    def __init__(
        self,
        model: torch.nn.Module | dict,
        data_loader: Iterable | dict,
        batch_processor: Callable | dict,
        device: int | Sequence[int] | None = None,
        model_convert_pipeline: Any = None,
        num_steps: int | None = None,
        callbacks: Sequence[Any] | None = None,
        val_metrics: Any = None,
        profiler: Any = None,
        log_interval: float = 0,
        auto_calibration: bool = False,
        auto_calibration_config: dict | None = None,
        weight_reconstruction: bool = False,
        weight_reconstruction_config: dict | None = None,
        compiler: Any = None,
    ) -> None:
        for name, value in (("auto_calibration", auto_calibration), ("weight_reconstruction", weight_reconstruction)):
            if value:
                raise NotImplementedError(
                    f"Calibrator({name}=True) runs horizon_plugin_pytorch's {name.replace('_', ' ')} search, "
                    f"which the torchao PT2E quantization used here does not have. Set {name}=False (and "
                    f"drop {name}_config) to calibrate with the observers of the prepared model."
                )
        processor = build_if_config(batch_processor, "batch_processor")
        if getattr(processor, "need_grad_update", False):
            raise ValueError(
                "Calibrator: the batch_processor has need_grad_update=True, but calibration only runs "
                "forward passes. Use a processor with need_grad_update=False."
            )
        one_device: int | None = None
        if isinstance(device, (list, tuple)):
            if len(device) > 1:
                logger.info("Calibrator(device=%s): calibrating on one device, GPU %s, as HAT's Calibrator does "
                            "(hat-train --device-ids calibrates in one process per GPU)", list(device), device[0])
            one_device = device[0] if device else None
        else:
            one_device = cast("int | None", device)  # LoopBase checks it
        data_loader = build_if_config(data_loader, "data_loader")
        rank, world = _world()
        if world > 1:
            from hat_ignite.engine.dist_data import distributed_loader, shared_seed

            data_loader = distributed_loader(data_loader, num_replicas=world, rank=rank, seed=shared_seed())
        try:
            length: int | None = len(data_loader)  # type: ignore[arg-type]
        except TypeError:
            length = None
        if num_steps is None:
            if length is None:
                raise ValueError(
                    f"Calibrator: the data_loader ({type(data_loader).__name__}) has no length, so "
                    f"num_steps must say how many batches to calibrate on."
                )
            num_steps = length
        from hat_ignite.quantization.observers.checkpoint import CalibrationStatistics

        super().__init__(
            model=model,
            data_loader=data_loader,
            optimizer=None,
            batch_processor=processor,
            device=one_device,
            model_convert_pipeline=model_convert_pipeline,
            stop_by="step",
            num_steps=num_steps,
            # the observers' statistics, saved and resumed with the callbacks' states
            callbacks=[*(callbacks or []), CalibrationStatistics()],
            val_metrics=val_metrics,
            profiler=profiler,
            log_interval=log_interval,
            compiler=compiler,
        )
        from hat_ignite.errors import QuantizationError
        from hat_ignite.quantization.prepared import prepared_modules

        modules = prepared_modules(self.model)
        if not modules:
            raise QuantizationError(
                f"Calibrator: the model ({type(self.model).__name__}) has no observers to calibrate. "
                f"Put Float2Calibration in model_convert_pipeline (after the LoadCheckpoint of the "
                f"float checkpoint)."
            )
        reduce_device = None
        if world > 1:
            averaged = [m.where() for m in modules if "activation" in m.averaging.get("calibration", {})]
            if averaged:
                raise QuantizationError(
                    f"Calibrator: {averaged[0]} averages its activation ranges over the batches in their order "
                    f"(activation_calibration_qkwargs averaging_constant), which {world} processes, each "
                    f"calibrating its shard, cannot reproduce. Remove averaging_constant from "
                    f"activation_calibration_qkwargs (the observers then compute their ranges from all batches "
                    f"together), or calibrate in one process."
                )
            nccl = torch.distributed.get_backend() == "nccl"
            reduce_device = self.torch_device if nccl else torch.device("cpu")
            if rank == 0:
                logger.info(
                    "Calibrator: %d processes, each calibrating its shard of the data; the observers' statistics "
                    "are summed over the processes after every step (the ranges of one process calibrating on "
                    "all of it)", world,
                )
        self.step_processor = _ObservingStep(processor, reduce_device)
        self.add_event_handler(Events.COMPLETED, _write_ranges)

    #: A stopped calibration resumes at the batch it stopped at, with the generators of that
    #: point (its checkpoints hold the data position): the observers see the same batches, in
    #: the same order, as in a straight run.
    keeps_data_position = True

    def set_model_mode(self) -> None:
        self.model.eval()
