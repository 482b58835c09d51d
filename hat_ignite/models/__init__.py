"""Small models for the shipped configs and the tests."""

from hat_ignite.models.mlp import MLPClassifier

__all__ = ["MLPClassifier"]
