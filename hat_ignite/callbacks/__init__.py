"""HAT callbacks: handlers on the engine's HAT events.

Importing this package imports no optional dependency (torchmetrics, tensorboardX): each callback
imports what it needs when it is built.
"""

from hat_ignite.callbacks.base import CallbackMixin
from hat_ignite.callbacks.checkpoint import Checkpoint, list_checkpoints
from hat_ignite.callbacks.checkpoint_state import LoadCheckpoint, load_model_weights, restore_training_state, resume_from
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
