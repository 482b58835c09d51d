"""HAT helper functions that user callback and model files import, with HAT's signatures.

Served through the ``hat`` import alias (:mod:`hat_ignite.hat_alias`) as ``hat.registry``'s
``build_from_cfg`` / ``build_from_registry``, ``hat.utils.apply_func``'s ``_as_list`` /
``apply_to_collection`` / ``to_cuda``, ``hat.utils.distributed``'s ``get_dist_info`` /
``rank_zero_only`` and ``hat.utils.logger``'s ``rank_zero_info`` / ``MSGColor`` / ``format_msg``.
Nothing here runs on the engine's per-step path. Importing this module imports nothing heavy.
"""

from __future__ import annotations

import enum
import functools
import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Callable

__all__ = [
    "hat_build_from_cfg", "build_from_registry", "as_list", "apply_to_collection", "to_cuda",
    "get_dist_info", "rank_zero_only", "rank_zero_info", "MSGColor", "format_msg",
]

logger = logging.getLogger("hat_ignite.hat_compat")


def hat_build_from_cfg(registry: Any, cfg: Mapping[str, Any]) -> Any:
    """HAT's ``build_from_cfg(registry, cfg)``: build one object, its arguments as they are.

    Example:
        >>> from hat_ignite.registry import OBJECT_REGISTRY
        >>> hat_build_from_cfg(OBJECT_REGISTRY, {"type": "fractions.Fraction", "numerator": 1, "denominator": 4})
        Fraction(1, 4)
    """
    from hat_ignite.registry import Registry

    if not isinstance(registry, Registry):
        raise TypeError(f"build_from_cfg(registry, cfg): expected a Registry first, got {type(registry).__name__}.")
    if not isinstance(cfg, Mapping) or "type" not in cfg:
        raise TypeError(f"build_from_cfg(registry, cfg): cfg must be a dict with a 'type' key, got {cfg!r:.80}.")
    target = registry.resolve(cfg["type"])
    return target(**{k: v for k, v in cfg.items() if k != "type"})


def build_from_registry(cfg: Any) -> Any:
    """HAT's ``build_from_registry(x)``: build every ``type`` dict in ``x``, depth first."""
    from hat_ignite.registry import build_from_cfg

    return build_from_cfg(cfg)


def as_list(obj: Any) -> Sequence[Any]:
    """HAT's ``_as_list``: a list or tuple as it is, a set as a list, anything else in a list.

    >>> as_list((1, 2)), as_list({3}), as_list("ab"), as_list(None)
    ((1, 2), [3], ['ab'], [None])
    """
    if isinstance(obj, (list, tuple)):
        return obj
    if isinstance(obj, set):
        return list(obj)
    return [obj]


def apply_to_collection(
    data: Any, dtype: type | tuple[type, ...], function: Callable, *args: Any,
    wrong_dtype: type | tuple[type, ...] | None = None, **kwargs: Any,
) -> Any:
    """Apply ``function`` to every element of type ``dtype`` inside nested dicts, lists and tuples.

    >>> apply_to_collection({"a": [1, 2.5], "b": (3, "x")}, int, lambda v: v * 10)
    {'a': [10, 2.5], 'b': (30, 'x')}
    """
    if isinstance(data, dtype) and (wrong_dtype is None or not isinstance(data, wrong_dtype)):
        return function(data, *args, **kwargs)
    again = functools.partial(apply_to_collection, dtype=dtype, function=function, wrong_dtype=wrong_dtype)
    if isinstance(data, Mapping):
        return type(data)({k: again(v, *args, **kwargs) for k, v in data.items()})  # type: ignore[call-arg]
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(again(v, *args, **kwargs) for v in data))
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        return type(data)([again(v, *args, **kwargs) for v in data])  # type: ignore[call-arg]
    return data


def to_cuda(obj: Any, device: Any = None, non_blocking: bool = False, inplace: bool = False) -> Any:
    """HAT's ``to_cuda``: the tensors of a nested structure on a CUDA device.

    An optimizer (``inplace=True``, as HAT requires) has its state tensors moved in place.
    """
    import torch

    if isinstance(obj, torch.optim.Optimizer):
        if not inplace:
            raise ValueError("to_cuda(optimizer) moves its state in place: pass inplace=True.")
        for state in obj.state.values():
            for key, value in state.items():
                if torch.is_tensor(value):
                    state[key] = value.cuda(device, non_blocking)
        return obj
    return apply_to_collection(obj, torch.Tensor, lambda t: t.cuda(device, non_blocking))


def get_dist_info() -> tuple[int, int]:
    """HAT's ``get_dist_info()``: ``(rank, world_size)``; ``(0, 1)`` outside a process group.

    >>> get_dist_info()
    (0, 1)
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def rank_zero_only(fn: Callable) -> Callable:
    """Decorate ``fn`` to run on rank 0 only (other ranks get ``None``).

    >>> rank_zero_only(lambda: "ran")()
    'ran'
    """

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs) if get_dist_info()[0] == 0 else None

    return wrapped


def rank_zero_info(msg: str, *args: Any) -> None:
    """Log ``msg`` at INFO level on rank 0 only, under the calling module's logger and line.

    A user callback's ``rank_zero_info("...")`` shows as coming from that callback's module, as
    its own ``logging.getLogger(__name__).info`` would.
    """
    if get_dist_info()[0] != 0:
        return
    caller = sys._getframe(1).f_globals.get("__name__", logger.name)
    logging.getLogger(caller).info(msg, *args, stacklevel=2)


class MSGColor(enum.Enum):
    """ANSI colours of :func:`format_msg`."""

    BLACK = 30
    RED = 31
    GREEN = 32
    YELLOW = 33
    BLUE = 34
    PURPLE = 35
    CYAN = 36
    WHITE = 37


def format_msg(msg: str, color: MSGColor) -> str:
    """``msg`` in an ANSI colour.

    >>> format_msg("ok", MSGColor.GREEN)
    '\\x1b[32mok\\x1b[0m'
    """
    return f"\033[{color.value}m{msg}\033[0m"
