"""Small models for the shipped configs and the tests."""

from typing import TYPE_CHECKING

from hat_ignite.lazy import lazy_attributes

# each name is imported from its module when first used (hat_ignite.lazy)
_EXPORTS = {
    "hat_ignite.models.mlp": ["MLPClassifier"],
    "hat_ignite.models.multitask_mlp": ["MultiTaskMLP"],
    "hat_ignite.models.resnet": ["BasicBlock", "ResNetClassifier"],
}

__all__ = ["MLPClassifier", "MultiTaskMLP", "BasicBlock", "ResNetClassifier"]

__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from hat_ignite.models.mlp import MLPClassifier
    from hat_ignite.models.multitask_mlp import MultiTaskMLP
    from hat_ignite.models.resnet import BasicBlock, ResNetClassifier
