"""A small multi-layer perceptron classifier following HAT's model convention."""

from __future__ import annotations

import torch
from torch import nn

from hat_ignite.models.classifier import SelfLossClassifier

__all__ = ["MLPClassifier"]


class MLPClassifier(SelfLossClassifier):
    """``in_features -> hidden_features -> ... -> num_classes`` with ReLU, trained by cross entropy.

    As HAT models do, the model computes its own loss: in training mode it returns
    ``(losses, logits)`` with ``losses = {"cls_loss": tensor}`` (so ``collect_loss_by_index(0)``
    or ``collect_loss_by_regex("^.*loss.*")`` finds the loss); in eval mode it returns the
    ``[B, num_classes]`` logits.

    It accepts both batch styles of the batch processors: a dict batch passed whole
    (``model({"img": x, "labels": y})``) or a tuple batch unpacked (``model(x, y)``). Inputs of
    any shape ``[B, ...]`` are flattened to ``[B, in_features]``.

    Args:
        in_features: number of input values per sample (64 for 8x8 digits).
        hidden_features: width of each hidden layer; an int or a list of ints (one per layer).
        num_classes: number of output classes.
        dropout: dropout probability after each hidden layer.
        input_key: key of the input tensor in a dict batch.
        label_key: key of the labels in a dict batch.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> model = MLPClassifier(in_features=4, hidden_features=8, num_classes=3)
        >>> batch = {"img": torch.rand(5, 4), "labels": torch.tensor([0, 1, 2, 0, 1])}
        >>> losses, logits = model(batch)
        >>> sorted(losses), tuple(logits.shape)
        (['cls_loss'], (5, 3))
        >>> tuple(model.eval()(batch["img"]).shape)
        (5, 3)
    """

    def __init__(
        self,
        in_features: int = 64,
        hidden_features: int | list[int] = 128,
        num_classes: int = 10,
        dropout: float = 0.0,
        input_key: str = "img",
        label_key: str = "labels",
    ) -> None:
        super().__init__()
        widths = [hidden_features] if isinstance(hidden_features, int) else list(hidden_features)
        layers: list[nn.Module] = []
        prev = in_features
        for width in widths:
            layers += [nn.Linear(prev, width), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            prev = width
        layers.append(nn.Linear(prev, num_classes))
        self.net = nn.Sequential(*layers)
        self.in_features = in_features
        self.num_classes = num_classes
        self.input_key = input_key
        self.label_key = label_key

    def logits(self, data: torch.Tensor) -> torch.Tensor:
        """The ``[B, num_classes]`` logits of ``data``."""
        return self.net(data.reshape(data.shape[0], -1))
