"""Small models for the shipped configs and the tests."""

from hat_ignite.models.mlp import MLPClassifier
from hat_ignite.models.multitask_mlp import MultiTaskMLP
from hat_ignite.models.resnet import BasicBlock, ResNetClassifier

__all__ = ["MLPClassifier", "MultiTaskMLP", "BasicBlock", "ResNetClassifier"]
