"""`ModelConvertPipeline`: HAT's ordered list of ``model -> model`` converters."""

from __future__ import annotations

import logging
from typing import Callable, Sequence

from torch import nn

__all__ = ["ModelConvertPipeline"]

logger = logging.getLogger(__name__)


class ModelConvertPipeline:
    """Apply converters to a model in order, e.g. load a checkpoint, then prepare for int8.

    Any engine's ``model_convert_pipeline`` takes it (or a plain list of converters). Each
    converter is a callable ``model -> model`` or its config; configs are built when the
    pipeline is built, so a misspelled converter fails before any model is touched.

    Args:
        converters: the converters, applied first to last.

    Example:
        >>> import torch
        >>> from hat_ignite.quantization import Float2Calibration
        >>> pipeline = ModelConvertPipeline(converters=[
        ...     dict(type="Float2Calibration", example_inputs=torch.rand(2, 3)),
        ... ])
        >>> pipeline
        ModelConvertPipeline(converters=[Float2Calibration(modules=[''])])
        >>> type(pipeline(torch.nn.Linear(3, 2))).__name__
        'PreparedModule'
    """

    def __init__(self, converters: Sequence[Callable[[nn.Module], nn.Module] | dict]) -> None:
        if isinstance(converters, (dict, str)) or not isinstance(converters, Sequence):
            raise TypeError(
                f"ModelConvertPipeline(converters=...) takes a list of converters or converter configs, "
                f"got {type(converters).__name__}."
            )
        from hat_ignite.engine.loop import build_if_config

        built = []
        for i, conv in enumerate(converters):
            conv = build_if_config(conv, f"model_convert_pipeline.converters[{i}]")
            if not callable(conv):
                raise TypeError(
                    f"model_convert_pipeline.converters[{i}] is a {type(conv).__name__}, which is not "
                    f"callable as converter(model) -> model."
                )
            built.append(conv)
        self.converters = built

    def __call__(self, model: nn.Module) -> nn.Module:
        for i, conv in enumerate(self.converters):
            model = conv(model)
            if not isinstance(model, nn.Module):
                raise TypeError(
                    f"model_convert_pipeline.converters[{i}] ({conv!r}) returned a "
                    f"{type(model).__name__}; a converter must return the model."
                )
            logger.debug("model_convert_pipeline: applied %r", conv)
        return model

    def __repr__(self) -> str:
        return f"ModelConvertPipeline(converters={self.converters!r})"
