"""`TaskSampler`: which tasks' batches make up each multitask training step (HAT's ``hat.core.task_sampler``).

A multitask step forwards and backwards one batch per chosen task (``MultiBatchProcessor``) before
the single optimizer update. The sampler decides the choice, step after step, from a task config
written as in HAT::

    task_config = {"digits": 1, "parity": dict(sampling_factor=2, start_epoch=1)}

Every rank of a distributed run must choose the same tasks at the same step (otherwise DDP waits
for gradients the other rank never computes), so the order is a pure function of the config, the
``seed`` and the number of draws: no global random state is read.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, Sequence

__all__ = ["TaskSampler"]

_METHODS = ("sample_all", "sample_one", "sample_part", "sample_random")
_TASK_KEYS = ("sampling_factor", "start_epoch", "end_epoch", "start_step", "end_step")


def _task_options(name: str, value: Any) -> dict[str, int]:
    """One task's options from an int factor or a dict, checked."""
    options = {"sampling_factor": 1, "start_epoch": 0, "end_epoch": -1, "start_step": 0, "end_step": -1}
    if isinstance(value, bool) or not isinstance(value, (int, Mapping)):
        raise ValueError(
            f"TaskSampler: task_config[{name!r}] must be a sampling factor (int) or a dict of "
            f"{', '.join(_TASK_KEYS)}, got {value!r}."
        )
    given = {"sampling_factor": value} if isinstance(value, int) else dict(value)
    unknown = sorted(set(given) - set(_TASK_KEYS))
    if unknown:
        extra = " Task-parallel training (gpu_group) is not supported." if "gpu_group" in unknown else ""
        raise ValueError(
            f"TaskSampler: task_config[{name!r}] has unknown keys {unknown}; the keys are "
            f"{', '.join(_TASK_KEYS)}.{extra}"
        )
    options.update(given)
    for key, val in options.items():
        if isinstance(val, bool) or not isinstance(val, int):
            raise ValueError(f"TaskSampler: task_config[{name!r}][{key!r}] must be an int, got {val!r}.")
    if options["sampling_factor"] < 0:
        raise ValueError(f"TaskSampler: task_config[{name!r}] sampling_factor must be >= 0, got {options['sampling_factor']}.")
    for first, last in (("start_epoch", "end_epoch"), ("start_step", "end_step")):
        if options[last] >= 0 and options[last] <= options[first]:
            raise ValueError(
                f"TaskSampler: task_config[{name!r}] {last}={options[last]} must be greater than "
                f"{first}={options[first]} (or -1 for 'until the end')."
            )
    return options


class TaskSampler:
    """Choose the tasks of each multitask step.

    Args:
        task_config: ``{task_name: options}`` in the order the tasks' batches run within a step.
            ``options`` is an int ``sampling_factor`` or a dict with ``sampling_factor``
            (default 1; 0 leaves the task out), ``start_epoch``/``end_epoch`` and
            ``start_step``/``end_step`` (the task trains in ``[start, end)``; ``end=-1``: to the
            end of training).
        method: how a step's tasks are chosen:

            * ``"sample_all"``: every task, every step (a task with factor ``k`` is named ``k``
              times; a ``MultitaskLoader`` draws one batch of it per step, as HAT's does, and
              makes the epoch ``k`` times its loader's length);
            * ``"sample_one"``: one task per step, round robin; a cycle holds each task
              ``sampling_factor`` times;
            * ``"sample_part"``: the task groups of ``unions`` in turn, e.g.
              ``[["digits", "parity"], ["parity"]]``;
            * ``"sample_random"``: one task per step, drawn at random with probability
              proportional to ``sampling_factor`` (seeded).
        shuffle: shuffle the order of a cycle (``sample_one``/``sample_part``) each time it
            starts, with the sampler's own seeded generator.
        unions: the task groups of ``sample_part``.
        seed: seed of the sampler's generator (``shuffle`` and ``sample_random``); every rank
            must use the same one, which the default does.

    The sampler is restartable: :meth:`state_dict` / :meth:`load_state_dict` hold its position
    and generator state.

    Example:
        >>> sampler = TaskSampler({"digits": 2, "parity": 1}, method="sample_one")
        >>> [sampler.sample_task() for _ in range(4)]
        [['digits'], ['digits'], ['parity'], ['digits']]
        >>> TaskSampler({"digits": 1, "parity": 1}, method="sample_all").sample_task()
        ['digits', 'parity']
        >>> late = TaskSampler({"digits": 1, "parity": dict(start_epoch=1)}, method="sample_all")
        >>> late.sample_task(epoch=0), late.sample_task(epoch=1)
        (['digits'], ['digits', 'parity'])
    """

    def __init__(
        self,
        task_config: Mapping[str, Any],
        method: str = "sample_one",
        shuffle: bool = False,
        unions: Sequence[Sequence[str]] | None = None,
        seed: int = 0,
    ) -> None:
        if not isinstance(task_config, Mapping) or not task_config:
            raise ValueError(f"TaskSampler: task_config must be a non-empty dict of tasks, got {task_config!r}.")
        if method not in _METHODS:
            hint = " Task-parallel sample_repeat schedules are not supported." if method == "sample_repeat" else ""
            raise ValueError(f"TaskSampler: method must be one of {', '.join(_METHODS)}, got {method!r}.{hint}")
        self.task_config = {str(name): _task_options(str(name), value) for name, value in task_config.items()}
        self.method = method
        self.shuffle = shuffle
        self.seed = seed
        self.unions = [list(u) for u in unions] if unions is not None else None
        if method == "sample_part":
            if not self.unions:
                raise ValueError("TaskSampler(method='sample_part') needs unions, e.g. [['a', 'b'], ['c']].")
            for union in self.unions:
                missing = [t for t in union if t not in self.task_config]
                if missing or not union:
                    raise ValueError(
                        f"TaskSampler: union {union!r} names tasks {missing} that task_config does not "
                        f"define ({', '.join(self.task_config)}); every union needs at least one task."
                    )
        elif unions is not None:
            raise ValueError(f"TaskSampler: unions are used only with method='sample_part', not {method!r}.")
        self.cycle = self._expand()
        if not self.cycle:
            raise ValueError("TaskSampler: every task has sampling_factor=0; give at least one task a positive factor.")
        self._rng = random.Random(seed)
        self._position = 0  # index of the next draw within the current cycle
        self._order = list(range(len(self.cycle)))

    @property
    def tasks(self) -> list[str]:
        """The task names, in config order."""
        return list(self.task_config)

    def fresh_copy(self) -> TaskSampler:
        """A new sampler with this one's settings, at its start (position 0, generator seeded)."""
        config = {name: {k: v for k, v in opts.items()} for name, opts in self.task_config.items()}
        return TaskSampler(config, method=self.method, shuffle=self.shuffle, unions=self.unions, seed=self.seed)

    def is_parallel(self) -> bool:
        """Whether tasks are split across process groups (task parallelism): never, here."""
        return False

    def _expand(self) -> list[list[str]]:
        factor = {name: opts["sampling_factor"] for name, opts in self.task_config.items()}
        if self.method == "sample_all":
            union = [name for name in self.task_config for _ in range(factor[name])]
            return [union] if union else []
        if self.method == "sample_part":
            return [[t for t in union for _ in range(factor[t])] for union in self.unions or []]
        return [[name] for name in self.task_config for _ in range(factor[name])]

    def _valid(self, name: str, epoch: int | None, step: int | None) -> bool:
        opts = self.task_config[name]
        for value, first, last in ((epoch, "start_epoch", "end_epoch"), (step, "start_step", "end_step")):
            if value is not None and (value < opts[first] or 0 <= opts[last] <= value):
                return False
        return True

    def _next_union(self) -> list[str]:
        if self.method == "sample_random":  # the cycle holds each task sampling_factor times
            return self._rng.choice(self.cycle)
        if self._position == 0 and self.shuffle:
            self._rng.shuffle(self._order)
        union = self.cycle[self._order[self._position]]
        self._position = (self._position + 1) % len(self.cycle)
        return union

    def sample_task(self, epoch: int | None = None, step: int | None = None) -> list[str]:
        """The tasks of the next step, in the order their batches run.

        Args:
            epoch: 0-based epoch of the step; tasks outside their epoch range are left out.
            step: 0-based global step; tasks outside their step range are left out.

        Raises:
            ValueError: no task trains at this epoch/step.
        """
        for _ in range(max(len(self.cycle), 1) * 4 if self.method == "sample_random" else len(self.cycle)):
            union = [t for t in self._next_union() if self._valid(t, epoch, step)]
            if union:
                return union
        raise ValueError(
            f"TaskSampler: no task trains at epoch={epoch}, step={step}; check the tasks' "
            f"start/end epochs and steps in task_config."
        )

    def state_dict(self) -> dict[str, Any]:
        """The sampler's position and generator state (ints and lists only)."""
        version, internal, gauss = self._rng.getstate()
        return {"position": self._position, "order": list(self._order),
                "rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict`."""
        self._position = int(state["position"])
        self._order = [int(i) for i in state["order"]]
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))

    def __repr__(self) -> str:
        return f"TaskSampler(tasks={self.tasks}, method={self.method!r}, shuffle={self.shuffle}, seed={self.seed})"
