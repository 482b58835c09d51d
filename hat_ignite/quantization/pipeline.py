"""`ModelConvertPipeline`: HAT's ordered list of ``model -> model`` converters."""

from __future__ import annotations

import copy
import logging
from typing import Any, Callable, Mapping, Sequence

from torch import nn

from hat_ignite.errors import QuantizationError
from hat_ignite.quantization.examples import apply_converters
from hat_ignite.quantization.prepared import prepared_modules
from hat_ignite.quantization.qconfig import DEFAULT_QAT_MODE, check_qat_mode, parse_qconfig_params

__all__ = ["ModelConvertPipeline"]

logger = logging.getLogger(__name__)


class ModelConvertPipeline:
    """Apply converters to a model in order, e.g. load a checkpoint, then prepare for int8.

    Any engine's ``model_convert_pipeline`` takes it (or a plain list of converters). Each
    converter is a callable ``model -> model`` or its config; configs are built when the
    pipeline is built, so a misspelled converter fails before any model is touched.

    HAT's ``qat_mode`` and ``qconfig_params`` are set here, as in HAT, and apply to this
    pipeline's converters (HAT sets them process-wide; here they stay with the pipeline, so two
    engines in one process can differ).

    Args:
        converters: the converters, applied first to last.
        qat_mode: how BatchNorm is treated by the prepare converters (``Float2Calibration``,
            ``Float2QAT``) that do not set their own: ``"fuse_bn"`` (HAT's default, used when
            ``None``) folds it into the conv/linear before preparing; ``"with_bn"`` keeps it in QAT
            (see :mod:`~hat_ignite.quantization.qconfig`). A converter with a different explicit
            ``qat_mode`` is an error.
        qconfig_params: HAT's qconfig arguments: the calibration observers
            (``activation_calibration_observer="mix"``; HAT's default ``"mse"`` when not given)
            and their options, and the observers' ``averaging_constant`` per stage and kind (e.g.
            ``activation_qat_qkwargs=dict(averaging_constant=0)`` keeps the calibrated activation
            ranges through QAT), applied to every prepared module of the model after the
            converters ran. See :func:`~hat_ignite.quantization.qconfig.parse_qconfig_params` for
            the keys honoured; others raise.

    Example:
        >>> import torch
        >>> from hat_ignite.quantization import Float2Calibration
        >>> pipeline = ModelConvertPipeline(converters=[
        ...     dict(type="Float2Calibration", example_inputs=torch.rand(2, 3)),
        ... ])
        >>> pipeline
        ModelConvertPipeline(converters=[Float2Calibration(modules=None)])
        >>> type(pipeline(torch.nn.Linear(3, 2))).__name__
        'PreparedModule'
    """

    def __init__(
        self,
        converters: Sequence[Callable[[nn.Module], nn.Module] | dict],
        qat_mode: str | None = None,
        qconfig_params: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(converters, (dict, str)) or not isinstance(converters, Sequence):
            raise TypeError(
                f"ModelConvertPipeline(converters=...) takes a list of converters or converter configs, "
                f"got {type(converters).__name__}."
            )
        from hat_ignite.engine.loop import build_if_config

        check_qat_mode(qat_mode, "ModelConvertPipeline")
        built = []
        for i, conv in enumerate(converters):
            conv = build_if_config(conv, f"model_convert_pipeline.converters[{i}]")
            if not callable(conv):
                raise TypeError(
                    f"model_convert_pipeline.converters[{i}] is a {type(conv).__name__}, which is not "
                    f"callable as converter(model) -> model."
                )
            built.append(self._with_qat_mode(conv, i, qat_mode))
        self.converters = built
        self.qat_mode = qat_mode
        #: the checked ``qconfig_params`` (``None``: not given, the prepared modules keep HAT's defaults)
        self.qconfig = None if qconfig_params is None else parse_qconfig_params(qconfig_params)
        #: the observers' averaging constants per stage and kind (from ``qconfig_params``)
        self.averaging = {} if self.qconfig is None else self.qconfig.averaging
        if qat_mode is None and any(hasattr(c, "qat_mode") for c in built):
            logger.info("ModelConvertPipeline: qat_mode not given, using HAT's default %r.", DEFAULT_QAT_MODE)

    @staticmethod
    def _with_qat_mode(conv: Any, i: int, qat_mode: str | None) -> Any:
        """A copy of a prepare converter carrying the pipeline's ``qat_mode`` (others as they are)."""
        mode = check_qat_mode(qat_mode, "ModelConvertPipeline")
        own = getattr(conv, "qat_mode", None)
        if not hasattr(conv, "qat_mode") or (own is None and qat_mode is None):
            return conv
        if own is not None:
            if qat_mode is not None and own != mode:
                raise QuantizationError(
                    f"model_convert_pipeline.converters[{i}] ({conv!r}) has qat_mode={own!r} but the "
                    f"pipeline has qat_mode={qat_mode!r}; give it in one place."
                )
            return conv
        conv = copy.copy(conv)
        conv.qat_mode = mode
        return conv

    def __call__(self, model: nn.Module) -> nn.Module:
        def check(i: int, conv: Any, model: Any) -> None:
            if not isinstance(model, nn.Module):
                raise TypeError(
                    f"model_convert_pipeline.converters[{i}] ({conv!r}) returned a "
                    f"{type(model).__name__}; a converter must return the model."
                )
            logger.debug("model_convert_pipeline: applied %r", conv)

        model = apply_converters(self.converters, model, check)
        if self.qconfig is not None:
            for module in prepared_modules(model):
                if module.stage != "quantized":
                    module.set_qconfig(self.qconfig)
        return model

    def __repr__(self) -> str:
        extra = f", qat_mode={self.qat_mode!r}" if self.qat_mode is not None else ""
        return f"ModelConvertPipeline(converters={self.converters!r}{extra})"
