"""`MeanTeacher`: the teacher half of a teacher-student model follows the student's moving average.

A mean-teacher model (https://arxiv.org/abs/1703.01780) holds two copies of a network as
sub-modules whose names start with ``teacher_`` and ``student_`` (``teacher_net`` /
``student_net``). The student trains; the teacher never receives gradients and, after every
step, each of its floating-point parameters and buffers (BatchNorm running statistics included,
``num_batches_tracked`` left alone) moves toward the student's tensor of the same name::

    d = decay * (1 - exp(-(global_step_id + 1) / decay_base))
    teacher = d * teacher + (1 - d) * student

as HAT's ``MeanTeacher`` callback does. Unlike :class:`~.ema.ExponentialMovingAverage`, the
average lives inside the model (so checkpoints, validation with
:class:`~.validation.MeanTeacherValidation` and exports see it) and no ``ema_model`` copy is made.

Example:
    >>> import torch
    >>> class TS(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.student_fc, self.teacher_fc = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    >>> model, mt = TS(), MeanTeacher(decay=0.5, decay_base=1e-9)
    >>> mt.on_loop_begin(model=model)
    >>> model.teacher_fc.weight.requires_grad
    False
    >>> with torch.no_grad():
    ...     _ = model.student_fc.weight.fill_(1.0), model.teacher_fc.weight.fill_(0.0)
    >>> mt.on_step_end(global_step_id=0, model=model)
    >>> model.teacher_fc.weight.tolist()
    [[0.5, 0.5]]
"""

from __future__ import annotations

import itertools
import logging
import math
from typing import Any

import torch
from torch import nn

from hat_ignite.callbacks.base import CallbackMixin
from hat_ignite.checkpoint.payload import unwrap_model

__all__ = ["MeanTeacher"]

logger = logging.getLogger(__name__)

_TEACHER, _STUDENT = "teacher", "student"


class MeanTeacher(CallbackMixin):
    """Update a model's ``teacher_*`` tensors as the moving average of its ``student_*`` ones.

    Args:
        decay: the average's decay once warmed up, in ``[0, 1]``.
        decay_base: how many steps the decay takes to warm up (``d`` reaches ``63%`` of
            ``decay`` after ``decay_base`` steps); positive.

    Raises:
        ValueError: at loop begin, when a teacher tensor has no student tensor of the same name
            and shape. A model without any ``teacher_*`` tensor gets a warning and is left alone.
    """

    def __init__(self, decay: float = 0.9999, decay_base: float = 2000) -> None:
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 <= decay <= 1.0:
            raise ValueError(f"MeanTeacher(decay={decay!r}): give a decay in [0, 1].")
        if isinstance(decay_base, bool) or not isinstance(decay_base, (int, float)) or not decay_base > 0:
            raise ValueError(f"MeanTeacher(decay_base={decay_base!r}): give a positive number of steps.")
        self.decay_value = float(decay)
        self.decay_base = float(decay_base)
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._model: nn.Module | None = None

    def decay(self, updates: int) -> float:
        """The decay ``d`` of the ``updates``-th update (1-based)."""
        return self.decay_value * (1.0 - math.exp(-updates / self.decay_base))

    def _pair_up(self, model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
        tensors = dict(itertools.chain(model.named_parameters(), model.named_buffers()))
        pairs = []
        for name, teacher in tensors.items():
            if not name.startswith(_TEACHER + "_") or not teacher.is_floating_point():
                continue  # num_batches_tracked and other integer buffers are counters, not averaged
            student_name = _STUDENT + name[len(_TEACHER):]
            student = tensors.get(student_name)
            if student is None or student.shape != teacher.shape:
                found = "no such tensor" if student is None else f"shape {tuple(student.shape)}"
                raise ValueError(
                    f"MeanTeacher: the teacher's {name!r} {tuple(teacher.shape)} needs a student tensor "
                    f"{student_name!r} of the same shape ({found}). The teacher_* and student_* sub-modules "
                    f"must be copies of one network."
                )
            pairs.append((teacher, student))
        if not pairs:  # HAT leaves such a model alone without a word; say it once
            children = [n for n, _ in model.named_children()]
            logger.warning(
                "MeanTeacher: the model (%s) has no tensor under a 'teacher_*' sub-module (its children: %s), "
                "so there is nothing to average. Name the two copies teacher_<x> and student_<x>.",
                type(model).__name__, children[:10],
            )
        return pairs

    def on_loop_begin(self, model: nn.Module, **kwargs: Any) -> None:
        """Stop gradients to the teacher and pair each teacher tensor with its student tensor."""
        inner = unwrap_model(model)
        for name, param in inner.named_parameters():
            if name.startswith(_TEACHER):
                param.requires_grad_(False)
        self._pairs = self._pair_up(inner)
        self._model = inner

    def on_step_end(self, global_step_id: int, model: nn.Module, **kwargs: Any) -> None:
        """Move every teacher tensor toward its student tensor."""
        inner = unwrap_model(model)
        if inner is not self._model:  # called without loop begin, or the model was replaced
            self._pairs, self._model = self._pair_up(inner), inner
        d = self.decay(global_step_id + 1)
        with torch.no_grad():
            for teacher, student in self._pairs:
                teacher.mul_(d).add_(student, alpha=1.0 - d)

    def __repr__(self) -> str:
        return f"MeanTeacher(decay={self.decay_value}, decay_base={self.decay_base})"
