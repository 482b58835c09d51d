"""The calibration observers of one prepared graph, hooked onto torchao's fake-quantize modules.

torchao's prepared graph keeps its fake-quantize modules (and their moving-average min/max
observers) in every stage, so calibration and QAT checkpoints hold the same tensors. The
calibration observers here sit beside them: a forward pre-hook on each fake-quantize module
(a :class:`FakeQuantizeTap`, put there once when the graph is prepared) hands its input to the
module's observer while the prepared module calibrates; torchao's own observer is off then. When the ranges are needed (:meth:`CalibrationObservers.write_ranges`) each observer's
range becomes its fake-quantize module's ``min_val`` / ``max_val``, scale and zero point: what
validation measures, checkpoints store, QAT starts from and ``QAT2Quantize`` converts.

Which fake-quantize modules get one: every activation (per-tensor) one whose scale comes from an
observed range (not a fixed-qparams one), unless the activation observer is torchao's
moving-average ``min_max`` (an ``averaging_constant`` given for calibration); weight
(per-channel) ones only for ``weight_calibration_observer="mse"`` (weights do not change while
calibrating, so torchao's observer already holds their min and max).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hat_ignite.quantization.observers.rules import MSE_STEPS, range_of
from hat_ignite.quantization.observers.spec import ObserverSpec
from hat_ignite.quantization.observers.statistics import Statistics, all_reduce_statistics

__all__ = ["ActivationObserver", "WeightMSEObserver", "CalibrationObservers", "FakeQuantizeTap"]


def _qparams(observer: Any) -> Any:
    """torchao's observer's own ``(lo, hi) -> (scale, zero_point)``, on its device."""
    device = observer.eps.device
    return lambda lo, hi: observer._calculate_qparams(lo.to(device), hi.to(device))


class FakeQuantizeTap:
    """The forward pre-hook of a fake-quantize module: its input goes to ``owner.calibration``.

    ``owner`` is the prepared module holding the graph; its current :class:`CalibrationObservers`
    (``None`` when int8) is looked up at each call, so observers are changed without touching
    the hooks (and a deep copy of the model taps its own copy).
    """

    def __init__(self, owner: Any, name: str) -> None:
        self.owner = owner
        self.name = name

    def __call__(self, module: nn.Module, args: tuple) -> None:
        calibration = self.owner.calibration
        if calibration is not None and args and isinstance(args[0], torch.Tensor):
            calibration.record(self.name, args[0])


class ActivationObserver:
    """A calibration observer of one activation: order-independent statistics and a range rule.

    :meth:`record` adds its input while :attr:`recording`. What a step records goes to
    :attr:`pending` until :meth:`CalibrationObservers.commit` adds it to :attr:`stats` (after
    summing it over the processes of a multi-process calibration).
    """

    def __init__(self, spec: ObserverSpec, fake_quantize: nn.Module) -> None:
        self.spec = spec
        self.fake_quantize: Any = fake_quantize  # torchao's FakeQuantize (torch's Module stub hides its attributes)
        bins = 0 if spec.name == "min_max" else int(spec.options["bins"])
        self.stats = Statistics(bins)
        self.pending = Statistics(bins)
        self.recording = False

    def record(self, x: torch.Tensor) -> None:
        if self.recording:
            self.pending.observe(x)

    def range(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(min_val, max_val)`` for torchao's observer, or ``None`` before any data."""
        if self.stats.empty:
            return None
        observer = self.fake_quantize.activation_post_process
        lo, hi = range_of(self.spec.name, self.stats, self.spec.options, _qparams(observer),
                          int(observer.quant_min), int(observer.quant_max))
        return torch.tensor(lo), torch.tensor(hi)


class WeightMSEObserver:
    """``weight_calibration_observer="mse"``: per output channel, ``alpha * (min, max)`` with the
    least squared fake-quantization error of the weight itself, ``alpha`` = 1, 0.99, ..., 0.06.

    The weight does not change during calibration; the last one seen is kept (not saved: the
    range it gave is in the model's checkpoint).
    """

    stats = None
    pending = None

    def __init__(self, spec: ObserverSpec, fake_quantize: nn.Module) -> None:
        self.spec = spec
        self.fake_quantize: Any = fake_quantize  # torchao's FakeQuantize (torch's Module stub hides its attributes)
        self.weight: torch.Tensor | None = None
        self.recording = False

    def record(self, x: torch.Tensor) -> None:
        if self.recording:
            self.weight = x.detach()

    @torch.no_grad()
    def range(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.weight is None:
            return None
        fq: Any = self.fake_quantize
        observer = fq.activation_post_process
        w = self.weight.float().transpose(0, int(fq.ch_axis)).flatten(1)
        lo, hi = torch.aminmax(w, dim=1)
        alphas = torch.tensor([1.0 - 0.01 * k for k in range(0, MSE_STEPS, int(self.spec.options["stride"]))],
                              device=w.device)
        errors = []
        for alpha in alphas:
            scale, zero_point = observer._calculate_qparams(alpha * lo, alpha * hi)
            q = torch.fake_quantize_per_channel_affine(
                w, scale.to(w.device).float(), zero_point.to(w.device).int(), 0, int(observer.quant_min),
                int(observer.quant_max))
            errors.append((q - w).square().sum(dim=1))
        best = alphas[torch.stack(errors).argmin(dim=0)]
        return best * lo, best * hi


def _is_weight(fake_quantize: Any) -> bool:
    return bool(getattr(fake_quantize, "is_per_channel", False))


def _observes_ranges(fake_quantize: Any) -> bool:
    """Whether the module's observer takes its scale from a min/max range (a fixed-qparams one does not)."""
    observer = getattr(fake_quantize, "activation_post_process", None)
    return all(hasattr(observer, name) for name in ("min_val", "max_val", "_calculate_qparams"))


class CalibrationObservers:
    """The calibration observers of one prepared graph (see the module docstring).

    Args:
        fake_quantizers: ``{name: fake-quantize module}`` of the graph (each with a
            :class:`FakeQuantizeTap` calling :meth:`record`).
        activation: the activation calibration observer, or ``None`` for torchao's own.
        weight: the weight calibration observer, or ``None`` for torchao's own.
    """

    def __init__(self, fake_quantizers: dict[str, nn.Module], activation: ObserverSpec | None,
                 weight: ObserverSpec | None) -> None:
        self.observers: dict[str, ActivationObserver | WeightMSEObserver] = {}
        for name in sorted(fake_quantizers):
            fq = fake_quantizers[name]
            if not _observes_ranges(fq):
                continue
            if _is_weight(fq):
                observer: ActivationObserver | WeightMSEObserver | None = (
                    WeightMSEObserver(weight, fq) if weight is not None and weight.name == "mse" else None)
            else:
                observer = ActivationObserver(activation, fq) if activation is not None else None
            if observer is not None:
                self.observers[name] = observer
        self._handled = {id(o.fake_quantize) for o in self.observers.values()}

    def record(self, name: str, x: torch.Tensor) -> None:
        """The input ``x`` of fake-quantize module ``name`` (its observer records it if recording)."""
        observer = self.observers.get(name)
        if observer is not None:
            observer.record(x)

    def handles(self, fake_quantize: nn.Module) -> bool:
        """Whether one of these observers stands in for this module's torchao observer."""
        return id(fake_quantize) in self._handled

    def set_recording(self, recording: bool) -> None:
        for observer in self.observers.values():
            observer.recording = recording

    def histogram_observers(self) -> list[ActivationObserver]:
        return [o for o in self.observers.values() if isinstance(o, ActivationObserver)]

    def commit(self, reduce_device: torch.device | None = None) -> None:
        """Add what was recorded since the last commit to the statistics (the ranges follow at
        the next :meth:`write_ranges`).

        Args:
            reduce_device: sum the recorded statistics over the processes of the default
                process group first (a collective: every process calls it at the same point),
                with tensors on this device; ``None``: this process only.
        """
        observers = self.histogram_observers()
        if reduce_device is not None and observers:
            all_reduce_statistics([o.pending for o in observers], reduce_device)
        for observer in observers:
            observer.stats.merge(observer.pending)
            observer.pending = observer.stats.empty_like()

    @torch.no_grad()
    def write_ranges(self) -> int:
        """Write each observer's range into its fake-quantize module's observer; return how many."""
        done = 0
        for observer in self.observers.values():
            found = observer.range()
            if found is None:
                continue
            target = observer.fake_quantize.activation_post_process
            for buffer, value in ((target.min_val, found[0]), (target.max_val, found[1])):
                if buffer.shape != value.shape:
                    buffer.resize_(value.shape)
                buffer.copy_(value)
            done += 1
        return done

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The statistics of each histogram observer, by fake-quantize module name."""
        return {name: {"observer": o.spec.name, "stats": o.stats.state_dict()}
                for name, o in self.observers.items() if isinstance(o, ActivationObserver)}

    def load_state_dict(self, state: dict[str, Any], where: str) -> None:
        """Put back a :meth:`state_dict`.

        Raises:
            ValueError: the saved observers are not these (another observer or option); names
                ``where``.
        """
        own = {name: o for name, o in self.observers.items() if isinstance(o, ActivationObserver)}
        if set(state) != set(own):
            raise ValueError(
                f"{where}: the checkpoint holds calibration statistics of {sorted(state)}, this model has "
                f"calibration observers on {sorted(own)}; resume with the qconfig_params that wrote it"
            )
        for name, saved in state.items():
            observer = own[name]
            if saved["observer"] != observer.spec.name:
                raise ValueError(f"{where}: {name} was calibrated with {saved['observer']!r}, this run uses "
                                 f"{observer.spec.name!r}; resume with the qconfig_params that wrote it")
            device = observer.fake_quantize.activation_post_process.eps.device
            try:
                observer.stats.load_state_dict(saved["stats"], device)
            except ValueError as exc:
                raise ValueError(f"{where}: {name}: {exc}; resume with the qconfig_params that wrote it") from None
