"""HAT's quantization arguments on a conv-BN net: qat_mode, qconfig_params, convert_mode."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from hat_ignite.callbacks.checkpoint_io import atomic_save, with_content_hash
from hat_ignite.callbacks.checkpoint_state import LoadCheckpoint
from hat_ignite.errors import QuantizationError
from hat_ignite.models import ResNetClassifier
from hat_ignite.quantization import (
    CONVERT_MODES,
    Float2Calibration,
    Float2QAT,
    ModelConvertPipeline,
    QAT2Quantize,
    observing,
    prepared_modules,
)
from hat_ignite.registry import build_from_cfg


def small_resnet() -> ResNetClassifier:
    torch.manual_seed(0)
    model = ResNetClassifier(stem_channels=4, widths=(4, 8), blocks=1)
    with torch.no_grad():  # BatchNorm statistics that are not the identity, so folding shows
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.2, 0.2)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
    return model


def batch(n: int = 8, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"img": torch.rand(n, 1, 8, 8, generator=g), "labels": torch.randint(0, 10, (n,), generator=g)}


def graph_ops(model) -> set[str]:
    (prepared,) = prepared_modules(model)
    return {str(node.target) for node in prepared.graph.graph.nodes if node.op == "call_function"}


def train_steps(model, steps: int = 2, lr: float = 0.05) -> None:
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    for i in range(steps):
        losses, _ = model(batch(seed=10 + i))
        opt.zero_grad()
        losses["cls_loss"].backward()
        opt.step()


def fake_quantizers(model, per_channel: bool) -> list:
    (prepared,) = prepared_modules(model)
    return [fq for fq in prepared._fake_quantizers if fq.is_per_channel == per_channel]


# -- qat_mode ----------------------------------------------------------------------------------
def test_fuse_bn_folds_batchnorm_before_preparing_and_keeps_the_float_function():
    model = small_resnet().eval()
    x = batch()
    expected = model(x["img"])
    prepared = ModelConvertPipeline(
        converters=[Float2Calibration(example_inputs=x, modules=["net"])], qat_mode="fuse_bn",
    )(model)
    assert not any("batch_norm" in op for op in graph_ops(prepared))
    assert not any("running_mean" in key for key in prepared.state_dict())
    # every fused conv got a trainable bias from its BatchNorm
    names = [n for n, p in prepared.named_parameters() if p.requires_grad]
    assert len(names) == len(list(prepared.parameters())) and sum(n.endswith("_bias") for n in names) == 6
    with observing(prepared):  # fake quantization off: the float function, BatchNorm folded in
        assert torch.allclose(prepared.eval()(x["img"]), expected, atol=1e-5)
    # QAT trains the fused layers: nothing depends on batch statistics any more
    qat = Float2QAT(example_inputs=x, modules=["net"], qat_mode="fuse_bn")(small_resnet())
    train_steps(qat, steps=1)
    assert not any("batch_norm" in op for op in graph_ops(qat))


def test_with_bn_keeps_batchnorm_in_qat_with_batch_statistics():
    # (QAT2Quantize folds it into the int8 conv: torchao's conv-BN QAT pattern matching takes
    # ~30 s on a CPU even for one conv, so conversion is left to the stage tests)
    x = batch()
    qat = ModelConvertPipeline(
        converters=[Float2QAT(example_inputs=x, modules=["net"])], qat_mode="with_bn",
    )(small_resnet())
    assert any("batch_norm" in op for op in graph_ops(qat))
    stats = {k: v.clone() for k, v in qat.state_dict().items() if k.endswith("running_mean")}
    assert len(stats) == 6
    train_steps(qat, steps=1)
    moved = {k for k, v in qat.state_dict().items() if k in stats and not torch.equal(v, stats[k])}
    assert moved == set(stats)  # training updated the BatchNorm running statistics


def test_qat_mode_default_is_hats_fuse_bn_and_bad_values_are_refused():
    x = batch()
    default = ModelConvertPipeline(converters=[Float2Calibration(example_inputs=x, modules=["net"])])(small_resnet())
    assert not any("batch_norm" in op for op in graph_ops(default))
    with pytest.raises(QuantizationError, match=r"qat_mode='with_bn_reverse_fold' cannot be honoured .*'with_bn'"):
        ModelConvertPipeline(converters=[], qat_mode="with_bn_reverse_fold")
    with pytest.raises(QuantizationError, match=r"Float2QAT: qat_mode='fused'"):
        Float2QAT(example_inputs=x, qat_mode="fused")
    with pytest.raises(QuantizationError, match=r"has qat_mode='with_bn' but the pipeline has qat_mode='fuse_bn'"):
        ModelConvertPipeline(converters=[Float2QAT(example_inputs=x, qat_mode="with_bn")], qat_mode="fuse_bn")


def test_pipeline_qat_mode_reaches_config_converters_without_changing_the_given_object():
    conv = Float2Calibration(example_inputs=batch(), modules=["net"])
    pipeline = ModelConvertPipeline(converters=[conv], qat_mode="with_bn")
    assert conv.qat_mode is None and pipeline.converters[0].qat_mode == "with_bn"
    built = build_from_cfg(dict(
        type="ModelConvertPipeline", qat_mode="with_bn",
        converters=[dict(type="Float2QAT", example_inputs=batch(), modules=["net"])],
    ))
    assert built.converters[0].qat_mode == "with_bn"
    assert "qat_mode='with_bn'" in repr(built)


def test_hat_style_qat_pipeline_loads_the_calibration_checkpoint(tmp_path):
    """Float2QAT then LoadCheckpoint(calibration checkpoint), as HAT's qat stage does."""
    x = batch()
    calib = ModelConvertPipeline(converters=[Float2Calibration(example_inputs=x, modules=["net"])], qat_mode="fuse_bn")(small_resnet())
    with observing(calib), torch.no_grad():
        calib.eval()(x)
    path = tmp_path / "calibration.pth.tar"
    atomic_save(with_content_hash({"state_dict": calib.state_dict()}), str(path))
    qat = ModelConvertPipeline(
        converters=[Float2QAT(example_inputs=x, modules=["net"]), LoadCheckpoint(str(path))], qat_mode="fuse_bn",
    )(small_resnet())
    assert prepared_modules(qat)[0].stage == "qat"
    with torch.no_grad():
        assert torch.equal(qat.eval()(x["img"]), calib.eval()(x["img"]))
    with_bn = ModelConvertPipeline(converters=[Float2QAT(example_inputs=x, modules=["net"])], qat_mode="with_bn")(small_resnet())
    with pytest.raises(Exception, match="running_mean|missing|shape"):
        LoadCheckpoint(str(path))(with_bn)


# -- qconfig_params ----------------------------------------------------------------------------
def observed_ranges(fqs) -> list[torch.Tensor]:
    return [torch.cat([fq.activation_post_process.min_val.flatten(), fq.activation_post_process.max_val.flatten()]).clone() for fq in fqs]


def test_qat_averaging_constants_freeze_activation_ranges_and_track_weights():
    x = batch()

    def qat_model(qconfig_params):
        model = ModelConvertPipeline(
            converters=[Float2QAT(example_inputs=x, modules=["net"])], qconfig_params=qconfig_params,
        )(small_resnet())
        model.train()
        model(x)  # first step: every observer takes this batch's range
        return model

    frozen = qat_model(dict(activation_qat_qkwargs=dict(averaging_constant=0.0), weight_qat_qkwargs=dict(averaging_constant=1.0)))
    moving = qat_model(None)
    before_frozen = observed_ranges(fake_quantizers(frozen, per_channel=False))
    before_moving = observed_ranges(fake_quantizers(moving, per_channel=False))
    train_steps(frozen, steps=2)
    train_steps(moving, steps=2)
    after_frozen = observed_ranges(fake_quantizers(frozen, per_channel=False))
    after_moving = observed_ranges(fake_quantizers(moving, per_channel=False))
    assert all(torch.equal(a, b) for a, b in zip(before_frozen, after_frozen))  # averaging_constant=0
    assert not all(torch.equal(a, b) for a, b in zip(before_moving, after_moving))  # torchao's default 0.01
    # the constants are set on torchao's observers while the model is in the qat stage
    assert all(fq.activation_post_process.averaging_constant == 1.0 for fq in fake_quantizers(frozen, True))
    assert all(fq.activation_post_process.averaging_constant == 0.0 for fq in fake_quantizers(frozen, False))
    assert all(fq.activation_post_process.averaging_constant == 0.01 for fq in fake_quantizers(moving, True))


def test_calibration_averaging_constant_applies_in_the_calibration_stage_only():
    x = batch()
    model = ModelConvertPipeline(
        converters=[Float2Calibration(example_inputs=x, modules=["net"])],
        qconfig_params=dict(activation_calibration_observer="min_max", activation_calibration_qkwargs=dict(averaging_constant=1.0),
                            activation_qat_qkwargs=dict(averaging_constant=0.0)),
    )(small_resnet())
    acts = fake_quantizers(model, per_channel=False)
    with observing(model), torch.no_grad():
        model.eval()(x)
        assert all(fq.activation_post_process.averaging_constant == 1.0 for fq in acts)
        model(batch(seed=5))
    # averaging_constant=1: the range is exactly the last calibration batch's input range
    assert torch.equal(acts[0].activation_post_process.min_val, batch(seed=5)["img"].min())
    from hat_ignite.quantization import Calibration2QAT

    Calibration2QAT()(model).train()
    model(x)
    assert all(fq.activation_post_process.averaging_constant == 0.0 for fq in acts)


@pytest.mark.parametrize("params, match", [
    (dict(activation_qat_observer="mse"), r"\['activation_qat_observer'\]='mse' cannot be honoured: QAT runs torchao's fused"),
    (dict(weight_calibration_observer="kl"), r"'kl' cannot be honoured: weights are quantized per channel"),
    (dict(activation_calibration_observer="clip_std"), r"'clip_std' cannot be honoured: horizon's mean"),
    (dict(activation_calibration_qkwargs=dict(averaging_constant=0.01)), r"HAT's default activation_calibration_observer='mse'"),
    (dict(activation_calibration_observer="kl", activation_calibration_qkwargs=dict(percentile=99.9)),
     r"\['percentile'\] cannot be honoured: the activation calibration observer 'kl' takes \['bins', 'update_interval'\]"),
    (dict(activation_calibration_observer="percentile", activation_calibration_qkwargs=dict(bins=100)), r"from 256 to 65536"),
    (dict(weight_fake_quant="lsq"), r"\['weight_fake_quant'\]='lsq' cannot be honoured"),
    (dict(activation_qat_qkwargs=dict(averaging_constant=2)), r"averaging_constant'\] must be a number in \[0, 1\]"),
    (dict(weight_qat_qkwargs=dict(qscheme=torch.per_tensor_symmetric)), r"int8 per-channel symmetric weights"),
    (dict(activation_qat_qkwargs=dict(dtype="qint16")), r"\['dtype'\]='qint16' cannot be honoured"),
    (dict(activation_qat_qkwargs=dict(percentile=99.9)), r"\['percentile'\] cannot be honoured"),
    (dict(activation_observer="min_max"), r"'activation_observer', which is not one of HAT's qconfig arguments"),
])
def test_qconfig_params_that_cannot_be_honoured_are_refused_by_name(params, match):
    with pytest.raises(QuantizationError, match=match):
        ModelConvertPipeline(converters=[], qconfig_params=params)


def test_qconfig_params_hat_configs_use_are_accepted():
    pipeline = ModelConvertPipeline(converters=[], qat_mode="fuse_bn", qconfig_params=dict(
        activation_qat_qkwargs=dict(averaging_constant=0),
        weight_qat_qkwargs=dict(qscheme=torch.per_channel_symmetric, ch_axis=0, averaging_constant=1),
        activation_calibration_observer="min_max",
        weight_qat_observer="min_max",
        activation_fake_quant="fake_quant",
    ))
    assert pipeline.averaging == {"qat": {"activation": 0.0, "weight": 1.0}}


# -- convert_mode ------------------------------------------------------------------------------
def test_every_hat_convert_mode_is_the_same_export_flow():
    x = batch()
    outputs = []
    for mode in sorted(CONVERT_MODES):
        model = Float2QAT(example_inputs=x, modules=["net"], convert_mode=mode)(small_resnet())
        outputs.append(QAT2Quantize(convert_mode=mode)(model)(x["img"]))
    assert set(CONVERT_MODES) == {"eager", "fx", "jit", "jit-strip"}
    assert all(torch.equal(outputs[0], out) for out in outputs[1:])
    for who in (lambda: Float2Calibration(convert_mode="onnx"), lambda: QAT2Quantize(convert_mode="onnx")):
        with pytest.raises(QuantizationError, match=r"convert_mode='onnx' is not one of HAT's modes"):
            who()
    assert F.softmax(outputs[0], 1).shape == (8, 10)


def test_fuse_bn_exports_in_eval_form_but_dropout_still_trains():
    from hat_ignite.models import MLPClassifier

    torch.manual_seed(0)
    x = torch.rand(16, 8)
    model = Float2QAT(example_inputs=x, modules=["net"], qat_mode="fuse_bn")(
        MLPClassifier(in_features=8, hidden_features=16, num_classes=3, dropout=0.5)
    )
    model.train()
    assert not torch.equal(model.net(x), model.net(x))  # dropout active in QAT training
    model.eval()
    assert torch.equal(model.net(x), model.net(x))


def test_hat_converters_without_example_inputs_trace_with_the_engines_first_batch():
    """HAT's converter configs give no example inputs: an engine lends its data loader's first batch,
    and drawing it (a shuffling loader) leaves the run's random numbers as example inputs would;
    a converter outside an engine still says how to give them."""
    from torch.utils.data import DataLoader

    from hat_ignite.engine import BasicBatchProcessor, Calibrator, Predictor

    images = batch(n=16, seed=3)
    dataset = [{"img": images["img"][i], "labels": images["labels"][i]} for i in range(16)]

    def calibrator(example_inputs):
        converter = dict(type="Float2Calibration", convert_mode="eager", modules=["net"])
        if example_inputs is not None:
            converter["example_inputs"] = example_inputs
        model = small_resnet()
        torch.manual_seed(7)
        engine = Calibrator(model=model, data_loader=DataLoader(dataset, batch_size=8, shuffle=True),
                            model_convert_pipeline=dict(type="ModelConvertPipeline", converters=[converter]),
                            batch_processor=BasicBatchProcessor(need_grad_update=False), device=None, num_steps=2)
        return engine, torch.get_rng_state()

    lent, rng_after_lent = calibrator(None)
    given, rng_after_given = calibrator(batch(n=8, seed=4))
    assert torch.equal(rng_after_lent, rng_after_given)
    assert [m.stage for m in prepared_modules(lent.model)] == ["calibration"]
    lent.fit()
    predictor = Predictor(model=small_resnet(), data_loader=[DataLoader(dataset, batch_size=8)] * 2,
                          model_convert_pipeline=[Float2Calibration(modules=["net"])],
                          batch_processor=BasicBatchProcessor(need_grad_update=False), device=None)
    assert len(prepared_modules(predictor.model)) == 1  # several loaders: the first one's batch
    with pytest.raises(QuantizationError, match=r"Float2QAT: give example_inputs .* no data_loader"):
        Float2QAT(modules=["net"])(small_resnet())
