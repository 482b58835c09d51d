"""`MultitaskLoader`: one data loader per task, combined into multitask steps by a `TaskSampler`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterable, Iterator

__all__ = ["MultitaskLoader"]


def _set_epoch(loader: Any, epoch: int) -> None:
    for owner in (loader, getattr(loader, "batch_sampler", None)):
        set_epoch = getattr(getattr(owner, "sampler", None), "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
            return


class MultitaskLoader:
    """Yield one multitask step at a time: a tuple of ``{task_name: batch}`` dicts.

    Each step asks the task sampler which tasks train, then draws the next batch of each chosen
    task's loader; a loader that runs out restarts (its sampler keeps the epoch). The tuple is
    what :class:`~hat_ignite.engine.processors.MultiBatchProcessor` takes as several batches in one
    step; keying each batch by its task name lets the model run that task's head and lets
    task-aware callbacks (``GradScale``) see which task a batch belongs to (``task in batch``).

    Args:
        loaders: ``{task_name: data_loader}`` (built loaders or loader configs).
        task_sampler: a :class:`~hat_ignite.engine.task_sampler.TaskSampler` or its config;
            default: every task every step (``method="sample_all"``).
        num_steps: steps per epoch; default: the length of the longest task loader.

    Under ``DistributedDataParallelTrainer`` each task loader gets a ``DistributedSampler``
    when it has none, and :meth:`set_epoch` (called by the loop each epoch) reaches every one.

    Example:
        >>> loader = MultitaskLoader({"a": [1, 2, 3], "b": [10, 20]})
        >>> len(loader), list(loader)
        (3, [({'a': 1}, {'b': 10}), ({'a': 2}, {'b': 20}), ({'a': 3}, {'b': 10})])
    """

    def __init__(self, loaders: Mapping[str, Iterable], task_sampler: Any = None, num_steps: int | None = None) -> None:
        from hat_ignite.engine.loop import build_if_config
        from hat_ignite.engine.task_sampler import TaskSampler

        if not isinstance(loaders, Mapping) or not loaders:
            raise ValueError(f"MultitaskLoader: loaders must be a non-empty dict {{task_name: loader}}, got {loaders!r}.")
        self.loaders = {str(k): build_if_config(v, f"loaders.{k}") for k, v in loaders.items()}
        if task_sampler is None:
            task_sampler = TaskSampler({name: 1 for name in self.loaders}, method="sample_all")
        self.task_sampler = build_if_config(task_sampler, "task_sampler")
        unknown = [t for t in getattr(self.task_sampler, "tasks", []) if t not in self.loaders]
        if unknown:
            raise ValueError(
                f"MultitaskLoader: the task sampler names tasks {unknown} that have no loader; "
                f"loaders are given for {sorted(self.loaders)}."
            )
        if num_steps is not None and (isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1):
            raise ValueError(f"MultitaskLoader: num_steps must be a positive int or None, got {num_steps!r}.")
        self.num_steps = num_steps
        self.epoch = 0

    def __len__(self) -> int:
        if self.num_steps is not None:
            return self.num_steps
        lengths = []
        for name, loader in self.loaders.items():
            try:
                lengths.append(len(loader))
            except TypeError as exc:
                raise TypeError(
                    f"MultitaskLoader: the loader of task {name!r} has no length; pass num_steps "
                    f"(steps per epoch)."
                ) from exc
        return max(lengths)

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of every task loader's sampler (and of the task schedule)."""
        self.epoch = epoch
        for loader in self.loaders.values():
            _set_epoch(loader, epoch)

    def __iter__(self) -> Iterator[tuple[dict[str, Any], ...]]:
        iterators: dict[str, Iterator] = {}
        for _ in range(len(self)):
            step = []
            for task in self.task_sampler.sample_task(epoch=self.epoch):
                it = iterators.get(task)
                if it is None:
                    it = iterators[task] = iter(self.loaders[task])
                try:
                    batch = next(it)
                except StopIteration:  # this task's loader ran out: start it again
                    it = iterators[task] = iter(self.loaders[task])
                    try:
                        batch = next(it)
                    except StopIteration:
                        raise ValueError(f"MultitaskLoader: the loader of task {task!r} yields no batch.") from None
                step.append({task: batch})
            yield tuple(step)

    def __repr__(self) -> str:
        return f"MultitaskLoader(tasks={list(self.loaders)}, task_sampler={self.task_sampler!r})"
