"""Putting a saved optimizer state back, refusing one that does not belong to the run's optimizer.

``torch.optim.Optimizer.load_state_dict`` checks only the number and sizes of the parameter
groups: the state of an ``Adam`` with the same groups loads into an ``SGD`` and the first step
then fails with ``KeyError: 'momentum'``, naming neither the checkpoint nor the cause.
:func:`load_optimizer_state` checks, before any step:

- the optimizer type, when the checkpoint records it (``optimizer_type``);
- the number of parameter groups and of parameters in each;
- the options of each group (``lr``, ``momentum``, ``betas`` ...): every option the run's
  optimizer reads must be there once loaded;
- the per-parameter state: the keys kept for each parameter (``momentum_buffer``;
  ``exp_avg`` and ``exp_avg_sq`` ...) must be those the run's optimizer keeps with the loaded
  options, and tensors shaped like a parameter must have its shape.

The options are the config's. ``torch.optim.Optimizer.load_state_dict`` would put the saved
``lr``, ``momentum``, ``weight_decay``, ``fused`` ... back over those the run was built with, so a
config changed for the resume (a lower lr to fine-tune, no momentum, fused or plain SGD) would be
ignored without a word; and a ``fused=True`` optimizer given a plain one's ``fused=False`` fails
at its first step. :func:`run_options_over` therefore writes the run's options into the saved
parameter groups before they are loaded, and reports each change (:class:`OptionChange`), which
the resume logs: the per-parameter state (momentum buffers, moments, step counts) carries over,
a state the new options no longer use (momentum buffers with ``momentum=0``) is dropped, and a
state the new options need but the checkpoint lacks (``amsgrad`` turned on) is refused.

>>> import torch
>>> w = torch.nn.Parameter(torch.ones(2))
>>> adam = torch.optim.Adam([w]); w.grad = torch.ones(2); adam.step()
>>> sgd = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1, momentum=0.9)
>>> load_optimizer_state(sgd, adam.state_dict(), "/ckpt/a.pth.tar", saved_type="Adam")
Traceback (most recent call last):
  ...
hat_ignite.errors.CheckpointError: Checkpoint /ckpt/a.pth.tar: the saved optimizer state belongs to Adam, but this run's optimizer is SGD. ...
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from hat_ignite.errors import CheckpointError

__all__ = ["OptionChange", "load_optimizer_state", "run_options_over"]

logger = logging.getLogger(__name__)

_HOW = ("Resume with the optimizer that wrote it, or set resume_optimizer=False to start the optimizer afresh "
        "(the model weights and the progress are still restored).")
_NOT_OPTIONS = ("params", "param_names", "initial_lr")
_MISSING = object()
_HOW_COMPUTED = ("foreach", "fused", "capturable", "differentiable")


class OptionChange(NamedTuple):
    """An optimizer option the run's config sets to another value than the checkpoint holds."""

    name: str
    saved: Any
    config: Any
    groups: tuple[int, ...]
    dropped_state: tuple[str, ...] = ()

    def describe(self) -> str:
        """One log line: the option, checkpoint -> config, the groups, and what was done.

        >>> print(OptionChange("momentum", 0.9, 0.0, (0, 1), ("momentum_buffer",)).describe())
        optimizer option momentum: checkpoint 0.9 -> config 0.0 (param groups 0, 1): the config's value is used; the saved momentum_buffer state is dropped (these options keep none)
        """
        groups = ", ".join(map(str, self.groups))
        what = {
            "lr": "the config's value is used as the base lr (an lr updater schedules from it)",
            "fused": "the config's value is used (how the update is computed; the saved state carries over)",
            "foreach": "the config's value is used (how the update is computed; the saved state carries over)",
        }.get(self.name, "the config's value is used")
        if self.dropped_state:
            what += f"; the saved {', '.join(self.dropped_state)} state is dropped (these options keep none)"
        return (f"optimizer option {self.name}: checkpoint {_shown(self.saved)} -> config {_shown(self.config)} "
                f"(param group{'s' if len(self.groups) > 1 else ''} {groups}): {what}")


def _shown(value: Any) -> str:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return repr(value.item())
    return repr(value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        try:
            return bool(torch.equal(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)))
        except (TypeError, RuntimeError):
            return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values that do not compare are different
        return False


def run_options_over(
    optimizer: torch.optim.Optimizer, saved: Mapping[str, Any], path: str,
) -> tuple[dict[str, Any], list[OptionChange]]:
    """``saved`` (an optimizer state dict) with ``optimizer``'s own options in its param groups.

    The options compared are those of ``optimizer.defaults`` that the saved groups have (a
    saved group lacking one is left for :func:`load_optimizer_state` to refuse). The base lr is
    compared: the saved group's ``initial_lr`` (set by an lr updater) when it has one, else its
    ``lr``. A changed option takes the run's value, and so does its ``initial_<option>`` entry
    where the saved group has one (``initial_lr``, which the lr updaters schedule from).

    Returns:
        The state dict to load (``saved`` itself when nothing changed) and the changes.

    Raises:
        CheckpointError: the new options need per-parameter state the checkpoint lacks.

    >>> w = torch.nn.Parameter(torch.ones(2))
    >>> old = torch.optim.SGD([w], lr=0.1, momentum=0.9); w.grad = torch.ones(2); old.step()
    >>> new = torch.optim.SGD([w], lr=0.01, momentum=0.9)
    >>> merged, changes = run_options_over(new, old.state_dict(), "/ckpt/a.pth.tar")
    >>> [(c.name, c.saved, c.config) for c in changes], merged["param_groups"][0]["lr"]
    ([('lr', 0.1, 0.01)], 0.01)
    """
    groups = saved.get("param_groups")
    state = saved.get("state")
    if not isinstance(optimizer, torch.optim.Optimizer) or not isinstance(groups, list) \
            or not isinstance(state, Mapping) or len(groups) != len(optimizer.param_groups):
        return dict(saved), []  # load_optimizer_state names what is wrong
    found: dict[str, dict[str, Any]] = {}
    new_groups = []
    new_state = dict(state)
    for i, (own, old) in enumerate(zip(optimizer.param_groups, groups)):
        if not isinstance(old, Mapping):
            return dict(saved), []
        group = dict(old)
        changed_here = False
        for key in optimizer.defaults:
            if key in _NOT_OPTIONS or key not in old:
                continue
            mine = own.get(key, _MISSING)
            if mine is _MISSING:
                continue
            theirs = old.get("initial_lr", old[key]) if key == "lr" else old[key]
            if key == "lr":
                mine = own.get("initial_lr", mine)
            if _same(mine, theirs):
                continue
            group[key] = own[key] if key != "lr" else mine
            if f"initial_{key}" in group:
                group[f"initial_{key}"] = mine[0] if isinstance(mine, (list, tuple)) else mine
            entry = found.setdefault(key, {"saved": theirs, "config": mine, "groups": [], "dropped": set()})
            entry["groups"].append(i)
            changed_here = True
        if changed_here:
            keys = _expected_state_keys(optimizer, group)
            for index in group.get("params", ()):
                param_state = new_state.get(index)
                if not isinstance(param_state, Mapping) or not param_state or keys is None:
                    continue
                lacking = sorted(keys - set(param_state))
                changed = [k for k, v in found.items() if i in v["groups"]]
                if lacking:
                    raise _refuse(path, f"cannot take this run's optimizer options: the config changes "
                                        f"{', '.join(changed)} of param group {i}, which then needs the state "
                                        f"{lacking} the checkpoint does not have")
                extra = set(param_state) - keys
                if extra:
                    new_state[index] = {k: v for k, v in param_state.items() if k in keys}
                    owners = [k for k in changed if k not in _HOW_COMPUTED and k not in ("lr", "weight_decay")]
                    for key in owners or changed:
                        found[key]["dropped"].update(extra)
        new_groups.append(group)
    if not found:
        return dict(saved), []
    changes = [OptionChange(k, v["saved"], v["config"], tuple(v["groups"]), tuple(sorted(v["dropped"])))
               for k, v in found.items()]
    return {**saved, "state": new_state, "param_groups": new_groups}, changes


def _refuse(path: str, what: str) -> CheckpointError:
    return CheckpointError(f"Checkpoint {path}: the saved optimizer state {what}. {_HOW}")


def _check_groups(optimizer: torch.optim.Optimizer, saved: Mapping[str, Any], path: str) -> None:
    groups = saved.get("param_groups")
    if not isinstance(groups, list) or not isinstance(saved.get("state"), Mapping):
        raise _refuse(path, "is not an optimizer state dict (no 'state' and 'param_groups')")
    own = optimizer.param_groups
    if len(groups) != len(own):
        raise _refuse(path, f"has {len(groups)} parameter group(s), this run's {type(optimizer).__name__} has "
                            f"{len(own)}")
    sizes = [len(g.get("params", ())) for g in groups]
    own_sizes = [len(g["params"]) for g in own]
    if sizes != own_sizes:
        raise _refuse(path, f"has parameter groups of sizes {sizes}, this run's {type(optimizer).__name__} has "
                            f"{own_sizes}")


def _check_options(optimizer: torch.optim.Optimizer, path: str, saved_type: str | None) -> None:
    """After loading: every option the optimizer reads is in every group."""
    for i, group in enumerate(optimizer.param_groups):
        missing = sorted(k for k in optimizer.defaults if k not in group)
        if missing:
            of = f"belongs to {saved_type}" if saved_type else "belongs to another optimizer type"
            raise _refuse(path, f"{of}: its parameter group {i} lacks the option(s) {missing} this run's "
                                f"{type(optimizer).__name__} needs")


def _expected_state_keys(optimizer: torch.optim.Optimizer, group: Mapping[str, Any]) -> set[str] | None:
    """The per-parameter state keys ``optimizer``'s type keeps with ``group``'s options.

    Found by one step of a fresh optimizer of the same type on a one-element parameter;
    ``None`` when that cannot be done (an optimizer needing a closure or other arguments).
    """
    probe_param = torch.nn.Parameter(torch.zeros(1))
    options = {k: group[k] for k in optimizer.defaults if k in group}
    for key, plain in (("foreach", None), ("fused", None), ("capturable", False), ("differentiable", False)):
        if key in options:  # the probe runs on the CPU, in the default implementation
            options[key] = plain
    try:
        probe = type(optimizer)([probe_param], **options)
        probe_param.grad = torch.zeros(1)
        probe.step()
    except Exception as exc:  # an optimizer that cannot be probed this way is not checked
        logger.debug("optimizer state keys not checked (%s probe: %s)", type(optimizer).__name__, exc)
        return None
    state = probe.state.get(probe_param)
    return set(state) if state is not None else set()


def _check_state(optimizer: torch.optim.Optimizer, path: str, saved_type: str | None) -> None:
    """After loading: per-parameter state keys and tensor shapes."""
    of = f"belongs to {saved_type}" if saved_type else "belongs to another optimizer type, or to other options"
    for i, group in enumerate(optimizer.param_groups):
        states = [(p, optimizer.state[p]) for p in group["params"] if p in optimizer.state]
        if not states:
            continue
        expected = _expected_state_keys(optimizer, group)
        for n, (param, state) in enumerate(states):
            keys = set(state)
            if expected is not None and keys != expected:
                raise _refuse(path, f"{of}: parameter {n} of group {i} has the state {sorted(keys)}, this run's "
                                    f"{type(optimizer).__name__} keeps {sorted(expected)}")
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                    raise _refuse(path, f"does not fit the model: state {key!r} of parameter {n} of group {i} has "
                                        f"shape {tuple(value.shape)}, the parameter {tuple(param.shape)}")


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, saved: Any, path: str, saved_type: str | None = None,
    run_options: bool = False,
) -> list[OptionChange]:
    """Load ``saved`` into ``optimizer`` after checking that it belongs to it (see the module docstring).

    Args:
        optimizer: the run's optimizer.
        saved: the checkpoint's ``optimizer`` entry (an optimizer ``state_dict``).
        path: the checkpoint's path, named in errors.
        saved_type: the optimizer class name the checkpoint records (``None``: not recorded).
        run_options: keep ``optimizer``'s own options (lr, momentum, fused ...) instead of the
            saved ones (:func:`run_options_over`), as a resume does.

    Returns:
        The options whose saved value was replaced by the run's (``[]`` without ``run_options``).

    An optimizer that is not a ``torch.optim.Optimizer`` (a wrapper of its own) is only loaded,
    its errors named.

    Raises:
        CheckpointError: names ``path`` and the difference. The optimizer may hold part of the
            refused state afterwards: the run must not go on with it.
    """
    own_type = type(optimizer).__name__
    if saved_type is not None and saved_type != own_type:
        raise _refuse(path, f"belongs to {saved_type}, but this run's optimizer is {own_type}")
    if not isinstance(saved, Mapping):
        raise _refuse(path, f"is a {type(saved).__name__}, not an optimizer state dict")
    if not isinstance(optimizer, torch.optim.Optimizer):  # a wrapper of its own: only its load is checked
        try:
            optimizer.load_state_dict(saved)
        except (ValueError, KeyError, RuntimeError, TypeError) as exc:
            raise _refuse(path, f"does not load into this run's {own_type} ({type(exc).__name__}: {exc})") from exc
        return []
    _check_groups(optimizer, saved, path)
    changes: list[OptionChange] = []
    if run_options:
        saved, changes = run_options_over(optimizer, saved, path)
    try:
        optimizer.load_state_dict(dict(saved))  # torch takes a (shallow) copy of it anyway
    except (ValueError, KeyError, RuntimeError, TypeError) as exc:
        raise _refuse(path, f"does not load into this run's {own_type} ({type(exc).__name__}: {exc})") from exc
    _check_options(optimizer, path, saved_type)
    _check_state(optimizer, path, saved_type)
    return changes
