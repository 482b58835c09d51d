"""What the virtual ``hat`` package serves: HAT module name -> the names it re-exports from hat-ignite.

Each entry maps a ``hat.*`` module that HAT configs and user callback files import from to
``{name: "hat_ignite.module:attribute"}``. Names are imported when first used, so importing
``hat.engine`` imports nothing heavy. A module listed here with a dotted child listed too
(``hat.engine`` and ``hat.engine.processors``) also serves the child as an attribute.

Importing this table imports nothing.
"""

from __future__ import annotations

__all__ = ["HAT_MODULES", "MODEL_ZOO_PREFIXES", "HELPER_PREFIXES"]

_ENGINE = {
    "LoopBase": "hat_ignite.engine.loop:LoopBase",
    "Trainer": "hat_ignite.engine.trainer:Trainer",
    "Predictor": "hat_ignite.engine.predictor:Predictor",
    "Calibrator": "hat_ignite.engine.calibrator:Calibrator",
    "DistributedDataParallelTrainer": "hat_ignite.engine.ddp_trainer:DistributedDataParallelTrainer",
    "DataParallelTrainer": "hat_ignite.engine.ddp_trainer:DataParallelTrainer",
    "build_launcher": "hat_ignite.engine.launcher:build_launcher",
    "Inference": "hat_ignite.engine.inference:Inference",
}
_PROCESSORS = {
    "BatchProcessorMixin": "hat_ignite.engine.processors.base:BatchProcessorMixin",
    "BasicBatchProcessor": "hat_ignite.engine.processors.basic:BasicBatchProcessor",
    "MultiBatchProcessor": "hat_ignite.engine.processors.multi:MultiBatchProcessor",
    "collect_loss_by_index": "hat_ignite.engine.processors.loss_collectors:collect_loss_by_index",
    "collect_loss_by_regex": "hat_ignite.engine.processors.loss_collectors:collect_loss_by_regex",
}
_LOSS_COLLECTORS = {k: v for k, v in _PROCESSORS.items() if k.startswith("collect_")}
_LR_UPDATERS = {
    name: f"hat_ignite.callbacks.lr_updater:{name}"
    for name in (
        "StepDecayLrUpdater", "CosLrUpdater", "CosineAnnealingLrUpdater", "PolyLrUpdater", "OneCycleUpdater",
        "CyclicLrUpdater", "NoamLrUpdater",
    )
}
_LR_UPDATERS["LrUpdaterBase"] = "hat_ignite.callbacks.lr_updater_base:LrUpdaterBase"
_CALLBACK_MODULES: dict[str, dict[str, str]] = {
    "hat.callbacks.callbacks": {"CallbackMixin": "hat_ignite.callbacks.base:CallbackMixin"},
    "hat.callbacks.checkpoint": {
        "Checkpoint": "hat_ignite.callbacks.checkpoint:Checkpoint",
        "LoadCheckpoint": "hat_ignite.checkpoint.restore:LoadCheckpoint",
    },
    "hat.callbacks.lr_updater": _LR_UPDATERS,
    "hat.callbacks.metric_updater": {
        "MetricUpdater": "hat_ignite.callbacks.metric_updater:MetricUpdater",
        "update_metric_using_regex": "hat_ignite.callbacks.metric_update_funcs:update_metric_using_regex",
        "update_metric_using_index": "hat_ignite.callbacks.metric_update_funcs:update_metric_using_index",
    },
    "hat.callbacks.monitor": {"StatsMonitor": "hat_ignite.callbacks.stats_monitor:StatsMonitor"},
    "hat.callbacks.validation": {"Validation": "hat_ignite.callbacks.validation:Validation"},
    "hat.callbacks.mean_teacher": {"MeanTeacherValidation": "hat_ignite.callbacks.validation:MeanTeacherValidation"},
    "hat.callbacks.exponential_moving_average": {
        "ExponentialMovingAverage": "hat_ignite.callbacks.ema:ExponentialMovingAverage",
    },
    "hat.callbacks.freeze_bn": {
        "FreezeBNStatistics": "hat_ignite.callbacks.freeze:FreezeBNStatistics",
        "FreezeModule": "hat_ignite.callbacks.freeze:FreezeModule",
    },
    "hat.callbacks.grad_scale": {"GradScale": "hat_ignite.callbacks.grad_scale:GradScale"},
    "hat.callbacks.tensorboard": {"TensorBoard": "hat_ignite.callbacks.tensorboard:TensorBoard"},
    "hat.callbacks.save_traced": {"SaveTraced": "hat_ignite.callbacks.save_traced:SaveTraced"},
    "hat.callbacks.online_model_trick": {
        "FreezeModule": "hat_ignite.callbacks.freeze:FreezeModule",
        "FuseBN": "hat_ignite.callbacks.fuse_bn:FuseBN",
    },
    "hat.callbacks.param_updater": {
        name: f"hat_ignite.callbacks.param_updater:{name}"
        for name in (
            "OptimParamUpdaterBase", "StepDecayOptimParamUpdater", "CosOptimParamUpdater", "CyclicOptimParamUpdater",
        )
    },
    "hat.callbacks.dump_data": {"DumpData": "hat_ignite.callbacks.dump_data:DumpData"},
}
_CALLBACK_MODULES["hat.callbacks.mean_teacher"]["MeanTeacher"] = "hat_ignite.callbacks.mean_teacher:MeanTeacher"
_CALLBACK_MODULES["hat.callbacks.validation"]["MeanTeacherValidation"] = (
    "hat_ignite.callbacks.validation:MeanTeacherValidation"
)
_CALLBACKS = {name: path for names in _CALLBACK_MODULES.values() for name, path in names.items()}
# Module constants HAT's callback modules export beside their class (not in ``hat.callbacks``).
_CALLBACK_MODULES["hat.callbacks.save_traced"]["DEPLOY_FILE_FORMAT"] = (
    "hat_ignite.callbacks.save_traced:DEPLOY_FILE_FORMAT"
)
_CALLBACKS["FuseBN"] = "hat_ignite.callbacks.fuse_bn:FuseBN"
_METRICS = {
    "EvalMetric": "hat_ignite.metrics.base:EvalMetric",
    "Accuracy": "hat_ignite.metrics.classification:Accuracy",
    "TopKAccuracy": "hat_ignite.metrics.classification:TopKAccuracy",
    "LossShow": "hat_ignite.metrics.loss:LossShow",
    "MeanIOU": "hat_ignite.metrics.segmentation:MeanIOU",
    "MeanIoU": "hat_ignite.metrics.segmentation:MeanIoU",
    "MeanAveragePrecision": "hat_ignite.metrics.average_precision:MeanAveragePrecision",
}
_CONVERTERS = {
    "ModelConvertPipeline": "hat_ignite.quantization.pipeline:ModelConvertPipeline",
    "TorchCompile": "hat_ignite.engine.compile:TorchCompile",
    "Torch2Compile": "hat_ignite.engine.compile:Torch2Compile",
    "LoadCheckpoint": "hat_ignite.checkpoint.restore:LoadCheckpoint",
    **{
        name: f"hat_ignite.quantization.converters:{name}"
        for name in ("Float2Calibration", "Float2QAT", "Calibration2QAT", "QAT2Quantize", "Calibration2Quantize")
    },
}
_MULTITASK_LOADER = "hat_ignite.data.multitask:MultitaskLoader"
_REGISTRY = {
    "Registry": "hat_ignite.registry:Registry",
    "OBJECT_REGISTRY": "hat_ignite.registry:OBJECT_REGISTRY",
    "build_from_cfg": "hat_ignite.hat_compat:hat_build_from_cfg",
    "build_from_registry": "hat_ignite.hat_compat:build_from_registry",
}

#: ``hat.*`` module -> ``{name: "hat_ignite.module:attribute"}``.
HAT_MODULES: dict[str, dict[str, str]] = {
    "hat": {"__version__": "hat_ignite:__version__"},
    "hat.registry": _REGISTRY,
    "hat.engine": _ENGINE,
    "hat.engine.trainer": {"Trainer": _ENGINE["Trainer"]},
    "hat.engine.predictor": {"Predictor": _ENGINE["Predictor"], "launch": "hat_ignite.engine.launcher:launch_distributed"},
    "hat.engine.calibrator": {"Calibrator": _ENGINE["Calibrator"]},
    "hat.engine.inference": {"Inference": _ENGINE["Inference"]},
    "hat.engine.loop_base": {"LoopBase": _ENGINE["LoopBase"], "PipeBase": "hat_ignite.engine.pipe:PipeBase"},
    "hat.engine.ddp_trainer": {
        "DistributedDataParallelTrainer": _ENGINE["DistributedDataParallelTrainer"],
        "launch": "hat_ignite.engine.launcher:launch_distributed",
    },
    "hat.engine.dp_trainer": {
        "DataParallelTrainer": _ENGINE["DataParallelTrainer"],
        "launch": "hat_ignite.engine.launcher:launch_data_parallel",
    },
    "hat.engine.launcher": {
        "build_launcher": _ENGINE["build_launcher"],
        "register_launcher": "hat_ignite.engine.launcher:register_launcher",
    },
    "hat.engine.processors": _PROCESSORS,
    "hat.engine.processors.processor": {k: v for k, v in _PROCESSORS.items() if not k.startswith("collect_")},
    "hat.engine.processors.loss_collector": _LOSS_COLLECTORS,
    "hat.callbacks": _CALLBACKS,
    **_CALLBACK_MODULES,
    "hat.metrics": _METRICS,
    "hat.metrics.metric": {"EvalMetric": _METRICS["EvalMetric"]},
    "hat.metrics.acc": {k: _METRICS[k] for k in ("Accuracy", "TopKAccuracy")},
    "hat.metrics.loss_show": {"LossShow": _METRICS["LossShow"]},
    "hat.metrics.mean_iou": {"MeanIOU": _METRICS["MeanIOU"]},
    "hat.core": {},
    "hat.core.task_sampler": {"TaskSampler": "hat_ignite.engine.task_sampler:TaskSampler"},
    "hat.core.event": {"EventStorage": "hat_ignite.engine.state:EventStorage"},
    "hat.data": {},
    "hat.data.dataloaders": {"MultitaskLoader": _MULTITASK_LOADER},
    "hat.data.dataloaders.multitask_loader": {"MultitaskLoader": _MULTITASK_LOADER},
    "hat.models": {},
    "hat.models.model_convert": _CONVERTERS,
    "hat.models.model_convert.converters": {k: v for k, v in _CONVERTERS.items() if k != "ModelConvertPipeline"},
    "hat.models.model_convert.pipelines": {"ModelConvertPipeline": _CONVERTERS["ModelConvertPipeline"]},
    "hat.utils": {},
    "hat.utils.config": {
        "Config": "hat_ignite.config:Config",
        "ConfigVersion": "hat_ignite.config:ConfigVersion",
    },
    "hat.utils.distributed": {
        name: f"hat_ignite.hat_compat:{name}" for name in ("get_dist_info", "rank_zero_only")
    },
    "hat.utils.apply_func": {
        "_as_list": "hat_ignite.hat_compat:as_list",
        "apply_to_collection": "hat_ignite.hat_compat:apply_to_collection",
        "to_flat_ordered_dict": "hat_ignite.engine.processors.loss_collectors:to_flat_ordered_dict",
        "to_cuda": "hat_ignite.hat_compat:to_cuda",
        "flatten": "hat_ignite.hat_utils:flatten",
        "regroup": "hat_ignite.hat_utils:regroup",
    },
    "hat.utils.logger": {
        **{name: f"hat_ignite.hat_compat:{name}" for name in ("rank_zero_info", "MSGColor", "format_msg")},
        "init_logger": "hat_ignite.hat_utils:init_logger",
    },
    "hat.utils.seed": {"seed_everything": "hat_ignite.hat_utils:seed_everything"},
    "hat.utils.model_helpers": {
        name: f"hat_ignite.hat_utils:{name}" for name in ("get_binding_module", "has_normalization")
    },
    "hat.utils.hash": {"get_hash_file_if_hashed_and_local": "hat_ignite.hat_utils:get_hash_file_if_hashed_and_local"},
    "hat.utils.package_helper": {"check_packages_available": "hat_ignite.hat_utils:check_packages_available"},
}

#: HAT packages of models, data and ops that hat-ignite does not provide: what to do instead.
MODEL_ZOO_PREFIXES: dict[str, str] = {
    "hat.models": "HAT's model zoo",
    "hat.data": "HAT's datasets, transforms and collates",
    "hat.core": "HAT's task utilities",
    "hat.metrics": "HAT's task metrics",
    "hat.callbacks": "HAT's task callbacks",
    "hat.utils": "HAT's utilities",
    "hat": "HAT",
}

#: HAT packages of helper functions and data structures (imported, never config types): a name
#: missing there is defined in a module of one's own, with nothing to register.
HELPER_PREFIXES: tuple[str, ...] = ("hat.utils", "hat.core")
