"""The engines: HAT's loops as Ignite engines, their events, state and batch processors.

This package never imports :mod:`hat_ignite.callbacks`. Importing it imports none of its
modules: each name is imported from its module when first used (:mod:`hat_ignite.lazy`).
"""

from typing import TYPE_CHECKING

from hat_ignite.lazy import lazy_attributes

# each name is imported from its module when first used (hat_ignite.lazy)
_EXPORTS = {
    "hat_ignite.engine.calibrator": ["Calibrator"],
    "hat_ignite.engine.ddp_trainer": ["DataParallelTrainer", "DistributedDataParallelTrainer"],
    "hat_ignite.engine.events": ["HOOK_EVENTS", "HatEvents"],
    "hat_ignite.engine.inference": ["Inference"],
    "hat_ignite.engine.launcher": ["build_launcher"],
    "hat_ignite.engine.loop": ["LoopBase"],
    "hat_ignite.engine.outputs": ["loss_output"],
    "hat_ignite.engine.predictor": ["Predictor"],
    "hat_ignite.engine.processors": [
        "BasicBatchProcessor", "BatchProcessorMixin", "MultiBatchProcessor", "collect_loss_by_index",
        "collect_loss_by_regex",
    ],
    "hat_ignite.engine.pipe": ["PipeBase"],
    "hat_ignite.engine.state": ["HOOK_KWARGS", "EventStorage", "HatState"],
    "hat_ignite.engine.task_sampler": ["TaskSampler"],
    "hat_ignite.engine.trainer": ["Trainer"],
}

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
    "Inference",
    "BatchProcessorMixin",
    "BasicBatchProcessor",
    "MultiBatchProcessor",
    "collect_loss_by_index",
    "collect_loss_by_regex",
    "loss_output",
    "PipeBase",
]

__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from hat_ignite.engine.calibrator import Calibrator
    from hat_ignite.engine.ddp_trainer import DataParallelTrainer, DistributedDataParallelTrainer
    from hat_ignite.engine.events import HOOK_EVENTS, HatEvents
    from hat_ignite.engine.inference import Inference
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
