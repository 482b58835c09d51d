"""The engines: HAT's loops as Ignite engines, their events, state and batch processors.

This package never imports :mod:`hat_ignite.callbacks`.
"""

from hat_ignite.engine.calibrator import Calibrator
from hat_ignite.engine.ddp_trainer import DataParallelTrainer, DistributedDataParallelTrainer
from hat_ignite.engine.events import HOOK_EVENTS, HatEvents
from hat_ignite.engine.launcher import build_launcher
from hat_ignite.engine.loop import LoopBase
from hat_ignite.engine.outputs import loss_output
from hat_ignite.engine.predictor import Predictor
from hat_ignite.engine.processors import (
    BasicBatchProcessor,
    BatchProcessorMixin,
    MultiBatchProcessor,
    collect_loss_by_index,
    collect_loss_by_regex,
)
from hat_ignite.engine.pipe import PipeBase
from hat_ignite.engine.state import HOOK_KWARGS, EventStorage, HatState
from hat_ignite.engine.task_sampler import TaskSampler
from hat_ignite.engine.trainer import Trainer

__all__ = [
    "HatEvents",
    "HOOK_EVENTS",
    "HOOK_KWARGS",
    "HatState",
    "EventStorage",
    "LoopBase",
    "Trainer",
    "DistributedDataParallelTrainer",
    "DataParallelTrainer",
    "TaskSampler",
    "build_launcher",
    "Predictor",
    "Calibrator",
    "BatchProcessorMixin",
    "BasicBatchProcessor",
    "MultiBatchProcessor",
    "collect_loss_by_index",
    "collect_loss_by_regex",
    "loss_output",
    "PipeBase",
]
