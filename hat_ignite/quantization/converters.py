"""HAT's model converters over torchao's PT2E flow: float -> calibration -> QAT -> int8.

Each converter is a small callable ``model -> model`` for ``model_convert_pipeline``:

======================  =======================================================================
converter               does
======================  =======================================================================
Float2Calibration       ``torch.export`` the model (or ``modules``) in training mode, then
                        ``prepare_qat_pt2e`` with the X86 inductor quantizer (conv+BN folded
                        into the QAT pattern), in the *calibration* stage
Float2QAT               the same, in the *qat* stage (QAT without calibrating first)
Calibration2QAT         switch prepared modules from calibration to QAT
QAT2Quantize            ``convert_pt2e``: int8 weights, quantize/dequantize around the ops
Calibration2Quantize    the same converter under HAT's name for the calibration -> int8 path
======================  =======================================================================

Calibration and QAT share one prepared structure (fake-quantize modules with observers), so a
calibrated model goes on to QAT with its calibrated ranges, and a checkpoint of either stage
loads into the model prepared again (see :class:`~.prepared.PreparedModule`).
torchao is imported only when a converter runs.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Sequence

from torch import nn

from hat_ignite.errors import QuantizationError
from hat_ignite.quantization.capture import Captured, export_module
from hat_ignite.quantization.module_calls import tag_module_calls
from hat_ignite.quantization.observer_match import uncalled_modules
from hat_ignite.quantization.inductor import InductorRunner, inductor_enabled
from hat_ignite.quantization.prepared import PreparedModule, prepared_modules
from hat_ignite.quantization.qconfig import check_convert_mode, check_qat_mode
from hat_ignite.quantization.record import prepared_record
from hat_ignite.quantization.stubs import StubBoundaries, remove_markers, stub_markers
from hat_ignite.quantization.targets import check_called, find_targets
from hat_ignite.quantization.timed import timed
from hat_ignite.quantization.torchao_import import import_torchao
from hat_ignite.quantization.used_inputs import unused_entries, without_entries

if TYPE_CHECKING:  # pragma: no cover
    from torch.fx import GraphModule

__all__ = [
    "default_quantizer",
    "Float2Calibration",
    "Float2QAT",
    "Calibration2QAT",
    "QAT2Quantize",
    "Calibration2Quantize",
]

logger = logging.getLogger(__name__)


def default_quantizer(reduce_range: bool = False) -> Any:
    """torchao's ``X86InductorQuantizer`` with its default QAT config (int8 per-channel weights,
    uint8 per-tensor activations). ``reduce_range=True`` uses 7-bit activations for CPUs without VNNI."""
    import_torchao()
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    config = get_default_x86_inductor_quantization_config(is_qat=True, reduce_range=reduce_range)
    return X86InductorQuantizer().set_global(config)


def _replace(model: nn.Module, old: nn.Module, new: nn.Module) -> nn.Module:
    """Put ``new`` where ``old`` is inside ``model`` (or return ``new`` when ``old`` is the model)."""
    if old is model:
        return new
    for name, module in model.named_modules():
        for child_name, child in module.named_children():
            if child is old:
                setattr(module, child_name, new)
                return model
    raise QuantizationError(f"internal: {type(old).__name__} is not inside {type(model).__name__}.")


def _fold_batch_norms(graph: GraphModule) -> None:
    """Fold every BatchNorm that follows a conv or linear in an eval-form exported graph into its
    weights (torchao's passes), and drop the folded BatchNorms' parameters and statistics."""
    import_torchao()
    from torchao.quantization.pt2e.utils import _fuse_conv_bn_, _fuse_linear_bn_

    before = dict(graph.named_parameters())
    trains = any(p.requires_grad for p in before.values())
    read = _read_attributes(graph)
    _fuse_conv_bn_(graph)
    _fuse_linear_bn_(graph)
    # the folded BatchNorms' tensors go; a module built but not called keeps its weights, as the
    # checkpoints of a model that calls it hold them (HAT's deploy models build such heads)
    _drop_unused_weights(graph, only=read - _read_attributes(graph))
    for name, param in graph.named_parameters():
        if name not in before:  # the bias a bias-free layer got from its BatchNorm trains as it did
            param.requires_grad_(trains)


def _set_child(model: nn.Module, path: str, new: nn.Module) -> nn.Module:
    if not path:
        return new
    parent_path, _, leaf = path.rpartition(".")
    setattr(model.get_submodule(parent_path) if parent_path else model, leaf, new)
    return model


class _Prepare:
    """Export and prepare a float model (or the submodules named in ``modules``)."""

    stage = "calibration"

    def __init__(
        self,
        example_inputs: Any = None,
        example_data_loader: Any = None,
        modules: Sequence[str] | None = None,
        quantizer: Any = None,
        reduce_range: bool = False,
        convert_mode: str = "eager",
        qat_mode: str | None = None,
    ) -> None:
        who = type(self).__name__
        self.convert_mode = check_convert_mode(convert_mode, who)
        self.qat_mode = None if qat_mode is None else check_qat_mode(qat_mode, who)
        if isinstance(modules, str):
            modules = [modules]
        self.example_inputs = example_inputs
        self.example_data_loader = example_data_loader
        #: the dotted names given (``None``: chosen when the converter runs, see :mod:`~.targets`)
        self.modules: list[str] | None = list(modules) if modules else None
        self.quantizer = quantizer
        self.reduce_range = reduce_range

    def __call__(self, model: nn.Module) -> nn.Module:
        who = type(self).__name__
        if not isinstance(model, nn.Module):
            raise QuantizationError(f"{who}: expected a torch.nn.Module, got {type(model).__name__}.")
        already = prepared_modules(model)
        if already:
            raise QuantizationError(
                f"{who}: the model is already prepared ({already[0].where()} is in stage "
                f"{already[0].stage!r}). Prepare a float model once; use Calibration2QAT or "
                f"QAT2Quantize to move a prepared model on."
            )
        import_torchao()
        qat_mode = check_qat_mode(self.qat_mode, who)
        targets = find_targets(model, self.example_inputs, self.example_data_loader, self.modules, who)
        quantizer = self.quantizer if self.quantizer is not None else default_quantizer(self.reduce_range)
        for path in targets.modules:
            module = model.get_submodule(path) if path else model
            with timed(logger, "%s: preparing %s (%s) for int8, stage %s, qat_mode %s", who, path or "the model",
                       type(module).__name__, self.stage, qat_mode):
                model = self._prepare_one(model, path, module, targets.inputs[path], targets.described,
                                          quantizer, qat_mode, who)
        check_called(model, targets.batches, who)
        return model

    def _prepare_one(self, model: nn.Module, path: str, module: nn.Module, inputs: Captured, batches: list[Any],
                     quantizer: Any, qat_mode: str, who: str) -> nn.Module:
        """Export ``module`` (at ``path`` in ``model``) on ``inputs``, prepare it, and put it in place."""
        from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e

        fuse_bn = qat_mode == "fuse_bn"
        args, kwargs, varying = inputs
        modes = {m: m.training for m in module.modules()}
        # fuse_bn: BN folded with its running statistics, so the graph is exported in eval
        # form; with_bn: prepare_qat_pt2e rewrites the training graph's conv-BN into its QAT pattern
        module.train(not fuse_bn)
        try:
            with stub_markers(module) as stubs:  # HAT's QuantStub / DeQuantStub bound the int8 part
                program = export_module(module, args, kwargs, path, who, varying)
                unused = unused_entries(program, args, kwargs)
                if unused:  # e.g. a deploy model's "labels": the graph takes only what it uses
                    logger.info("%s: %s does not use %s of its input; its graph takes the rest.", who,
                                path or "the model", ", ".join(repr(k) for keys in unused.values() for k in keys))
                    args = without_entries(args, unused)
                    program = export_module(module, args, kwargs, path, who, varying)
        finally:
            for m, training in modes.items():
                m.training = training
        graph = program.module()
        uncalled = uncalled_modules(module, graph)
        tag_module_calls(graph)  # each call of a shared module quantized on its own
        if fuse_bn:
            _fold_batch_norms(graph)
        try:
            graph = prepare_qat_pt2e(graph, StubBoundaries(quantizer) if stubs else quantizer)
        except Exception as exc:
            raise QuantizationError(
                f"{who}: the quantizer could not prepare {path or 'the model'!r} "
                f"({type(module).__name__}): {type(exc).__name__}: {exc}"
            ) from exc
        remove_markers(graph)
        record = prepared_record(path, self.stage, qat_mode, Captured(args, kwargs, varying))
        if batches:
            record["batches"] = batches  # the model's own inputs: an export-only stage runs its model on them
        prepared = PreparedModule(graph, self.stage, path, graph_training=not fuse_bn, record=record)
        prepared.uncalled = uncalled
        prepared.initialize_shapes(args, kwargs)
        prepared.train(module.training)
        return _set_child(model, path, prepared)

    def __repr__(self) -> str:
        extra = f", qat_mode={self.qat_mode!r}" if self.qat_mode is not None else ""
        return f"{type(self).__name__}(modules={self.modules!r}{extra})"


class Float2Calibration(_Prepare):
    """Float model -> calibration model: observers record activation ranges, nothing is quantized yet.

    The model runs once in eval mode on an example batch to record what each target module
    receives; each target is exported with ``torch.export`` (batch dimension dynamic) and
    prepared with ``prepare_qat_pt2e``. Calibrate it with a
    :class:`~hat_ignite.engine.calibrator.Calibrator`; in eval mode outside calibration it
    runs fake-quantized, which is what validation measures.

    Args:
        example_inputs: a batch exactly as the model receives it (a list/tuple batch is
            unpacked into the call, anything else passed whole).
        example_data_loader: a loader (or its config) whose first batch is used instead, after
            the engine's batch transforms. Neither given: the engine's first batch, or in a stage
            without data the inputs recorded in the checkpoint loaded after this converter (see
            :mod:`~hat_ignite.quantization.examples`).
        modules: dotted names of the submodules to quantize. ``None`` (HAT's configs): the
            modules prepared in the checkpoint that a later ``LoadCheckpoint`` of the pipeline
            loads, if it records any; else the whole model when it runs alike in training and
            eval; else (a model computing its loss in ``forward``, HAT's convention) its outermost
            submodules with weights that do, the rest (the loss) staying in float (see
            :mod:`~hat_ignite.quantization.select`).
        quantizer: a torchao PT2E ``Quantizer`` (default :func:`default_quantizer`).
        reduce_range: use 7-bit activations (for CPUs without VNNI), default quantizer only.
        convert_mode: HAT's ``"eager"`` (default), ``"fx"``, ``"jit"`` or ``"jit-strip"``: each is
            the one ``torch.export`` + ``prepare_qat_pt2e`` flow here (HAT's eager mode also calls
            ``model.fuse_model()``; here ``qat_mode`` decides BatchNorm folding); other values raise.
        qat_mode: ``"fuse_bn"`` (HAT's default, used when ``None``): every BatchNorm following a
            conv/linear is folded into it with its running statistics before preparing, and
            training goes on with the fused layers. ``"with_bn"``: BatchNorm stays, as torchao's
            QAT conv-BN pattern (batch statistics in training, folded into the int8 weights by
            ``QAT2Quantize``). A ``ModelConvertPipeline(qat_mode=...)`` sets it for its converters.
            Calibration and QAT checkpoints load only into a model prepared with the same mode.

    Example:
        >>> import torch
        >>> from hat_ignite.models import MLPClassifier
        >>> model = MLPClassifier(in_features=4, hidden_features=8, num_classes=3)
        >>> model = Float2Calibration(example_inputs=torch.rand(5, 4), modules=["net"])(model)
        >>> type(model.net).__name__, model.net.stage
        ('PreparedModule', 'calibration')
        >>> tuple(model.eval()(torch.rand(7, 4)).shape)   # any batch size
        (7, 3)
    """

    stage = "calibration"


class Float2QAT(_Prepare):
    """Float model -> QAT model (fake quantization in training), without calibrating first.

    Takes :class:`Float2Calibration`'s arguments. The observers start from the first training
    batches; calibrating first (``Float2Calibration`` then ``Calibration2QAT``) usually starts
    QAT closer to the float accuracy.
    """

    stage = "qat"


def _require_prepared(model: nn.Module, who: str, fix: str) -> list[PreparedModule]:
    mods = prepared_modules(model)
    if not mods:
        raise QuantizationError(
            f"{who}: {type(model).__name__} was never prepared for quantization (it has no module "
            f"made by Float2Calibration or Float2QAT). {fix}"
        )
    done = [m for m in mods if m.stage == "quantized"]
    if done:
        raise QuantizationError(f"{who}: {done[0].where()} is already an int8 model; there is nothing left to convert.")
    return mods


class Calibration2QAT:
    """Calibration model -> QAT model: keep the calibrated ranges, train through fake quantization.

    Put it after ``Float2Calibration`` and the ``LoadCheckpoint`` of the calibration checkpoint.

    Raises:
        QuantizationError: the model was never prepared, or is already int8.
    """

    def __call__(self, model: nn.Module) -> nn.Module:
        for m in _require_prepared(
            model, "Calibration2QAT",
            "Put Float2Calibration (and LoadCheckpoint of the calibration checkpoint) before "
            "Calibration2QAT, or use Float2QAT on a float model.",
        ):
            m.stage = "qat"
            m._applied = None
        return model

    def __repr__(self) -> str:
        return "Calibration2QAT()"


def _read_attributes(graph: GraphModule) -> set[str]:
    """The parameters, buffers and attributes the graph reads (and uses)."""
    return {str(node.target) for node in graph.graph.nodes if node.op == "get_attr" and node.users}


def _drop_unused_weights(graph: GraphModule, only: set[str] | None = None) -> int:
    """Delete parameters and buffers the converted graph no longer reads (the float weights), or
    of those ``only`` the ones it no longer reads."""
    used = _read_attributes(graph)
    dropped = 0
    for kind in ("parameters", "buffers"):
        for name, _ in list(getattr(graph, f"named_{kind}")()):
            if name not in used and (only is None or name in only):
                owner_path, _, leaf = name.rpartition(".")
                owner = graph.get_submodule(owner_path) if owner_path else graph
                delattr(owner, leaf)
                dropped += 1
    if only is None:
        graph.delete_all_unused_submodules()
    return dropped


class QAT2Quantize:
    """Calibrated or QAT model -> int8 model with torchao's ``convert_pt2e``.

    Weights become int8 tensors (per-channel scales), activations are quantized to uint8 around
    each quantized op; the float weights are dropped. In eval mode the graph runs on inductor's
    int8 kernels, compiled at its first call (where that cannot be built: as converted, and a log
    line says why; see ``hat_ignite.quantization.inductor``). Exports take the graph as converted.

    Args:
        convert_mode: HAT's ``"eager"``, ``"fx"``, ``"jit"`` or ``"jit-strip"``: all are the one
            ``convert_pt2e`` conversion here (see :data:`~hat_ignite.quantization.qconfig.CONVERT_MODES`);
            any other value raises.
        inductor: run the int8 graphs through inductor (``True``) or as converted (``False``);
            ``None`` (default): on unless the environment variable ``HAT_IGNITE_INT8_INDUCTOR``
            is ``0``.

    Raises:
        QuantizationError: the model was never prepared, or is already int8.
    """

    def __init__(self, convert_mode: str = "eager", inductor: bool | None = None) -> None:
        self.convert_mode = check_convert_mode(convert_mode, type(self).__name__)
        self.inductor = inductor

    def __call__(self, model: nn.Module) -> nn.Module:
        import_torchao()
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

        who = type(self).__name__
        for m in _require_prepared(
            model, who, "Put Float2Calibration (or Float2QAT) and the LoadCheckpoint of the "
            "calibration or QAT checkpoint before it.",
        ):
            m.eval()
            m.observing = False
            m._apply_switches()  # graph in eval mode, observers frozen
            m.refresh_qparams()
            with timed(logger, "%s: converting %s to int8", who, m.qname or "the model"):
                converted = convert_pt2e(m.graph)
                _drop_unused_weights(converted)
            quantized = PreparedModule(converted, "quantized", m.qname, graph_training=False, record=m.record)
            quantized.input_keys = m.input_keys
            quantized.inductor = InductorRunner(f"the int8 module {m.qname!r}" if m.qname else "the int8 model",
                                                enabled=inductor_enabled(self.inductor))
            model = _replace(model, m, quantized.eval())
        return model.eval()

    def __repr__(self) -> str:
        return f"{type(self).__name__}()" if self.inductor is None else f"{type(self).__name__}(inductor={self.inductor})"


class Calibration2Quantize(QAT2Quantize):
    """Calibration model -> int8 model (post-training quantization); see :class:`QAT2Quantize`."""
