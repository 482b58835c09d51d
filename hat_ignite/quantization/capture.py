"""Graph capture for quantization: example batches, submodule inputs, and ``torch.export``.

The converters export a model (or the submodules named in ``modules``) with the inputs they
really receive on an example batch (see :mod:`~hat_ignite.quantization.examples` for where it
comes from): the model runs once in eval mode, forward pre-hooks record
each target's arguments, and each target is exported with its batch dimension dynamic. When
``torch.export`` fails, :func:`export_module` looks for the innermost submodule that fails on its
own and names it, with the source line torch reports, in a :class:`QuantizationError`.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from hat_ignite.errors import QuantizationError
from hat_ignite.pt2.export import export_program

__all__ = ["Captured", "model_args", "capture_inputs", "export_module", "varying_dims", "varying_leaves", "leaves_varying"]

logger = logging.getLogger(__name__)


class Captured(NamedTuple):
    """What a module received on its first call, and which tensor dims changed between its calls.

    ``varying`` maps ``id(tensor)`` of a tensor in ``args`` / ``kwargs`` to the dims (besides the
    batch dim, always dynamic) whose size differed in another call: a shared head called on every
    FPN level sees a new height and width each time, so those dims are exported dynamic.
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    varying: dict[int, tuple[int, ...]] = {}


def _tensor_leaves(args: tuple, kwargs: dict) -> list[Any]:
    return tree_flatten((tuple(args), dict(kwargs)))[0]


def varying_dims(calls: list[tuple[tuple, dict]]) -> dict[int, tuple[int, ...]]:
    """``{id(tensor of the first call): dims}``: the dims whose size differs in a later call.

    >>> a, b = torch.zeros(2, 8, 16, 16), torch.zeros(2, 8, 8, 8)
    >>> varying_dims([((a,), {}), ((b,), {})]) == {id(a): (2, 3)}
    True
    """
    first = _tensor_leaves(*calls[0])
    changed: dict[int, set[int]] = {}
    for args, kwargs in calls[1:]:
        leaves = _tensor_leaves(args, kwargs)
        if len(leaves) != len(first):
            continue  # another structure: the module is not stable, and is not prepared
        for i, (one, other) in enumerate(zip(first, leaves)):
            if isinstance(one, torch.Tensor) and isinstance(other, torch.Tensor) and one.dim() == other.dim():
                changed.setdefault(i, set()).update(d for d in range(1, one.dim()) if one.shape[d] != other.shape[d])
    return {id(first[i]): tuple(sorted(dims)) for i, dims in changed.items() if dims}


def varying_leaves(captured: Captured) -> list[list[int]]:
    """``varying`` as ``[leaf index, dim]`` pairs (leaves of ``(args, kwargs)`` flattened), for a record."""
    return [[i, d] for i, leaf in enumerate(_tensor_leaves(captured.args, captured.kwargs))
            for d in captured.varying.get(id(leaf), ())]


def leaves_varying(args: tuple, kwargs: dict, pairs: list[list[int]]) -> dict[int, tuple[int, ...]]:
    """The inverse of :func:`varying_leaves`, for inputs made from a record."""
    leaves = _tensor_leaves(args, kwargs)
    out: dict[int, list[int]] = {}
    for i, d in pairs:
        out.setdefault(id(leaves[i]), []).append(d)
    return {k: tuple(v) for k, v in out.items()}


def model_args(batch: Any) -> tuple[Any, ...]:
    """How the batch processors call the model: a list/tuple batch is unpacked, anything else passed whole.

    >>> model_args((1, 2)), model_args({"img": 0})
    ((1, 2), ({'img': 0},))
    """
    return tuple(batch) if isinstance(batch, (list, tuple)) else (batch,)


def _resolve(model: nn.Module, names: list[str], who: str) -> dict[str, nn.Module]:
    found = dict(model.named_modules())
    out = {}
    for name in names:
        if name not in found:
            children = sorted(n for n in found if n)[:12]
            raise QuantizationError(
                f"{who}: modules names {name!r}, which {type(model).__name__} does not have. Its "
                f"submodules include {children}; use dotted paths from model.named_modules()."
            )
        out[name] = found[name]
    return out


@torch.no_grad()
def capture_inputs(model: nn.Module, batches: list[Any], names: list[str], who: str) -> dict[str, Captured]:
    """Run ``model`` in eval mode on each of ``batches`` and record the arguments each named
    submodule gets first, and which of their dims change between its calls.

    ``""`` names the model itself. The model's train/eval flags are restored afterwards.

    Raises:
        QuantizationError: a name is not a submodule, or a named submodule never ran.
    """
    targets = _resolve(model, names, who)
    calls: dict[str, list[tuple[tuple, dict]]] = {}
    handles = []
    for name, module in targets.items():
        def hook(mod: nn.Module, args: tuple, kwargs: dict, _name: str = name) -> None:
            calls.setdefault(_name, []).append((args, kwargs))

        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        for batch in batches:
            model(*model_args(batch))
    except QuantizationError:
        raise
    except Exception as exc:
        raise QuantizationError(
            f"{who}: the model failed on the example batch before tracing ({type(exc).__name__}: "
            f"{exc}). Give example inputs the model accepts in eval mode."
        ) from exc
    finally:
        for handle in handles:
            handle.remove()
        for module, training in modes.items():
            module.training = training
    silent = [n for n in names if n not in calls]
    if silent:
        raise QuantizationError(
            f"{who}: {silent} never ran when the model ran on the example batch in eval mode, so "
            f"there is nothing to trace. Name submodules the forward calls."
        )
    return {name: Captured(*made[0], varying_dims(made)) for name, made in calls.items()}


def _dynamic(value: Any, varying: Mapping[int, tuple[int, ...]]) -> Any:
    """A dynamic-shapes spec mirroring ``value``: dim 0 of every tensor, and its ``varying`` dims, may vary."""
    from torch.export import Dim

    if isinstance(value, torch.Tensor):
        return {d: Dim.AUTO for d in (0, *varying.get(id(value), ()))} if value.dim() else None
    if isinstance(value, Mapping):
        return {k: _dynamic(v, varying) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_dynamic(v, varying) for v in value)
    return None


def _spec(module: nn.Module, args: tuple, kwargs: dict, varying: Mapping[int, tuple[int, ...]]) -> dict[str, Any] | None:
    try:
        bound = inspect.signature(module.forward).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return None
    return {name: _dynamic(value, varying) for name, value in bound.arguments.items()}


def _source_line(exc: BaseException) -> str:
    """The last user-code location torch reports in an export error, if any."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\w+)\n\s*(.+)', str(exc))
    own = [f for f in frames if "/torch/" not in f[0]]
    if not own:
        return ""
    path, line, func, code = own[-1]
    return f" at {path}:{line} in {func}: `{code.strip()}`"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    return f"{type(exc).__name__}: {line[:300]}"


def _try_export(module: nn.Module, args: tuple, kwargs: dict,
                varying: Mapping[int, tuple[int, ...]] | None = None) -> tuple[Any, BaseException | None]:
    try:
        program = export_program(
            module, args, kwargs, dynamic_shapes=_spec(module, args, kwargs, varying or {}), strict=False,
        )
    except Exception as exc:  # any capture failure; the caller reports it
        return None, exc
    return program, None


def _culprit(module: nn.Module, args: tuple, kwargs: dict, path: str, exc: BaseException) -> tuple[str, nn.Module, BaseException]:
    """The innermost submodule of ``module`` that fails to export on its own inputs."""
    children = [(f"{path}.{n}" if path else n, c) for n, c in module.named_children()]
    if not children:
        return path, module, exc
    try:
        inputs = _child_inputs(module, args, kwargs)
    except Exception:
        return path, module, exc
    for (child_path, child), (name, _) in zip(children, module.named_children()):
        if name not in inputs:
            continue
        child_args, child_kwargs = inputs[name]
        _, child_exc = _try_export(child, child_args, child_kwargs)
        if child_exc is not None:
            return _culprit(child, child_args, child_kwargs, child_path, child_exc)
    return path, module, exc


@torch.no_grad()
def _child_inputs(module: nn.Module, args: tuple, kwargs: dict) -> dict[str, tuple[tuple, dict]]:
    captured: dict[str, tuple[tuple, dict]] = {}
    handles = []
    for name, child in module.named_children():
        def hook(mod: nn.Module, a: tuple, k: dict, _name: str = name) -> None:
            captured.setdefault(_name, (a, k))

        handles.append(child.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        module(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return captured


def export_module(module: nn.Module, args: tuple, kwargs: dict, path: str, who: str,
                  varying: Mapping[int, tuple[int, ...]] | None = None) -> torch.export.ExportedProgram:
    """``torch.export`` ``module`` on its captured inputs, batch dimension dynamic.

    Args:
        module: the module to export (in the mode it should be captured in).
        args: its positional inputs.
        kwargs: its keyword inputs.
        path: its dotted path in the model (``""`` for the model), named in errors.
        who: the converter, named in errors.
        varying: further dims to export dynamic (see :class:`Captured`).

    Raises:
        QuantizationError: export failed; names the innermost submodule that fails on its own,
            the error torch gave and the source line it points to.
    """
    program, exc = _try_export(module, args, kwargs, varying)
    if exc is None:
        return program
    culprit_path, culprit, culprit_exc = _culprit(module, args, kwargs, path, exc)
    where = repr(path) if path else "the model"
    inner = (
        f" The innermost failing submodule is {culprit_path!r} ({type(culprit).__name__})"
        if culprit is not module else f" It fails in {type(module).__name__}.forward itself"
    )
    raise QuantizationError(
        f"{who}: torch.export cannot capture {where} ({type(module).__name__}).{inner}: "
        f"{_first_line(culprit_exc)}{_source_line(culprit_exc)}. Make that code traceable (no "
        f"data-dependent Python branches, .item(), .numpy() or prints of tensors in forward), or "
        f"leave it in float: name only the traceable submodules in modules=[...]."
    ) from culprit_exc
