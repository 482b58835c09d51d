"""The table of built-in registered names: HAT name -> ``"module:attribute"`` import path.

Kept apart from :mod:`hat_ignite.registry` so adding a component is a one-line change here and
importing the table imports nothing else.
"""

from __future__ import annotations

__all__ = ["BUILTIN_OBJECTS", "HAT_ALIASES", "NOT_PROVIDED"]

#: Built-in registered names -> ``"module:attribute"`` import paths, imported lazily on lookup.
BUILTIN_OBJECTS: dict[str, str] = {
    # engines and batch processors
    "LoopBase": "hat_ignite.engine.loop:LoopBase",
    "Trainer": "hat_ignite.engine.trainer:Trainer",
    "Predictor": "hat_ignite.engine.predictor:Predictor",
    "Inference": "hat_ignite.engine.inference:Inference",
    "DistributedDataParallelTrainer": "hat_ignite.engine.ddp_trainer:DistributedDataParallelTrainer",
    "DataParallelTrainer": "hat_ignite.engine.ddp_trainer:DataParallelTrainer",
    "TaskSampler": "hat_ignite.engine.task_sampler:TaskSampler",
    "BasicBatchProcessor": "hat_ignite.engine.processors.basic:BasicBatchProcessor",
    "MultiBatchProcessor": "hat_ignite.engine.processors.multi:MultiBatchProcessor",
    "collect_loss_by_index": "hat_ignite.engine.processors.loss_collectors:collect_loss_by_index",
    "collect_loss_by_regex": "hat_ignite.engine.processors.loss_collectors:collect_loss_by_regex",
    # callbacks
    "CallbackMixin": "hat_ignite.callbacks.base:CallbackMixin",
    "Checkpoint": "hat_ignite.callbacks.checkpoint:Checkpoint",
    "LoadCheckpoint": "hat_ignite.checkpoint.restore:LoadCheckpoint",
    "StatsMonitor": "hat_ignite.callbacks.stats_monitor:StatsMonitor",
    "MetricUpdater": "hat_ignite.callbacks.metric_updater:MetricUpdater",
    "StepDecayLrUpdater": "hat_ignite.callbacks.lr_updater:StepDecayLrUpdater",
    "CosLrUpdater": "hat_ignite.callbacks.lr_updater:CosLrUpdater",
    "CosineAnnealingLrUpdater": "hat_ignite.callbacks.lr_updater:CosineAnnealingLrUpdater",
    "PolyLrUpdater": "hat_ignite.callbacks.lr_updater:PolyLrUpdater",
    "OneCycleUpdater": "hat_ignite.callbacks.lr_updater:OneCycleUpdater",
    "CyclicLrUpdater": "hat_ignite.callbacks.lr_updater:CyclicLrUpdater",
    "NoamLrUpdater": "hat_ignite.callbacks.lr_updater:NoamLrUpdater",
    "StepDecayOptimParamUpdater": "hat_ignite.callbacks.param_updater:StepDecayOptimParamUpdater",
    "CosOptimParamUpdater": "hat_ignite.callbacks.param_updater:CosOptimParamUpdater",
    "CyclicOptimParamUpdater": "hat_ignite.callbacks.param_updater:CyclicOptimParamUpdater",
    "Validation": "hat_ignite.callbacks.validation:Validation",
    "MeanTeacherValidation": "hat_ignite.callbacks.validation:MeanTeacherValidation",
    "ExponentialMovingAverage": "hat_ignite.callbacks.ema:ExponentialMovingAverage",
    "FreezeModule": "hat_ignite.callbacks.freeze:FreezeModule",
    "FreezeBNStatistics": "hat_ignite.callbacks.freeze:FreezeBNStatistics",
    "FuseBN": "hat_ignite.callbacks.fuse_bn:FuseBN",
    "GradScale": "hat_ignite.callbacks.grad_scale:GradScale",
    "TensorBoard": "hat_ignite.callbacks.tensorboard:TensorBoard",
    "SaveTraced": "hat_ignite.callbacks.save_traced:SaveTraced",
    "MeanTeacher": "hat_ignite.callbacks.mean_teacher:MeanTeacher",
    "DumpData": "hat_ignite.callbacks.dump_data:DumpData",
    # metrics
    "Accuracy": "hat_ignite.metrics.classification:Accuracy",
    "TopKAccuracy": "hat_ignite.metrics.classification:TopKAccuracy",
    "LossShow": "hat_ignite.metrics.loss:LossShow",
    "MeanIoU": "hat_ignite.metrics.segmentation:MeanIoU",
    "MeanIOU": "hat_ignite.metrics.segmentation:MeanIOU",  # HAT's spelling of MeanIoU
    "MeanAveragePrecision": "hat_ignite.metrics.average_precision:MeanAveragePrecision",
    "MetricAdapter": "hat_ignite.metrics.interop:MetricAdapter",  # a torchmetrics / Ignite metric in HAT's order
    # profilers
    "SimpleProfiler": "hat_ignite.profiler.simple:SimpleProfiler",
    "TorchProfiler": "hat_ignite.profiler.torch_profiler:TorchProfiler",
    # model converters
    "Torch2Compile": "hat_ignite.engine.compile:Torch2Compile",
    "TorchCompile": "hat_ignite.engine.compile:TorchCompile",  # HAT's torchdynamo-era converter
    # quantization (torchao PT2E)
    "Calibrator": "hat_ignite.engine.calibrator:Calibrator",
    "ModelConvertPipeline": "hat_ignite.quantization.pipeline:ModelConvertPipeline",
    "Float2Calibration": "hat_ignite.quantization.converters:Float2Calibration",
    "Float2QAT": "hat_ignite.quantization.converters:Float2QAT",
    "Calibration2QAT": "hat_ignite.quantization.converters:Calibration2QAT",
    "QAT2Quantize": "hat_ignite.quantization.converters:QAT2Quantize",
    "Calibration2Quantize": "hat_ignite.quantization.converters:Calibration2Quantize",
    "load_quantized_model": "hat_ignite.quantization.io:load_quantized_model",
    # data and models
    "DigitsDataset": "hat_ignite.data.digits:DigitsDataset",
    "DigitsParityDataset": "hat_ignite.data.digits_parity:DigitsParityDataset",
    "MultitaskLoader": "hat_ignite.data.multitask:MultitaskLoader",
    "MultiTaskMLP": "hat_ignite.models.multitask_mlp:MultiTaskMLP",
    "MLPClassifier": "hat_ignite.models.mlp:MLPClassifier",
    "ResNetClassifier": "hat_ignite.models.resnet:ResNetClassifier",
    "DigitsImageDataset": "hat_ignite.data.digits_image:DigitsImageDataset",
    "RandomAffineBatch": "hat_ignite.data.digits_image:RandomAffineBatch",
}

#: The extra names HAT registers for some classes (``@OBJECT_REGISTRY.alias(...)``): HAT configs
#: write ``type="distributed_data_parallel_trainer"``. Alias -> the canonical name above.
HAT_ALIASES: dict[str, str] = {
    "distributed_data_parallel_trainer": "DistributedDataParallelTrainer",
    "data_parallel_trainer": "DataParallelTrainer",
}
BUILTIN_OBJECTS.update({alias: BUILTIN_OBJECTS[name] for alias, name in HAT_ALIASES.items()})

#: HAT engine and callback names hat-ignite deliberately does not provide, with what to use instead.
NOT_PROVIDED: dict[str, str] = {
    "ApexDistributedDataParallelTrainer": "NVIDIA Apex is not supported; use 'DistributedDataParallelTrainer' "
    "with the batch processor's enable_amp=True",
    "apex_distributed_data_parallel_trainer": "NVIDIA Apex is not supported; use "
    "'distributed_data_parallel_trainer' with the batch processor's enable_amp=True",
    "DeepSpeedTrainer": "DeepSpeed is not supported; use 'DistributedDataParallelTrainer'",
    "deepspeed_trainer": "DeepSpeed is not supported; use 'distributed_data_parallel_trainer'",
    "AIDIPredictor": "AIDI (Horizon's platform) is not supported; use 'Predictor'",
    "AIDIExperimentManager": "AIDI experiment tracking (Horizon's platform) is not supported; drop this "
    "callback (HAT configs add it when enable_model_tracking is True: set that to False in the config file, "
    "since --opts cannot change a value the config already used)",
    "ExceptionMonitor": "it sends metric values to AIDI's monitoring service (Horizon's platform, aidisdk), "
    "which hat-ignite does not serve; drop the callback, or check the values MetricUpdater puts into storage "
    "in an on_step_end hook of your own",
    "MultiStageBatchProcessor": "it runs each task's head on its own through HAT's graph models "
    "(MultitaskGraphModel.split_module, part of HAT's model zoo), to save memory; use 'MultiBatchProcessor', "
    "which gives the same gradients for the same batches without that memory saving",
}
