"""`CalibrationStatistics`: what a calibration's observers have seen, in its checkpoints.

The model's ``state_dict`` holds the ranges only (torchao's tensors, the same in every stage). A
:class:`~hat_ignite.engine.calibrator.Calibrator` keeps one of these among its callbacks, so that
the ``Checkpoint`` callback saves the observers' statistics beside the weights (under
``callbacks["CalibrationStatistics"]``) and ``--resume`` puts them back: a stopped calibration
then ends with the ranges of a straight one. Loading a calibration checkpoint into another stage
(``LoadCheckpoint``) takes the weights and ranges and leaves this entry.
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["CalibrationStatistics"]


class CalibrationStatistics:
    """The calibration observers' statistics of a model, as a stateful callback.

    It handles no event: :meth:`attach` only finds the model's prepared modules.
    """

    def __init__(self) -> None:
        self.model: nn.Module | None = None

    def attach(self, engine: Any) -> list:
        self.model = engine.model
        return []

    def _modules(self) -> list[Any]:
        from hat_ignite.quantization.prepared import prepared_modules

        return [m for m in prepared_modules(self.model) if m.calibration is not None] if self.model is not None else []

    def state_dict(self) -> dict[str, Any]:
        """``{prepared module path: {fake-quantize module: statistics}}`` (weights-only loadable)."""
        return {m.qname: m.calibration.state_dict() for m in self._modules()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put saved statistics back into the model's observers.

        Raises:
            ValueError: they belong to other prepared modules or observers.
        """
        own = {m.qname: m for m in self._modules()}
        if set(state) != set(own):
            raise ValueError(f"calibration statistics of prepared modules {sorted(state)} saved, the model has {sorted(own)}")
        for path, saved in state.items():
            own[path].calibration.load_state_dict(saved, own[path].where())
            own[path].ranges_stale = True

    def __repr__(self) -> str:
        return "CalibrationStatistics()"
