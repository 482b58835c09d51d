"""HAT's calibration observer names and options, checked: :func:`observer_spec` -> :class:`ObserverSpec`.

HAT's ``qconfig_params`` name an observer per stage and kind
(``activation_calibration_observer="mix"``) and give its options in the matching ``*_qkwargs``
(``activation_calibration_qkwargs=dict(percentile=99.985, bins=8192)``). The calibration
observers here are those of :mod:`~.rules`; QAT keeps torchao's moving-average min/max, which
runs inside the fused fake-quantize op of every training step.
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs

from hat_ignite.errors import QuantizationError

__all__ = ["ObserverSpec", "DEFAULT_OBSERVERS", "CALIBRATION_OBSERVERS", "observer_spec", "observer_options"]

#: HAT's defaults (``hat.utils.qconfig_manager.set_default_qconfig``): the calibration stage's
#: activation observer is ``mse``, every other one ``min_max``.
DEFAULT_OBSERVERS = {
    ("calibration", "activation"): "mse", ("calibration", "weight"): "min_max",
    ("qat", "activation"): "min_max", ("qat", "weight"): "min_max",
}

#: The observers honoured per (stage, kind) and the options each takes, with their defaults.
CALIBRATION_OBSERVERS: dict[tuple[str, str], dict[str, dict[str, Any]]] = {
    ("calibration", "activation"): {
        "min_max": {},
        "percentile": {"percentile": 99.99, "bins": 2048},
        "mse": {"stride": 1, "bins": 2048},
        "kl": {"bins": 2048, "update_interval": None},
        "mix": {"bins": 2048},
    },
    ("calibration", "weight"): {"min_max": {}, "mse": {"stride": 1}},
    ("qat", "activation"): {"min_max": {}},
    ("qat", "weight"): {"min_max": {}},
}

# HAT's other observer names, and why they are not here
_NOT_PROVIDED = {
    "fixed_scale": "a fixed scale set by hand: the X86 quantizer derives every scale from observed ranges",
    "clip": "horizon's clip observer bounds the range by hand-set xmin/xmax",
    "clip_std": "horizon's mean +- k std clip",
}
_WHY_STAGE = {
    ("qat", "activation"): "QAT runs torchao's fused moving-average min/max observer inside every training step; "
                           "the histogram observers would read the data back to the host at every step. They "
                           "calibrate (activation_calibration_observer), and QAT starts from their ranges",
    ("qat", "weight"): "QAT runs torchao's fused moving-average min/max observer inside every training step",
    ("calibration", "weight"): "weights are quantized per channel (int8, axis 0), and horizon's percentile, kl and "
                               "mix observers are per-tensor only (HAT's per-channel weights refuse them too)",
}


@attrs.frozen
class ObserverSpec:
    """An observer name and its options (every option present, defaults filled in).

    >>> observer_spec("calibration", "activation", "percentile", {"percentile": 99.9})
    ObserverSpec(name='percentile', options={'percentile': 99.9, 'bins': 2048})
    """

    name: str
    options: dict[str, Any] = attrs.field(factory=dict)


def _key(stage: str, kind: str, what: str) -> str:
    return f"{kind}_{stage}_{what}"


def observer_spec(stage: str, kind: str, name: Any, options: Mapping[str, Any] | None = None) -> ObserverSpec:
    """Check HAT's observer ``name`` for ``(stage, kind)`` and its ``options``.

    Args:
        stage: ``"calibration"`` or ``"qat"``.
        kind: ``"activation"`` or ``"weight"``.
        name: the observer, e.g. ``"mix"`` (``None``: HAT's default for the stage and kind).
        options: the observer's own entries of the ``*_qkwargs`` dict (``percentile``, ``bins``,
            ``stride``, ``update_interval``).

    Raises:
        QuantizationError: an observer that is not honoured for this stage and kind, or an option
            it does not take or a value out of range; names the key and why.
    """
    name = DEFAULT_OBSERVERS[(stage, kind)] if name is None else name
    table = CALIBRATION_OBSERVERS[(stage, kind)]
    if name not in table:
        key = _key(stage, kind, "observer")
        if name in ("min_max", "percentile", "mse", "kl", "mix"):
            why = _WHY_STAGE[(stage, kind)]
        elif name in _NOT_PROVIDED:
            why = f"{_NOT_PROVIDED[name]}, which the PT2E flow here does not have"
        else:
            why = "it is not one of HAT's observers"
        raise QuantizationError(
            f"ModelConvertPipeline: qconfig_params[{key!r}]={name!r} cannot be honoured: {why}. "
            f"Use {' or '.join(repr(n) for n in table)} or leave it out."
        )
    return ObserverSpec(name=name, options=observer_options(stage, kind, name, options or {}))


def observer_options(stage: str, kind: str, name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` checked for observer ``name`` and completed with its defaults."""
    defaults = CALIBRATION_OBSERVERS[(stage, kind)][name]
    key = _key(stage, kind, "qkwargs")
    out = dict(defaults)
    for option, value in options.items():
        if option not in defaults:
            takes = f"takes {sorted(defaults)}" if defaults else "takes no options"
            raise QuantizationError(
                f"ModelConvertPipeline: qconfig_params[{key!r}][{option!r}] cannot be honoured: the "
                f"{kind} {stage} observer {name!r} {takes}. Remove {option!r} (or name the observer it "
                f"belongs to in {_key(stage, kind, 'observer')!r})."
            )
        out[option] = _checked(key, option, value)
    return out


def _checked(key: str, option: str, value: Any) -> Any:
    def bad(expected: str) -> QuantizationError:
        return QuantizationError(
            f"ModelConvertPipeline: qconfig_params[{key!r}][{option!r}] must be {expected}, got {value!r}."
        )

    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if option == "percentile":
        if not number or not 0.0 < float(value) <= 100.0:
            raise bad("a percentage in (0, 100], e.g. 99.99")
        return float(value)
    if option == "bins":
        if not isinstance(value, int) or isinstance(value, bool) or not 256 <= value <= 65536:
            raise bad("an int from 256 to 65536 (the histogram's bins over the data's range)")
        return value
    if option == "stride":
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 94:
            raise bad("an int from 1 to 94 (every stride-th of horizon's 95 candidate ranges)")
        return value
    if option == "update_interval":  # the range is computed from all batches: HAT's update_interval=num_steps
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise bad("a positive int")
        return value
    raise AssertionError(option)  # pragma: no cover
