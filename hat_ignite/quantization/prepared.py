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

In the calibration stage the activations are observed by HAT's calibration observers
(:mod:`~hat_ignite.quantization.observers`, ``mse`` by default as in HAT), which hand their
ranges to torchao's fake-quantize modules when a range is next needed: the first forward that
does not observe, a ``state_dict`` (a checkpoint), or leaving the calibration stage.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from typing import Any, Iterator

import torch
from torch import nn

from hat_ignite.errors import QuantizationError
from hat_ignite.quantization.observer_match import observer_identities
from hat_ignite.quantization.observers.hooks import CalibrationObservers, FakeQuantizeTap
from hat_ignite.quantization.qconfig import QConfig, parse_qconfig_params
from hat_ignite.quantization.inductor import InductorRunner
from hat_ignite.quantization.used_inputs import input_keys, keep_keys
from hat_ignite.quantization.torchao_import import import_torchao

__all__ = ["STAGES", "PreparedModule", "prepared_modules", "observing"]

#: The stages a prepared module can be in, in pipeline order.
STAGES = ("calibration", "qat", "quantized")


def _named_fake_quantizers(graph: nn.Module) -> dict[str, Any]:  # torch's Module stub hides their methods
    """The fake-quantize modules of a prepared graph by name (they carry observer/fake-quant switches)."""
    return {n: m for n, m in graph.named_modules() if hasattr(m, "observer_enabled") and hasattr(m, "fake_quant_enabled")}


def _fake_quantizers(graph: nn.Module) -> list[Any]:
    return list(_named_fake_quantizers(graph).values())


def _ranges_before_saving(module: PreparedModule, prefix: str, keep_vars: bool) -> None:
    """``state_dict`` pre-hook: a checkpoint holds the ranges of everything observed so far."""
    if module.ranges_stale and not module.observing:
        module.update_ranges()


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
        self._stage = stage
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
        #: what each observer observes (:func:`~.observer_match.observer_identities`); checkpoints
        #: record it, so a model prepared from another graph loads each range where it belongs
        self.observers: dict[str, str] = observer_identities(graph) if stage != "quantized" else {}
        #: submodules with weights the exported forward never called (see :mod:`~.observer_match`)
        self.uncalled: list[str] = []
        #: how a ``"quantized"`` graph runs: through inductor or as saved (set by ``QAT2Quantize``;
        #: ``None``: as saved), see :mod:`hat_ignite.quantization.inductor`
        self.inductor: InductorRunner | None = None
        self._default_averaging = [
            getattr(getattr(fq, "activation_post_process", None), "averaging_constant", None)
            for fq in self._fake_quantizers
        ]
        #: HAT's calibration observers of the graph, in the calibration stage (else ``None``);
        #: see :meth:`set_qconfig`
        self.calibration: CalibrationObservers | None = None
        #: observations are not yet in the fake-quantize modules' ranges (see :meth:`update_ranges`)
        self.ranges_stale = False
        # the fake-quantize modules' forward pre-hooks feeding the calibration observers: only in
        # the calibration stage, so that QAT steps run the graph without them
        self._taps: list[Any] = []
        if stage == "calibration":
            self._taps = [fq.register_forward_pre_hook(FakeQuantizeTap(self, fq_name))
                          for fq_name, fq in _named_fake_quantizers(graph).items()]
            self._install_observers(parse_qconfig_params(None))
        self.register_state_dict_pre_hook(_ranges_before_saving)

    def __deepcopy__(self, memo: dict[int, Any]) -> PreparedModule:
        """A copy (EMA, validation and ``SaveTraced`` copy models) without the deprecation warning
        torch gives for the input structure of the graph ``torch.export`` made (torch's own)."""
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                                    category=FutureWarning)
            copied.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return copied

    @property
    def stage(self) -> str:
        """``"calibration"``, ``"qat"`` or ``"quantized"``; leaving calibration writes its ranges
        first and drops the calibration observers."""
        return self._stage

    @stage.setter
    def stage(self, stage: str) -> None:
        if getattr(self, "_stage", None) == "calibration" and stage != "calibration":
            if self.ranges_stale:
                self.update_ranges()
            for tap in self._taps:
                tap.remove()
            self._taps = []
            self.calibration = None
            self._applied = None
        self._stage = stage

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
        if self.ranges_stale and not self.observing:
            self.update_ranges()
        wanted = self._wanted()
        if wanted == self._applied:
            return
        train, observe, fake_quant = wanted
        if self._mode_ops and self._graph_training is not train:
            _set_graph_mode(self.graph, train)
            self._graph_training = train
        if self.stage != "quantized":
            ours = self.calibration if observe and self.stage == "calibration" else None
            for fq in self._fake_quantizers:
                # an observer of HAT's stands in for torchao's while calibrating
                fq.observer_enabled[0] = int(observe and not (ours is not None and ours.handles(fq)))
                fq.fake_quant_enabled[0] = int(fake_quant)
            if self.calibration is not None:
                self.calibration.set_recording(ours is not None)
            self._apply_averaging()
        self._applied = wanted

    def set_qconfig(self, qconfig: QConfig) -> None:
        """Use HAT's ``qconfig_params`` (as :func:`~hat_ignite.quantization.qconfig.parse_qconfig_params`
        checks them): the calibration observers and the averaging constants per stage and kind.

        The calibration observers are made afresh (what earlier ones saw is dropped).
        """
        self.set_averaging(qconfig.averaging)
        if self.stage == "calibration":
            self._install_observers(qconfig)

    def _install_observers(self, qconfig: QConfig) -> None:
        self.calibration = CalibrationObservers(
            _named_fake_quantizers(self.graph), qconfig.calibration_observer("activation"),
            qconfig.calibration_observer("weight"),
        )
        self._applied = None

    def commit_observations(self, reduce_device: torch.device | None = None) -> None:
        """Add what the calibration observers recorded since the last call to their statistics.

        Args:
            reduce_device: in a calibration of several processes, sum the recordings over the
                processes first (a collective every process makes at the same step), with
                tensors on this device; ``None``: this process's only.
        """
        if self.calibration is not None:
            self.calibration.commit(reduce_device)
        self.ranges_stale = True

    @torch.no_grad()
    def update_ranges(self) -> None:
        """Write the calibration observers' ranges into the fake-quantize modules, then their scales."""
        if self.stage == "calibration" and self.calibration is not None:
            self.calibration.write_ranges()
        self.refresh_qparams()
        self.ranges_stale = False

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
        """What this module was exported from, and what its observers observe, as checkpoints store
        it (see :mod:`~hat_ignite.quantization.record`)."""
        record = dict(self.record, path=self.qname, stage=self.stage)
        if self.observers:
            record["observers"] = dict(self.observers)
        return record

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._applied = None  # the loaded switches replace the applied ones: re-apply on forward
        self.ranges_stale = False  # the loaded ranges replace any not yet written
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
def observing(model: nn.Module, commit: bool = True) -> Iterator[list[PreparedModule]]:
    """Record activation ranges in every prepared module of ``model`` for the duration.

    Args:
        model: a model with prepared modules.
        commit: on exit, add the recordings to the observers' statistics and write the ranges
            and quantization parameters, so that what follows (validation, a checkpoint) sees
            the calibrated model. ``False`` (the ``Calibrator``'s steps): leave the recordings
            for :meth:`PreparedModule.commit_observations`; the ranges follow when next needed.
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
                m.ranges_stale = True
                if commit:
                    m.commit_observations()
                    m.update_ranges()
