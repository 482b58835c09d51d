"""`Calibrator`: run data through a calibration model so its observers record activation ranges."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import torch

from hat_ignite.engine.loop import LoopBase, build_if_config

__all__ = ["Calibrator"]


class _ObservingStep:
    """The process function: the batch processor's step with the model's observers recording."""

    def __init__(self, processor: Callable) -> None:
        self.processor = processor

    def __call__(self, engine: LoopBase, batch: Any) -> Any:
        from hat_ignite.quantization.prepared import observing

        with observing(engine.model):
            return self.processor(engine, batch)


class Calibrator(LoopBase):
    """Calibrate a quantization-prepared model: ``num_steps`` forward passes, no gradients.

    An Ignite engine like the others: HAT's hooks fire and any callback or Ignite handler
    attaches (validation and a checkpoint at the end are the usual ones). The model is built,
    then converted by ``model_convert_pipeline`` — which must prepare it for quantization, e.g.
    ``[LoadCheckpoint(float best), Float2Calibration(...)]`` — and run in eval mode. During each
    step its observers record ranges with fake quantization off; outside the steps (validation,
    saving) it runs fake-quantized with frozen ranges.

    Args:
        model: a ``torch.nn.Module`` or its config.
        data_loader: calibration batches (a loader or its config).
        batch_processor: a processor with ``need_grad_update=False`` (or its config).
        device: ``None`` (CPU) or an int GPU id.
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
        QuantizationError: the converted model has no observers to calibrate.

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
        device: int | None = None,
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
        data_loader = build_if_config(data_loader, "data_loader")
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
        super().__init__(
            model=model,
            data_loader=data_loader,
            optimizer=None,
            batch_processor=processor,
            device=device,
            model_convert_pipeline=model_convert_pipeline,
            stop_by="step",
            num_steps=num_steps,
            callbacks=callbacks,
            val_metrics=val_metrics,
            profiler=profiler,
            log_interval=log_interval,
            compiler=compiler,
        )
        self.step_processor = _ObservingStep(processor)
        from hat_ignite.quantization.prepared import prepared_modules

        if not prepared_modules(self.model):
            from hat_ignite.errors import QuantizationError

            raise QuantizationError(
                f"Calibrator: the model ({type(self.model).__name__}) has no observers to calibrate. "
                f"Put Float2Calibration in model_convert_pipeline (after the LoadCheckpoint of the "
                f"float checkpoint)."
            )

    #: A stopped calibration resumes at the batch it stopped at, with the generators of that
    #: point (its checkpoints hold the data position): the observers see the same batches, in
    #: the same order, as in a straight run.
    keeps_data_position = True

    def set_model_mode(self) -> None:
        self.model.eval()
