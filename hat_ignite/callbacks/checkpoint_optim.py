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
from typing import Any

import torch

from hat_ignite.errors import CheckpointError

__all__ = ["load_optimizer_state"]

logger = logging.getLogger(__name__)

_HOW = ("Resume with the optimizer that wrote it, or set resume_optimizer=False to start the optimizer afresh "
        "(the model weights and the progress are still restored).")
_NOT_OPTIONS = ("params", "param_names", "initial_lr")


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
) -> None:
    """Load ``saved`` into ``optimizer`` after checking that it belongs to it (see the module docstring).

    Args:
        optimizer: the run's optimizer.
        saved: the checkpoint's ``optimizer`` entry (an optimizer ``state_dict``).
        path: the checkpoint's path, named in errors.
        saved_type: the optimizer class name the checkpoint records (``None``: not recorded).

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
        return
    _check_groups(optimizer, saved, path)
    try:
        optimizer.load_state_dict(dict(saved))  # torch takes a (shallow) copy of it anyway
    except (ValueError, KeyError, RuntimeError, TypeError) as exc:
        raise _refuse(path, f"does not load into this run's {own_type} ({type(exc).__name__}: {exc})") from exc
    _check_options(optimizer, path, saved_type)
    _check_state(optimizer, path, saved_type)
