"""HAT's quantization arguments, checked and mapped onto the PT2E flow.

========================  ===================================================================
HAT argument              here
========================  ===================================================================
``qat_mode``              ``"fuse_bn"`` (HAT's default): BatchNorm is folded into the conv /
                          linear before it is prepared (running statistics, in the exported
                          graph); QAT trains the fused layer. ``"with_bn"``: BatchNorm stays
                          in QAT as torchao's QAT conv-BN pattern (batch statistics in
                          training) and is folded into the int8 weights at conversion.
                          ``"with_bn_reverse_fold"`` is refused (no such mode in torchao).
``qconfig_params``        the observers per stage (calibration / QAT) and kind (activation /
                          weight), their options and moving averages; see
                          :func:`parse_qconfig_params` and :mod:`~hat_ignite.quantization.observers`.
``convert_mode``          ``"eager"``, ``"fx"``, ``"jit"``, ``"jit-strip"`` all map to the one
                          ``torch.export`` based mode (see :data:`CONVERT_MODES`).
========================  ===================================================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from hat_ignite.errors import QuantizationError
from hat_ignite.quantization.observers.spec import DEFAULT_OBSERVERS, ObserverSpec, observer_spec

__all__ = [
    "QAT_MODES",
    "DEFAULT_QAT_MODE",
    "CONVERT_MODES",
    "check_qat_mode",
    "check_convert_mode",
    "QConfig",
    "parse_qconfig_params",
]

#: The ``qat_mode`` values honoured, and what each does.
QAT_MODES: dict[str, str] = {
    "fuse_bn": "BatchNorm folded into the preceding conv/linear before preparing; QAT trains the fused layer",
    "with_bn": "BatchNorm kept in QAT (torchao's QAT conv-BN pattern), folded into the int8 weights at conversion",
}
#: HAT's default when ``qat_mode`` is not given.
DEFAULT_QAT_MODE = "fuse_bn"

#: HAT's ``convert_mode`` values and what each becomes here: all are the one export-based flow.
CONVERT_MODES: dict[str, str] = {
    "eager": "torch.export + prepare_qat_pt2e (HAT: module swapping after model.fuse_model())",
    "fx": "torch.export + prepare_qat_pt2e (HAT: torch.fx symbolic tracing)",
    "jit": "torch.export + prepare_qat_pt2e (HAT: TorchScript-traced graph)",
    "jit-strip": "torch.export + prepare_qat_pt2e (HAT: TorchScript-traced graph, stripped)",
}

_STAGE_OF_PREFIX = {"qat": "qat", "calibration": "calibration"}
_KINDS = ("activation", "weight")
_FAKE_QUANTS = ("fake_quant",)
# qkwargs keys whose only honoured value is the PT2E flow's own (X86 inductor quantizer)
_FIXED_QKWARGS: dict[str, dict[str, tuple[Any, ...]]] = {
    "activation": {"qscheme": (torch.per_tensor_affine,), "dtype": (torch.quint8, torch.uint8, "quint8", "uint8")},
    "weight": {"qscheme": (torch.per_channel_symmetric,), "ch_axis": (0,), "dtype": (torch.qint8, torch.int8, "qint8", "int8")},
}


def check_qat_mode(value: str | None, where: str) -> str:
    """``value`` if it is a ``qat_mode`` we honour (``None``: HAT's default, ``"fuse_bn"``).

    >>> check_qat_mode(None, "ModelConvertPipeline"), check_qat_mode("with_bn", "x")
    ('fuse_bn', 'with_bn')

    Raises:
        QuantizationError: any other value, naming ``where`` and the honoured ones.
    """
    if value is None:
        return DEFAULT_QAT_MODE
    if value in QAT_MODES:
        return value
    why = (
        "torchao has no reverse-fold QAT conv-BN pattern; 'with_bn' keeps BatchNorm in QAT with "
        "torchao's own folding" if value == "with_bn_reverse_fold" else "it is not a qat_mode"
    )
    raise QuantizationError(
        f"{where}: qat_mode={value!r} cannot be honoured ({why}). Use one of "
        + "; ".join(f"{k!r}: {v}" for k, v in QAT_MODES.items()) + "."
    )


def check_convert_mode(value: str, where: str) -> str:
    """``value`` if it is one of HAT's ``convert_mode`` values (all mean the export-based flow).

    >>> check_convert_mode("jit-strip", "Float2QAT")
    'jit-strip'

    Raises:
        QuantizationError: any other value, naming ``where`` and the accepted ones.
    """
    if value in CONVERT_MODES:
        return value
    raise QuantizationError(
        f"{where}: convert_mode={value!r} is not one of HAT's modes {sorted(CONVERT_MODES)}. hat-ignite "
        f"has one conversion flow (torch.export + torchao PT2E) and accepts each of HAT's values for it; "
        f"leave convert_mode out or use one of those."
    )


def _check_choice(key: str, value: Any, allowed: tuple[str, ...], why: str) -> None:
    if value not in allowed:
        raise QuantizationError(
            f"ModelConvertPipeline: qconfig_params[{key!r}]={value!r} cannot be honoured: {why}. "
            f"Use {' or '.join(repr(a) for a in allowed)} or leave it out."
        )


@attrs.frozen
class QConfig:
    """HAT's ``qconfig_params``, checked (see :func:`parse_qconfig_params`).

    Attributes:
        averaging: torchao's moving-average constant per stage and kind
            (``{"qat": {"activation": 0.0}}``); a stage or kind left out keeps torchao's ``0.01``.
        observers: the observer per ``(stage, kind)``, HAT's defaults filled in.
    """

    averaging: dict[str, dict[str, float]] = attrs.field(factory=dict)
    observers: dict[tuple[str, str], ObserverSpec] = attrs.field(factory=dict)

    def calibration_observer(self, kind: str) -> ObserverSpec | None:
        """The calibration observer of ``kind`` that hat-ignite runs, or ``None`` where torchao's
        own moving-average min/max observer does (an ``averaging_constant`` given for calibration,
        or weights observed by ``min_max``)."""
        spec = self.observers.get(("calibration", kind)) or observer_spec("calibration", kind, None)
        if kind in self.averaging.get("calibration", {}) or (kind == "weight" and spec.name == "min_max"):
            return None
        return spec


def _qkwargs(key: str, kind: str, qkwargs: Any) -> tuple[float | None, dict[str, Any]]:
    """``(averaging_constant or None, the observer's own options)`` of a ``*_qkwargs`` dict."""
    if qkwargs is None:
        return None, {}
    if not isinstance(qkwargs, Mapping):
        raise QuantizationError(f"ModelConvertPipeline: qconfig_params[{key!r}] must be a dict, got {type(qkwargs).__name__}.")
    options: dict[str, Any] = {}
    for name, value in qkwargs.items():
        if name == "averaging_constant":
            continue
        fixed = _FIXED_QKWARGS[kind].get(name)
        if fixed is None:
            options[name] = value  # checked against the stage's observer
            continue
        if value not in fixed:
            raise QuantizationError(
                f"ModelConvertPipeline: qconfig_params[{key!r}][{name!r}]={value!r} cannot be honoured: "
                f"torchao's X86 quantizer has {kind}s as {fixed[0]!r} only (uint8 per-tensor affine "
                f"activations, int8 per-channel symmetric weights on axis 0). Use {fixed[0]!r} or remove it."
            )
    constant = qkwargs.get("averaging_constant")
    if constant is None:
        return None, options
    if isinstance(constant, bool) or not isinstance(constant, (int, float)) or not 0.0 <= constant <= 1.0 or math.isnan(constant):
        raise QuantizationError(
            f"ModelConvertPipeline: qconfig_params[{key!r}]['averaging_constant'] must be a number in "
            f"[0, 1] (0: keep the range already observed, 1: use each batch's range), got {constant!r}."
        )
    return float(constant), options


def _check_averaged(stage: str, kind: str, spec: ObserverSpec, named: bool) -> None:
    """A calibration ``averaging_constant`` means torchao's moving-average min/max: refuse it beside
    an observer that computes one range from all batches."""
    if stage != "calibration" or spec.name == "min_max":
        return
    observer_key = f"{kind}_calibration_observer"
    given = f"{observer_key}={spec.name!r}" if named else f"HAT's default {observer_key}={spec.name!r}"
    raise QuantizationError(
        f"ModelConvertPipeline: qconfig_params['{kind}_calibration_qkwargs']['averaging_constant'] cannot be "
        f"honoured with {given}: that observer computes one range from the statistics of all calibration "
        f"batches, not a moving average over batches. Remove averaging_constant, or set "
        f"{observer_key}='min_max' for a moving-average min/max."
    )


def parse_qconfig_params(params: Mapping[str, Any] | None) -> QConfig:
    """Check HAT's ``qconfig_params``: the observers per stage and kind, their options and averaging.

    Honoured keys (HAT's ``set_default_qconfig`` arguments):

    * ``activation_calibration_observer``: ``"mse"`` (HAT's default), ``"min_max"``,
      ``"percentile"``, ``"kl"`` or ``"mix"``; ``weight_calibration_observer``: ``"min_max"``
      (HAT's default) or ``"mse"``. Each computes one range from the statistics of all
      calibration batches (see :mod:`hat_ignite.quantization.observers`).
    * ``activation_qat_observer``, ``weight_qat_observer``: ``"min_max"`` only (torchao's
      moving-average min/max, run inside the fused fake-quantize op of every training step).
    * ``activation_qat_qkwargs``, ``weight_qat_qkwargs``, ``activation_calibration_qkwargs``,
      ``weight_calibration_qkwargs``: the observer's options (``percentile``, ``bins``, ``stride``,
      ``update_interval``, as the observer takes them) and ``averaging_constant`` in ``[0, 1]``:
      torchao's moving average while the prepared model is in that stage (``0`` freezes the
      range already observed, e.g. the calibrated one; ``1`` takes each batch's range); for
      calibration, only with the ``"min_max"`` observer named. ``qscheme``, ``ch_axis``, ``dtype``
      are accepted at the flow's own values only (activations ``torch.per_tensor_affine`` /
      ``quint8``; weights ``torch.per_channel_symmetric``, ``ch_axis=0``, ``qint8``).
    * ``activation_fake_quant``, ``weight_fake_quant``: ``"fake_quant"`` only.

    Anything else raises, naming the key and why.

    Example:
        >>> qconfig = parse_qconfig_params(dict(
        ...     activation_qat_qkwargs=dict(averaging_constant=0.0),
        ...     weight_qat_qkwargs=dict(averaging_constant=1, qscheme=torch.per_channel_symmetric, ch_axis=0),
        ...     activation_calibration_observer="percentile",
        ...     activation_calibration_qkwargs=dict(percentile=99.985, bins=8192),
        ... ))
        >>> qconfig.averaging
        {'qat': {'activation': 0.0, 'weight': 1.0}}
        >>> qconfig.calibration_observer("activation")
        ObserverSpec(name='percentile', options={'percentile': 99.985, 'bins': 8192})
        >>> parse_qconfig_params(None).calibration_observer("activation").name  # HAT's default
        'mse'
        >>> parse_qconfig_params(dict(activation_qat_observer="percentile"))
        Traceback (most recent call last):
        ...
        hat_ignite.errors.QuantizationError: ModelConvertPipeline: qconfig_params['activation_qat_observer']='percentile' cannot be honoured: QAT runs torchao's fused moving-average min/max observer inside every training step; the histogram observers would read the data back to the host at every step. They calibrate (activation_calibration_observer), and QAT starts from their ranges. Use 'min_max' or leave it out.

    Raises:
        QuantizationError: a key or value that cannot be honoured.
    """
    if params is None:
        return QConfig(observers={sk: observer_spec(*sk, None) for sk in DEFAULT_OBSERVERS})
    if not isinstance(params, Mapping):
        raise QuantizationError(
            f"ModelConvertPipeline: qconfig_params must be a dict of HAT's qconfig arguments, got {type(params).__name__}."
        )
    names: dict[tuple[str, str], Any] = {}
    options: dict[tuple[str, str], dict[str, Any]] = {}
    averaging: dict[str, dict[str, float]] = {}
    for key, value in params.items():
        kind, _, rest = str(key).partition("_")
        stage, _, what = rest.partition("_")
        if kind in _KINDS and rest == "fake_quant":
            _check_choice(key, value, _FAKE_QUANTS, "the PT2E flow has torchao's fused fake-quantize modules only")
        elif kind in _KINDS and stage in _STAGE_OF_PREFIX and what == "observer":
            names[(stage, kind)] = value
        elif kind in _KINDS and stage in _STAGE_OF_PREFIX and what == "qkwargs":
            constant, options[(stage, kind)] = _qkwargs(key, kind, value)
            if constant is not None:
                averaging.setdefault(_STAGE_OF_PREFIX[stage], {})[kind] = constant
        else:
            raise QuantizationError(
                f"ModelConvertPipeline: qconfig_params has {key!r}, which is not one of HAT's qconfig "
                f"arguments ({{activation,weight}}_fake_quant, {{activation,weight}}_{{qat,calibration}}_observer, "
                f"{{activation,weight}}_{{qat,calibration}}_qkwargs)."
            )
    observers = {}
    for stage_kind in DEFAULT_OBSERVERS:
        spec = observer_spec(*stage_kind, names.get(stage_kind), options.get(stage_kind))
        if stage_kind[1] in averaging.get(stage_kind[0], {}):
            _check_averaged(*stage_kind, spec, stage_kind in names)
        observers[stage_kind] = spec
    return QConfig(averaging=averaging, observers=observers)
