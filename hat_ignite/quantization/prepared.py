"""`PreparedModule`: an exported, quantization-prepared graph that behaves like an eager module.

torchao's PT2E flow turns a module into a ``torch.fx.GraphModule`` whose ``train()`` / ``eval()``
raise, whose branches on ``self.training`` were fixed at export time, and whose fake-quantize
modules must be switched by hand. :class:`PreparedModule` holds such a graph in place of the
original submodule and keeps it in the right state before every forward, from three facts:

=====================  =====================  ==================  ===============  ============
stage                  when                   graph ops           observers        fake quant
=====================  =====================  ==================  ===============  ============
calibration / qat      observing (Calibrator) eval (BN stats)     on               off
qat                    ``training``           train               on               on
calibration / qat      eval (validation)      eval                off (frozen)     on
quantized              always eval            eval                —                int8 Q/DQ
=====================  =====================  ==================  ===============  ============

So a :class:`~hat_ignite.engine.calibrator.Calibrator` step records float activation ranges,
validation measures the simulated int8 model without moving any range, and QAT trains through
fake quantization. The state is applied lazily at the start of each forward, so setting
``module.training`` directly (as validation does to restore modes) is honoured too.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn

from hat_ignite.errors import QuantizationError
from hat_ignite.quantization.inductor import InductorRunner
from hat_ignite.quantization.used_inputs import input_keys, keep_keys
from hat_ignite.quantization.torchao_import import import_torchao

__all__ = ["STAGES", "PreparedModule", "prepared_modules", "observing"]

#: The stages a prepared module can be in, in pipeline order.
STAGES = ("calibration", "qat", "quantized")


def _fake_quantizers(graph: nn.Module) -> list[Any]:  # FakeQuantize modules: torch's Module stub hides their methods
    """The fake-quantize modules of a prepared graph (they carry observer/fake-quant switches)."""
    return [m for m in graph.modules() if hasattr(m, "observer_enabled") and hasattr(m, "fake_quant_enabled")]


def _has_mode_ops(graph: nn.Module) -> bool:
    """Whether the graph holds ops whose behaviour differs in train and eval (dropout, batch norm)."""
    nodes = getattr(getattr(graph, "graph", None), "nodes", ())
    return any(
        node.op == "call_function" and ("dropout" in str(node.target) or "batch_norm" in str(node.target))
        for node in nodes
    )


def _set_graph_mode(graph: nn.Module, train: bool) -> None:
    import_torchao()
    from torchao.quantization.pt2e import move_exported_model_to_eval, move_exported_model_to_train

    (move_exported_model_to_train if train else move_exported_model_to_eval)(graph)


class PreparedModule(nn.Module):
    """A PT2E graph standing in for one submodule, in one of :data:`STAGES`.

    Built by the converters (:class:`~hat_ignite.quantization.converters.Float2Calibration`,
    ``Float2QAT``); a model holds one per quantized submodule. Its ``state_dict`` holds the
    graph's weights, observer statistics and quantization parameters under ``graph.``, so a
    checkpoint of a calibrated or QAT model loads into the same model prepared again.

    Args:
        graph: the prepared (or converted) ``GraphModule``.
        stage: ``"calibration"``, ``"qat"`` or ``"quantized"``.
        name: the submodule's path in the model (``""`` for the whole model), used in messages.
        graph_training: whether the graph's ops are in training form (as exported for
            ``prepare_qat_pt2e``); ``None`` if unknown.
        record: what it was exported from (:func:`~hat_ignite.quantization.record.prepared_record`);
            the ``Checkpoint`` callback saves it with the weights, so that a checkpoint says how to
            prepare the model again without data.
    """

    def __init__(self, graph: nn.Module, stage: str, name: str = "", graph_training: bool | None = None,
                 record: dict[str, Any] | None = None) -> None:
        super().__init__()
        if stage not in STAGES:
            raise ValueError(f"PreparedModule(stage={stage!r}): use one of {STAGES}.")
        self.graph = graph
        self.stage = stage
        self.qname = name
        self.observing = False
        self._fake_quantizers = _fake_quantizers(graph)
        self._applied: tuple[bool, bool, bool] | None = None
        # Switching an exported graph rewrites it (slow): only graphs with dropout/BN need it.
        self._mode_ops = _has_mode_ops(graph)
        self._graph_training = graph_training
        #: observer averaging constants per stage and kind (``qconfig_params``); see set_averaging
        self.averaging: dict[str, dict[str, float]] = {}
        #: the export record checkpoints save (see :mod:`~hat_ignite.quantization.record`)
        self.record: dict[str, Any] = dict(record or {}, path=name, stage=stage)
        #: the keys of each dict input the graph takes (set from the example inputs), see
        #: :mod:`~hat_ignite.quantization.used_inputs`; ``None``: inputs are passed as they are
        self.input_keys: list[frozenset | None] | None = None
        #: how a ``"quantized"`` graph runs: through inductor or as saved (set by ``QAT2Quantize``;
        #: ``None``: as saved), see :mod:`hat_ignite.quantization.inductor`
        self.inductor: InductorRunner | None = None
        self._default_averaging = [
            getattr(getattr(fq, "activation_post_process", None), "averaging_constant", None)
            for fq in self._fake_quantizers
        ]

    # -- state -----------------------------------------------------------------------------
    def where(self) -> str:
        return f"the prepared module {self.qname!r}" if self.qname else "the prepared model"

    def _wanted(self) -> tuple[bool, bool, bool]:
        """``(graph in train mode, observers on, fake quant on)`` for the current flags."""
        if self.stage == "quantized":
            if self.training:
                raise QuantizationError(
                    f"{self.where()} is an int8 model (after QAT2Quantize / Calibration2Quantize) and "
                    f"cannot be trained. Train the QAT model (stage 'qat') and convert it afterwards."
                )
            return False, False, False
        if self.observing:
            return False, True, False
        if self.training:
            if self.stage != "qat":
                raise QuantizationError(
                    f"{self.where()} is a calibration model, and training it would be quantization-aware "
                    f"training without QAT preparation. Put Calibration2QAT after the calibration "
                    f"checkpoint in the trainer's model_convert_pipeline (or Float2QAT on a float model)."
                )
            return True, True, True
        return False, False, True

    def _apply_switches(self) -> None:
        wanted = self._wanted()
        if wanted == self._applied:
            return
        train, observe, fake_quant = wanted
        if self._mode_ops and self._graph_training is not train:
            _set_graph_mode(self.graph, train)
            self._graph_training = train
        if self.stage != "quantized":
            for fq in self._fake_quantizers:
                fq.observer_enabled[0] = int(observe)
                fq.fake_quant_enabled[0] = int(fake_quant)
            self._apply_averaging()
        self._applied = wanted

    def set_averaging(self, averaging: dict[str, dict[str, float]]) -> None:
        """Set the observers' averaging constants per stage and kind, applied at the next forward.

        Args:
            averaging: ``{stage: {"activation" | "weight": constant}}`` (from HAT's
                ``qconfig_params``, see :func:`~hat_ignite.quantization.qconfig.parse_qconfig_params`);
                a stage or kind left out keeps torchao's default.
        """
        self.averaging = {stage: dict(kinds) for stage, kinds in averaging.items()}
        self._applied = None

    def _apply_averaging(self) -> None:
        wanted = self.averaging.get(self.stage, {})
        for fq, default in zip(self._fake_quantizers, self._default_averaging):
            observer = getattr(fq, "activation_post_process", None)
            if default is None or observer is None:
                continue
            kind = "weight" if getattr(fq, "is_per_channel", False) else "activation"
            observer.averaging_constant = wanted.get(kind, default)

    @torch.no_grad()
    def refresh_qparams(self) -> int:
        """Recompute scales and zero points from the observers' statistics; return how many.

        Observers record ranges while fake quantization is off (calibration), when the fused
        fake-quantize op does not update its parameters; this writes them. Observers that saw
        no data yet are skipped.
        """
        done = 0
        for fq in self._fake_quantizers:
            observer = getattr(fq, "activation_post_process", None)
            min_val = getattr(observer, "min_val", None)
            if observer is None or min_val is None or min_val.numel() == 0 or not torch.isfinite(min_val).all():
                continue
            scale, zero_point = fq.calculate_qparams()
            for buf, value in ((fq.scale, scale), (fq.zero_point, zero_point)):
                if buf.shape != value.shape:
                    buf.resize_(value.shape)
                buf.copy_(value)
            done += 1
        return done

    @torch.no_grad()
    def initialize_shapes(self, args: tuple, kwargs: dict) -> int:
        """Give every per-channel observer its final shape by running the graph once on ``args``.

        A freshly prepared graph holds empty per-channel statistics that take their size from the
        first data seen. Here only those observers record (fake quantization off, every other
        observer off), so a checkpoint of a calibrated or QAT model loads into a model prepared
        again from the same example inputs, shape for shape. Returns how many were initialised.
        The keys of ``args``' dicts become :attr:`input_keys`.
        """
        self.input_keys = input_keys(args)
        pending = []
        for fq in self._fake_quantizers:
            min_val = getattr(getattr(fq, "activation_post_process", None), "min_val", None)
            empty = min_val is not None and min_val.numel() == 0
            fq.observer_enabled[0] = int(empty)
            fq.fake_quant_enabled[0] = 0
            if empty:
                pending.append(fq)
        if pending:
            # Run in the graph's current form (switching it is a slow rewrite); batch-norm
            # statistics updated by this run are put back.
            keep = {id(b) for fq in pending for b in fq.buffers()}
            saved = [(b, b.clone()) for b in self.graph.buffers() if id(b) not in keep]
            self.graph(*args, **kwargs)
            for buf, value in saved:
                buf.copy_(value)
            self.refresh_qparams()
        self._applied = None
        return len(pending)

    def train(self, mode: bool = True) -> PreparedModule:
        """Set the mode flag only; the graph follows it at the next forward (see the module doc)."""
        self.training = bool(mode)
        return self

    def export_record(self) -> dict[str, Any]:
        """What this module was exported from, as checkpoints store it (see :mod:`~hat_ignite.quantization.record`)."""
        return dict(self.record, path=self.qname, stage=self.stage)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._applied = None  # the loaded switches replace the applied ones: re-apply on forward
        if self.inductor is not None:
            self.inductor.reset()  # compiled code holds the frozen weights: compile again

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._apply_switches()
        if self.input_keys is not None:  # a dict input may hold entries the graph does not take
            args = keep_keys(args, self.input_keys)
        if self.inductor is not None and self.stage == "quantized":
            return self.inductor(self.graph, self.training, args, kwargs)
        return self.graph(*args, **kwargs)

    def extra_repr(self) -> str:
        return f"stage={self.stage!r}, name={self.qname!r}"


def prepared_modules(model: nn.Module) -> list[PreparedModule]:
    """Every :class:`PreparedModule` in ``model`` (the model itself included), outermost first."""
    return [m for m in model.modules() if isinstance(m, PreparedModule)]


@contextlib.contextmanager
def observing(model: nn.Module) -> Iterator[list[PreparedModule]]:
    """Record activation ranges in every prepared module of ``model`` for the duration.

    On exit, observing stops and the quantization parameters are recomputed from the new
    statistics, so what follows (validation, a checkpoint) sees the calibrated model.
    """
    modules = prepared_modules(model)
    for m in modules:
        m.observing = True
    try:
        yield modules
    finally:
        for m in modules:
            m.observing = False
            if m.stage != "quantized":
                m.refresh_qparams()
