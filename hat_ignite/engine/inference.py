"""HAT's ``Inference``: one model, converted once, run on one input at a time.

HAT's inference scripts build it from a model, an optional ``model_convert_pipeline`` (load the
trained weights, convert to int8 ...) and pre/post processors, then call :meth:`Inference.forward`
on each input they read (an image, a recorded frame). There is no loop, data loader, callback
or metric: use a :class:`~hat_ignite.engine.Predictor` for batches of a data loader.

What HAT's runner does, this one does: the pipeline converts the model once, at construction,
and the model is put in eval mode and on the device; ``forward`` runs the pre-processors, moves
the data to a GPU device, calls ``model(data)`` under ``torch.no_grad()`` and runs the
post-processors, each ``(pred, data) -> (pred, data)``, returning the last ``pred``. HAT's
``march`` (the Horizon BPU architecture its quantized operators target) selects nothing here:
the converters target torchao's x86 flow. It is kept as :attr:`Inference.march`, and no warning
is logged when it is missing.

Example:
    >>> import torch
    >>> class Net(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = torch.nn.Linear(4, 3)
    ...     def forward(self, data):
    ...         return self.fc(data["img"])
    >>> _ = torch.manual_seed(0)
    >>> runner = Inference(None, Net(), pre_processors=[lambda d: dict(d, img=d["img"] * 2)],
    ...                    post_processors=[lambda pred, data: (pred.argmax(1), data)])
    >>> runner.forward({"img": torch.ones(2, 4)}).tolist(), runner.model.training, runner.device
    ([1, 1], False, device(type='cpu'))
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, cast

import torch

from hat_ignite.engine.loop_args import build_if_config, resolve_device
from hat_ignite.engine.processors.batch_ops import move_to_device

__all__ = ["Inference"]


def _one_device(device: Any) -> torch.device:
    """HAT's ``device``: one GPU id (or a list of one), ``None`` or ``[]`` for the CPU."""
    ids = list(device) if isinstance(device, (list, tuple)) else [device]
    if len(ids) > 1:
        raise ValueError(
            f"Inference runs on one device, got device={device!r}. Give one GPU id (e.g. 0), or None for the CPU; "
            f"for several GPUs run one Inference per GPU, or a Predictor under hat-train's launcher."
        )
    return resolve_device(ids[0] if ids else None)


class Inference:
    """Run a (converted) model on single inputs, as HAT's ``hat.engine.Inference``.

    Args:
        device: the GPU id to run on (an int, or a list of one); ``None`` or ``[]``: the CPU.
            A ``torch.device`` or a string such as ``"cpu"`` works too.
        model: the model, or its config.
        march: HAT's Horizon BPU architecture; kept as :attr:`march`, it selects nothing here
            (see the module docstring).
        model_convert_pipeline: a callable ``model -> model`` applied once, before the model
            is put in eval mode and on the device (a ``ModelConvertPipeline``, a list of
            converters, or their configs).
        pre_processors: callables ``data -> data`` run in order before the model.
        post_processors: callables ``(pred, data) -> (pred, data)`` run in order after it.
    """

    def __init__(
        self,
        device: int | Sequence[int] | str | torch.device | None,
        model: torch.nn.Module | dict,
        march: Any = None,
        model_convert_pipeline: Callable | Sequence[Callable] | dict | None = None,
        pre_processors: Sequence[Callable] | None = None,
        post_processors: Sequence[Callable] | None = None,
    ) -> None:
        model = build_if_config(model, "model")
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"Inference: model must be a torch.nn.Module or a model config, got {type(model).__name__}.")
        pipeline = build_if_config(model_convert_pipeline, "model_convert_pipeline")
        converters = [] if pipeline is None else list(pipeline) if isinstance(pipeline, (list, tuple)) else [pipeline]
        if converters:
            from hat_ignite.quantization.examples import apply_converters  # only runs that convert

            model = cast(torch.nn.Module, apply_converters(converters, model))
        self.model: torch.nn.Module = model
        self.model.eval()
        #: HAT's ``march`` argument, as given.
        self.march = march
        self.device = _one_device(device)
        self.set_device(self.device)
        self.preprocessors: list[Callable] = list(build_if_config(list(pre_processors or []), "pre_processors"))
        self.postprocessors: list[Callable] = list(build_if_config(list(post_processors or []), "post_processors"))

    def set_device(self, device: torch.device) -> None:
        """Move the model to ``device``; :meth:`forward` moves each input there."""
        self.device = device
        self.model.to(device)

    def preprocess(self, data: Any) -> Any:
        """``data`` after each pre-processor, in order."""
        for processor in self.preprocessors:
            data = processor(data)
        return data

    def postprocess(self, pred: Any, data: Any) -> Any:
        """``pred`` after each post-processor ``(pred, data) -> (pred, data)``, in order."""
        for i, processor in enumerate(self.postprocessors):
            result = processor(pred, data)
            if not (isinstance(result, tuple) and len(result) == 2):
                raise TypeError(
                    f"Inference: post_processors[{i}] ({getattr(processor, '__name__', type(processor).__name__)}) "
                    f"must return the pair (pred, data), as HAT's post-processors do; got {type(result).__name__}."
                )
            pred, data = result
        return pred

    def forward(self, data: Any) -> Any:
        """The model's prediction for ``data`` (pre-processed, on the device), post-processed."""
        with torch.no_grad():
            data = self.preprocess(data)
            if self.device.type != "cpu":
                data = move_to_device(data, self.device)
            return self.postprocess(self.model(data), data)
