"""`SelfLossClassifier`: the HAT model convention the shipped classifiers share.

As HAT models do, such a model computes its own loss: in training mode it returns
``({"cls_loss": loss}, logits)`` (so ``collect_loss_by_index(0)`` or
``collect_loss_by_regex("^.*loss.*")`` finds the loss); in eval mode the ``[B, num_classes]``
logits. It takes both batch styles of the batch processors: a dict batch passed whole
(``model({"img": x, "labels": y})``) or a tuple batch unpacked (``model(x, y)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["SelfLossClassifier"]


class SelfLossClassifier(nn.Module):
    """Base of a classifier that returns its cross-entropy loss in training mode.

    A subclass sets ``input_key`` and ``label_key`` and implements :meth:`logits`; the
    ``input_noun`` class attribute names its input in the error messages ("input", "image").
    """

    input_noun = "input"
    input_key: str
    label_key: str

    def logits(self, data: torch.Tensor) -> torch.Tensor:
        """The ``[B, num_classes]`` logits of an input tensor."""
        raise NotImplementedError

    def forward(self, data: Any, labels: torch.Tensor | None = None) -> Any:
        """Classify ``data`` (a tensor or a dict batch); see the module docstring for outputs."""
        name = type(self).__name__
        if isinstance(data, Mapping):
            if self.input_key not in data:
                raise KeyError(
                    f"{name}: the batch has no {self.input_key!r} key (keys: {sorted(data)}); "
                    f"set input_key to the key of the {self.input_noun} tensor."
                )
            if labels is None:
                labels = data.get(self.label_key)
            data = data[self.input_key]
        logits = self.logits(data)
        if not self.training:
            return logits
        if labels is None:
            raise ValueError(
                f"{name} in training mode needs labels: pass a dict batch with "
                f"{self.label_key!r} or call model({self.input_noun}s, labels); call model.eval() to predict."
            )
        return {"cls_loss": F.cross_entropy(logits, labels)}, logits
