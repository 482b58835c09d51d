"""Optimizers from configs, HAT style: the model's parameters by default, or groups by name pattern."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from hat_ignite.registry import build_from_cfg, config_error

__all__ = ["build_optimizer"]


def _param_groups(model: Any, groups: Mapping[str, Any], rest_decay: Any, key_path: str) -> list[dict[str, Any]]:
    """Split ``model``'s trainable parameters into groups by the first matching name pattern."""
    compiled: list[tuple[str, re.Pattern[str], dict[str, Any], list[Any]]] = []
    for pattern, options in groups.items():
        where = f"{key_path}.params[{pattern!r}]"
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise config_error(where, f"{pattern!r} is not a valid regular expression: {exc}.") from None
        if not isinstance(options, Mapping):
            raise config_error(where, f"options must be a dict such as {{'weight_decay': 0.0}}, got {options!r}.")
        compiled.append((pattern, regex, dict(options), []))
    rest = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        for _, regex, _, members in compiled:
            if regex.search(name):
                members.append(param)
                break
        else:
            rest.append(param)
    unmatched = [p for p, _, _, members in compiled if not members]
    if unmatched:
        names = [n for n, _ in model.named_parameters()][:8]
        raise config_error(
            f"{key_path}.params",
            f"the pattern(s) {', '.join(map(repr, unmatched))} match no trainable parameter of "
            f"{type(model).__name__} (parameter names look like {names}). Fix or remove the pattern.",
        )
    out = [{"params": members, **options} for _, _, options, members in compiled]
    if rest:
        out.append({"params": rest, "weight_decay": rest_decay})
    return out


def build_optimizer(cfg: Mapping[str, Any], model: Any, key_path: str = "optimizer") -> Any:
    """Build an optimizer config for ``model``, HAT style.

    ``params`` decides what the optimizer updates:

    * absent: ``model.parameters()``;
    * a dict ``{name_regex: {option: value}}``: parameter groups. Each trainable parameter goes to
      the first pattern that ``re.search``-es its name (``model.named_parameters()``) and gets that
      pattern's options; the others form a last group with the config's ``weight_decay``, or 0
      where the config gives none (HAT's rule, also for optimizers whose own default is not 0,
      such as AdamW), and its other defaults. A pattern that matches nothing is an error (usually
      a typo);
    * anything else (a list of tensors or of torch param-group dicts): passed as it is.

    Args:
        cfg: the optimizer config, e.g. ``{"type": "torch.optim.SGD", "lr": 0.1}``.
        model: the ``torch.nn.Module`` to optimize.
        key_path: where the config sits, for error messages.

    Returns:
        The optimizer.

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
        >>> opt = build_optimizer(
        ...     {"type": "torch.optim.SGD", "lr": 0.1, "weight_decay": 1e-4,
        ...      "params": {r"^1\\.": {"weight_decay": 0.0}}}, net)
        >>> [(len(g["params"]), g["weight_decay"]) for g in opt.param_groups]
        [(2, 0.0), (2, 0.0001)]
    """
    if not isinstance(cfg, Mapping) or "type" not in cfg:
        raise config_error(key_path, f"an optimizer config is a dict with a 'type' key, got {cfg!r}.")
    cfg = dict(cfg)
    params: Any = cfg.pop("params", None)
    if params is None:
        params = model.parameters()
    elif isinstance(params, Mapping):
        params = _param_groups(model, params, cfg.get("weight_decay", 0), key_path)
    elif not isinstance(params, Iterable):
        raise config_error(
            f"{key_path}.params",
            f"expected a dict {{name_regex: options}}, a list of parameters or param groups, got {params!r}.",
        )
    return build_from_cfg(cfg, key_path=key_path, default_args={"params": params})
