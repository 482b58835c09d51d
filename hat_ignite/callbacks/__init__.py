"""HAT callbacks: handlers on the engine's HAT events.

Importing this package imports none of its modules: each name is imported from its module when
first used (:mod:`hat_ignite.lazy`), and each callback imports its optional dependencies
(torchmetrics, tensorboardX) when it is built.
"""

from typing import TYPE_CHECKING

from hat_ignite.lazy import lazy_attributes

# each name is imported from its module when first used (hat_ignite.lazy)
_EXPORTS = {
    "hat_ignite.callbacks.base": ["CallbackMixin"],
    "hat_ignite.callbacks.checkpoint": ["Checkpoint", "list_checkpoints"],
    "hat_ignite.checkpoint.restore": [
        "LoadCheckpoint", "load_model_weights", "restore_training_state", "resume_from",
    ],
    "hat_ignite.callbacks.dump_data": ["DumpData"],
    "hat_ignite.callbacks.ema": ["ExponentialMovingAverage"],
    "hat_ignite.callbacks.freeze": ["FreezeBNStatistics", "FreezeModule"],
    "hat_ignite.callbacks.fuse_bn": ["FuseBN"],
    "hat_ignite.callbacks.grad_scale": ["GradScale"],
    "hat_ignite.callbacks.lr_updater": [
        "CosineAnnealingLrUpdater", "CosLrUpdater", "CyclicLrUpdater", "NoamLrUpdater", "OneCycleUpdater",
        "PolyLrUpdater", "StepDecayLrUpdater",
    ],
    "hat_ignite.callbacks.lr_updater_base": ["LrUpdaterBase"],
    "hat_ignite.callbacks.metric_update_funcs": ["update_metric_using_index", "update_metric_using_regex"],
    "hat_ignite.callbacks.mean_teacher": ["MeanTeacher"],
    "hat_ignite.callbacks.metric_updater": ["MetricUpdater"],
    "hat_ignite.callbacks.param_updater": [
        "CosOptimParamUpdater", "CyclicOptimParamUpdater", "OptimParamUpdaterBase", "StepDecayOptimParamUpdater",
    ],
    "hat_ignite.callbacks.save_traced": ["SaveTraced"],
    "hat_ignite.callbacks.stats_monitor": ["StatsMonitor"],
    "hat_ignite.callbacks.tensorboard": ["TensorBoard"],
    "hat_ignite.callbacks.validation": ["MeanTeacherValidation", "Validation"],
}

__all__ = [
    "CallbackMixin",
    "Checkpoint",
    "list_checkpoints",
    "LoadCheckpoint",
    "load_model_weights",
    "restore_training_state",
    "resume_from",
    "LrUpdaterBase",
    "CosLrUpdater",
    "CosineAnnealingLrUpdater",
    "CyclicLrUpdater",
    "NoamLrUpdater",
    "OneCycleUpdater",
    "PolyLrUpdater",
    "StepDecayLrUpdater",
    "OptimParamUpdaterBase",
    "StepDecayOptimParamUpdater",
    "CosOptimParamUpdater",
    "CyclicOptimParamUpdater",
    "MetricUpdater",
    "update_metric_using_index",
    "update_metric_using_regex",
    "StatsMonitor",
    "Validation",
    "MeanTeacherValidation",
    "ExponentialMovingAverage",
    "FreezeModule",
    "FreezeBNStatistics",
    "FuseBN",
    "GradScale",
    "TensorBoard",
    "SaveTraced",
    "MeanTeacher",
    "DumpData",
]

__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from hat_ignite.callbacks.base import CallbackMixin
    from hat_ignite.callbacks.checkpoint import Checkpoint, list_checkpoints
    from hat_ignite.checkpoint.restore import LoadCheckpoint, load_model_weights, restore_training_state, resume_from
    from hat_ignite.callbacks.dump_data import DumpData
    from hat_ignite.callbacks.ema import ExponentialMovingAverage
    from hat_ignite.callbacks.freeze import FreezeBNStatistics, FreezeModule
    from hat_ignite.callbacks.fuse_bn import FuseBN
    from hat_ignite.callbacks.grad_scale import GradScale
    from hat_ignite.callbacks.lr_updater import (
        CosineAnnealingLrUpdater,
        CosLrUpdater,
        CyclicLrUpdater,
        NoamLrUpdater,
        OneCycleUpdater,
        PolyLrUpdater,
        StepDecayLrUpdater,
    )
    from hat_ignite.callbacks.lr_updater_base import LrUpdaterBase
    from hat_ignite.callbacks.metric_update_funcs import update_metric_using_index, update_metric_using_regex
    from hat_ignite.callbacks.mean_teacher import MeanTeacher
    from hat_ignite.callbacks.metric_updater import MetricUpdater
    from hat_ignite.callbacks.param_updater import (
        CosOptimParamUpdater,
        CyclicOptimParamUpdater,
        OptimParamUpdaterBase,
        StepDecayOptimParamUpdater,
    )
    from hat_ignite.callbacks.save_traced import SaveTraced
    from hat_ignite.callbacks.stats_monitor import StatsMonitor
    from hat_ignite.callbacks.tensorboard import TensorBoard
    from hat_ignite.callbacks.validation import MeanTeacherValidation, Validation
