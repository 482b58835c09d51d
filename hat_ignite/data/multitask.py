"""`MultitaskLoader`: one data loader per task, combined into multitask steps by a `TaskSampler`.

What each step yields, as HAT's ``hat.data.dataloaders.MultitaskLoader`` yields it:

* ``return_task=False`` (the default): one ``OrderedDict`` ``{task: batch}`` holding a batch of
  every task the sampler chose, one batch, forwarded whole;
* ``return_task=True``: a tuple of ``(batch, task)`` pairs, one per chosen task, which
  :class:`~hat_ignite.engine.processors.MultiBatchProcessor` forwards and backwards one after the
  other before the step's single update, calling ``model(batch, task)``;
* ``return_task=True, wrap_batch=True``: pairs ``({**batch, task: batch}, task)``, for models
  that look up their task's data under the task name.

How long an epoch is (``mode``), with ``L = max(len(loader) * sampling_factor)`` over the tasks
that train from the first epoch:

* ``"max_size"``: a task loader that runs out starts again; the epoch ends when a chosen task has
  given ``L`` batches;
* ``"min_size"``: the epoch ends when a chosen task's loader runs out;
* ``"validation"``: a task loader that runs out drops out of the steps (it is read once); the
  epoch ends when a chosen task has been asked for ``L`` batches.

A task is asked for one batch per step however often the sampler names it in that step (HAT
does the same): in ``sample_all`` a ``sampling_factor`` lengthens the epoch, in ``sample_one``
it makes the task come up more often.
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Iterable, Iterator

__all__ = ["MultitaskLoader"]

_MODES = ("max_size", "min_size", "validation")


def _set_epoch(loader: Any, epoch: int) -> None:
    for owner in (loader, getattr(loader, "batch_sampler", None)):
        set_epoch = getattr(getattr(owner, "sampler", None), "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
            return


def _length(loader: Any) -> float:
    try:
        return float(len(loader))
    except TypeError:  # an iterable without a length never runs out
        return math.inf


def _unique(tasks: Iterable[str] | str) -> list[str]:
    return [tasks] if isinstance(tasks, str) else list(OrderedDict.fromkeys(tasks))


def _fresh(sampler: Any) -> Any:
    """A copy of the task sampler at its start, to count an epoch's steps without moving it."""
    fresh_copy = getattr(sampler, "fresh_copy", None)
    return fresh_copy() if callable(fresh_copy) else copy.deepcopy(sampler)


class MultitaskLoader:
    """Yield multitask steps: the chosen tasks' batches, as a dict or as ``(batch, task)`` pairs.

    Args:
        loaders: ``{task_name: data_loader}`` (built loaders or loader configs). With a task
            sampler, only the sampler's tasks are kept.
        task_sampler: a :class:`~hat_ignite.engine.task_sampler.TaskSampler` (or its config)
            choosing the tasks of each step; ``None``: every task, every step.
        mode: ``"max_size"``, ``"min_size"`` or ``"validation"`` (module docstring).
        return_task: yield a tuple of ``(batch, task)`` pairs instead of one ``{task: batch}`` dict.
        custom_length: at most this many steps per epoch.
        wrap_batch: with ``return_task``, yield ``({**batch, task: batch}, task)`` pairs.

    ``len(loader)`` is the number of steps of an epoch; the loop runs that many each epoch. It is
    the number HAT's loader gives in its first epoch. Each task's data loader starts a new pass
    every epoch; under ``DistributedDataParallelTrainer`` each gets a ``DistributedSampler`` when
    it has none, and :meth:`set_epoch` (called by the loop each epoch) reaches every one.

    Example:
        >>> from hat_ignite.engine.task_sampler import TaskSampler
        >>> loaders = {"a": [1, 2, 3], "b": [10, 20]}
        >>> list(MultitaskLoader(loaders))
        [OrderedDict([('a', 1), ('b', 10)]), OrderedDict([('a', 2), ('b', 20)]), OrderedDict([('a', 3), ('b', 10)])]
        >>> list(MultitaskLoader(loaders, mode="validation", return_task=True))
        [((1, 'a'), (10, 'b')), ((2, 'a'), (20, 'b')), ((3, 'a'),)]
        >>> one = MultitaskLoader(loaders, TaskSampler({"a": 1, "b": 1}, method="sample_one"), return_task=True)
        >>> len(one), [step[0][1] for step in one]
        (6, ['a', 'b', 'a', 'b', 'a', 'b'])
    """

    def __init__(
        self,
        loaders: Mapping[str, Iterable],
        task_sampler: Any = None,
        mode: str = "max_size",
        return_task: bool = False,
        custom_length: int | None = None,
        wrap_batch: bool = False,
    ) -> None:
        from hat_ignite.engine.loop import build_if_config

        if not isinstance(loaders, Mapping) or not loaders:
            raise ValueError(f"MultitaskLoader: loaders must be a non-empty dict {{task_name: loader}}, got {loaders!r}.")
        if mode not in _MODES:
            raise ValueError(f"MultitaskLoader: mode must be one of {', '.join(_MODES)}, got {mode!r}.")
        if custom_length is not None and (
            isinstance(custom_length, bool) or not isinstance(custom_length, int) or custom_length < 1
        ):
            raise ValueError(f"MultitaskLoader: custom_length must be a positive int or None, got {custom_length!r}.")
        self.task_sampler = build_if_config(task_sampler, "task_sampler") if task_sampler is not None else None
        names = [str(k) for k in loaders]
        if self.task_sampler is not None:
            tasks = list(getattr(self.task_sampler, "tasks", []))
            unknown = [t for t in tasks if t not in names]
            if unknown:
                raise ValueError(
                    f"MultitaskLoader: the task sampler names tasks {unknown} that have no loader; "
                    f"loaders are given for {sorted(names)}."
                )
            names = tasks
        self.loaders = {str(k): build_if_config(v, f"loaders.{k}") for k, v in loaders.items() if str(k) in names}
        self.mode = mode
        self.return_task = bool(return_task)
        self.custom_length = custom_length
        self.wrap_batch = bool(wrap_batch)
        self.epoch = 0
        self._steps_cache: tuple[tuple, int | None] | None = None

    # -- length -----------------------------------------------------------------------------
    def _factors(self) -> dict[str, int]:
        config = getattr(self.task_sampler, "task_config", None)
        if not isinstance(config, Mapping):
            return {name: 1 for name in self.loaders}
        return {name: int(dict(config.get(name, {})).get("sampling_factor", 1)) for name in self.loaders}

    def _limits(self) -> dict[str, float]:
        """How many batches each task may be asked for in an epoch (inf: no limit)."""
        lengths = {name: _length(loader) for name, loader in self.loaders.items()}
        if self.mode == "min_size":
            return lengths
        config = getattr(self.task_sampler, "task_config", None)
        first = [
            name for name in self.loaders
            if not isinstance(config, Mapping) or int(dict(config.get(name, {})).get("start_epoch", 0)) == 0
        ]
        factors = self._factors()
        longest = max((lengths[n] * factors[n] for n in first), default=math.inf)
        return {name: longest if lengths[name] < math.inf else math.inf for name in self.loaders}

    def _count_steps(self) -> int | None:
        """Steps until a chosen task reaches its limit, drawing from a fresh copy of the sampler."""
        limits = self._limits()
        sampler = self.task_sampler
        if sampler is None or getattr(sampler, "method", None) == "sample_all":
            tasks = list(self.loaders) if sampler is None else _unique(_fresh(sampler).sample_task())
            steps = min(limits[t] for t in tasks)
            return None if steps == math.inf else int(steps)
        fresh = _fresh(sampler)
        drawable = {t for union in getattr(fresh, "cycle", [list(self.loaders)]) for t in union}
        if all(limits.get(t, math.inf) == math.inf for t in drawable):
            return None
        counts = dict.fromkeys(self.loaders, 0)
        steps = 0
        while True:
            tasks = _unique(fresh.sample_task(epoch=0))
            if any(counts[t] >= limits[t] for t in tasks):
                return steps
            for t in tasks:
                counts[t] += 1
            steps += 1

    def __len__(self) -> int:
        key = (tuple(_length(loader) for loader in self.loaders.values()), self.mode, self.custom_length)
        if self._steps_cache is None or self._steps_cache[0] != key:
            self._steps_cache = (key, self._count_steps())
        steps = self._steps_cache[1]
        if steps is None:
            if self.custom_length is not None:
                return self.custom_length
            raise TypeError(
                "MultitaskLoader: every task loader is endless (no len()); give custom_length "
                "(steps per epoch) or a task loader with a length."
            )
        return steps if self.custom_length is None else min(steps, self.custom_length)

    # -- iteration --------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of every task loader's sampler (and of the task schedule)."""
        self.epoch = epoch
        for loader in self.loaders.values():
            _set_epoch(loader, epoch)

    @property
    def sampler(self) -> dict[str, Any]:
        """``{task: sampler}`` of the task loaders (HAT's attribute)."""
        return {name: getattr(loader, "sampler", None) for name, loader in self.loaders.items()}

    @property
    def batch_size(self) -> int:
        """The task loaders' batch sizes summed, each times its task's sampling factor (as HAT)."""
        factors = self._factors()
        return sum(int(getattr(loader, "batch_size", 1) or 1) * factors[n] for n, loader in self.loaders.items())

    def _next_batch(self, iterators: dict[str, Iterator | None], task: str) -> Any:
        it = iterators[task]
        if it is None:  # validation: this task's loader has been read once already
            return None
        try:
            return next(it)
        except StopIteration:
            if self.mode == "validation":
                iterators[task] = None
                return None
        it = iterators[task] = iter(self.loaders[task])
        try:
            return next(it)
        except StopIteration:
            raise ValueError(f"MultitaskLoader: the loader of task {task!r} yields no batch.") from None

    def _pack(self, batches: OrderedDict[str, Any]) -> Any:
        if not self.return_task:
            return batches
        if not self.wrap_batch:
            return tuple((batch, task) for task, batch in batches.items())
        wrapped = []
        for task, batch in batches.items():
            whole = dict(batch) if isinstance(batch, Mapping) else {}
            whole[task] = batch
            wrapped.append((whole, task))
        return tuple(wrapped)

    def __iter__(self) -> Iterator[Any]:
        steps = len(self)
        iterators: dict[str, Iterator | None] = {name: iter(loader) for name, loader in self.loaders.items()}
        for _ in range(steps):
            if self.task_sampler is None:
                tasks = list(self.loaders)
            else:
                tasks = _unique(self.task_sampler.sample_task(epoch=self.epoch))
            batches: OrderedDict[str, Any] = OrderedDict()
            for task in tasks:
                batch = self._next_batch(iterators, task)
                if batch is not None:
                    batches[task] = batch
            yield self._pack(batches)

    def __repr__(self) -> str:
        return (
            f"MultitaskLoader(tasks={list(self.loaders)}, task_sampler={self.task_sampler!r}, mode={self.mode!r}, "
            f"return_task={self.return_task})"
        )
