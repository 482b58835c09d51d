"""The arguments a loop takes as HAT gives them: metrics lists, config dicts, ``device`` ids."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["as_metric_list", "build_if_config", "resolve_device"]


def as_metric_list(obj: Any) -> Any:
    """``obj`` as HAT's loop stores metrics: a list or tuple as is, a set as a list, else ``[obj]``.

    A dict of metrics (``{"acc": Accuracy()}``, which HAT would wrap as ``[dict]``) is kept as is,
    so callbacks can still look metrics up by name.

    >>> as_metric_list(None), as_metric_list("m"), as_metric_list(["a", "b"]), as_metric_list({"acc": "m"})
    ([None], ['m'], ['a', 'b'], {'acc': 'm'})
    """
    if isinstance(obj, (list, tuple, dict)):
        return obj
    return list(obj) if isinstance(obj, set) else [obj]


def build_if_config(obj: Any, key: str, **default_args: Any) -> Any:
    """Build ``obj`` through the registry when it is a config dict (has a ``type`` key).

    Args:
        obj: an object, or a config dict such as ``{"type": "torch.optim.SGD", "lr": 0.1}``.
        key: the argument's name, used in error messages as the key path.
        default_args: arguments passed to the constructor when the config does not set them.

    Returns:
        ``obj`` itself when it is not a config dict, else the built object.
    """
    if isinstance(obj, dict) and "type" in obj:
        from hat_ignite.registry import build_from_cfg  # configs are optional: import on use

        return build_from_cfg(obj, key_path=key, default_args=default_args or None)
    if isinstance(obj, (list, tuple)) and any(isinstance(o, dict) and "type" in o for o in obj):
        return type(obj)(build_if_config(o, f"{key}[{i}]", **default_args) for i, o in enumerate(obj))
    return obj


def resolve_device(device: int | str | torch.device | None) -> torch.device:
    """Turn HAT's ``device`` argument into a :class:`torch.device`.

    ``None`` is the CPU and an int is a CUDA device id, as in HAT.

    >>> resolve_device(None)
    device(type='cpu')
    >>> resolve_device("cpu")
    device(type='cpu')
    """
    if device is None:
        return torch.device("cpu")
    if isinstance(device, bool):
        raise TypeError(f"device must be None (CPU) or an int GPU id, got {device!r}.")
    if isinstance(device, int):
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"device={device} asks for CUDA device {device}, but this torch has no usable CUDA "
                f"(torch {torch.__version__}). Use device=None to run on the CPU."
            )
        return torch.device("cuda", device)
    return torch.device(device)
