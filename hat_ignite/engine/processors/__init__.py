"""Batch processors: the process functions of hat-ignite engines, and loss collectors."""

from hat_ignite.engine.processors.base import BatchProcessorMixin
from hat_ignite.engine.processors.basic import BasicBatchProcessor
from hat_ignite.engine.processors.loss_collectors import collect_loss_by_index, collect_loss_by_regex
from hat_ignite.engine.processors.multi import MultiBatchProcessor

__all__ = [
    "BatchProcessorMixin",
    "BasicBatchProcessor",
    "MultiBatchProcessor",
    "collect_loss_by_index",
    "collect_loss_by_regex",
]
