"""A shared MLP trunk with one classification head per task (HAT's multitask model convention)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["MultiTaskMLP"]


class MultiTaskMLP(nn.Module):
    """``trunk`` (shared MLP) followed by ``heads[task]`` (one linear classifier per task).

    The input is either a task-keyed batch ``{task_name: {"img": ..., "labels": ...}}``
    (:class:`~hat_ignite.data.multitask.MultitaskLoader`'s default), the model running the head
    of every task present, or one task's batch and its name, ``model(batch, task_name)``, as a
    ``MultitaskLoader(return_task=True)`` pair is passed. In training mode it returns ``(losses, logits)`` with
    ``losses = {f"{task}_loss": cross_entropy}`` and ``logits = {task: tensor}``; in eval mode
    the ``{task: logits}`` dict. Heads of tasks absent from a batch get no gradient in that step
    (DDP needs ``find_unused_parameters=True`` when a step may leave a task out).

    Args:
        tasks: ``{task_name: num_classes}``.
        in_features: input values per sample (64 for 8x8 digits).
        hidden_features: width of each trunk layer, an int or a list of ints.
        input_key: key of the input tensor in each task's batch.
        label_key: key of the labels in each task's batch.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> model = MultiTaskMLP({"digits": 10, "parity": 2}, in_features=4, hidden_features=8)
        >>> batch = {"parity": {"img": torch.rand(3, 4), "labels": torch.tensor([0, 1, 1])}}
        >>> losses, logits = model(batch)
        >>> sorted(losses), tuple(logits["parity"].shape)
        (['parity_loss'], (3, 2))
        >>> sorted(model.eval()(batch))
        ['parity']
        >>> sorted(model(batch["parity"], "parity"))   # a (batch, task) pair
        ['parity']
    """

    def __init__(
        self,
        tasks: Mapping[str, int],
        in_features: int = 64,
        hidden_features: int | list[int] = 128,
        input_key: str = "img",
        label_key: str = "labels",
    ) -> None:
        super().__init__()
        if not isinstance(tasks, Mapping) or not tasks:
            raise ValueError(f"MultiTaskMLP: tasks must be a non-empty dict {{task_name: num_classes}}, got {tasks!r}.")
        widths = [hidden_features] if isinstance(hidden_features, int) else list(hidden_features)
        layers: list[nn.Module] = []
        prev = in_features
        for width in widths:
            layers += [nn.Linear(prev, width), nn.ReLU()]
            prev = width
        self.trunk = nn.Sequential(*layers)
        self.heads = nn.ModuleDict({str(name): nn.Linear(prev, int(n)) for name, n in tasks.items()})
        self.in_features = in_features
        self.input_key = input_key
        self.label_key = label_key

    def forward(self, batch: Mapping[str, Any], task: str | None = None) -> Any:
        """Run the head of every task in ``batch``, or of ``task`` on its batch; see the class docstring."""
        if task is not None:
            if task not in self.heads:
                raise ValueError(f"MultiTaskMLP: no head for task {task!r}; the tasks are {sorted(self.heads)}.")
            data = batch.get(task) if isinstance(batch, Mapping) else None  # a wrapped batch holds it by name
            batch = {task: data if isinstance(data, Mapping) else batch}
        if not isinstance(batch, Mapping) or not any(task in self.heads for task in batch):
            keys = sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__
            raise ValueError(
                f"MultiTaskMLP: expected a task-keyed batch {{task: {{{self.input_key!r}: ..., "
                f"{self.label_key!r}: ...}}}} with tasks among {sorted(self.heads)}, got {keys}. "
                f"Feed it from a MultitaskLoader."
            )
        losses: dict[str, torch.Tensor] = {}
        logits: dict[str, torch.Tensor] = {}
        for task, data in batch.items():
            if task not in self.heads:
                continue
            x = data[self.input_key]
            logits[task] = out = self.heads[task](self.trunk(x.reshape(x.shape[0], -1)))
            if self.training:
                losses[f"{task}_loss"] = F.cross_entropy(out, data[self.label_key])
        return (losses, logits) if self.training else logits
