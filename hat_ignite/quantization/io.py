"""Saving and loading int8 models as ``torch.export`` programs, and measuring them.

An int8 model is saved whole, in eval mode, with :func:`torch.export.save` (a ``.pt2`` archive:
graph, int8 weights and quantization parameters, no pickled Python objects), written crash-safely
next to the destination and renamed into place. :func:`load_quantized_model` gives back a module
that computes the same outputs, in a fresh process, without the model's Python code.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from typing import Any, Union

import torch
from torch import fx, nn

from hat_ignite.errors import CheckpointError
from hat_ignite.quantization.capture import export_module, model_args
from hat_ignite.quantization.timed import timed
from hat_ignite.quantization.used_inputs import keep_keys, unused_entries, without_entries
from hat_ignite.quantization.torchao_import import import_torchao
from hat_ignite.regular_files import open_regular

__all__ = ["save_quantized_model", "load_quantized_model", "file_sha256", "tensor_bytes"]

PathLike = Union[str, "os.PathLike[str]"]

logger = logging.getLogger(__name__)


def file_sha256(path: PathLike) -> str:
    """SHA-256 (hex) of a file's bytes.

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile(delete=False) as f:
    ...     _ = f.write(b"abc")
    >>> file_sha256(f.name)[:16]
    'ba7816bf8f01cfea'
    """
    h = hashlib.sha256()
    with open_regular(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tensor_bytes(model: nn.Module) -> int:
    """Bytes of every tensor a model holds: parameters, buffers and plain tensor attributes
    (where a converted graph keeps its int8 weights), each counted once.

    >>> tensor_bytes(nn.Linear(4, 2))   # 8 weights + 2 biases, float32
    40
    """
    seen: dict[int, int] = {}
    for module in model.modules():
        for value in list(module._parameters.values()) + list(module._buffers.values()) + list(vars(module).values()):
            if isinstance(value, torch.Tensor):
                seen[id(value)] = value.numel() * value.element_size()
    return sum(seen.values())


def _umask() -> int:
    """The process's file-creation mask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_quantized_model(model: nn.Module, path: PathLike, example_inputs: Any) -> str:
    """Export ``model`` in eval mode on ``example_inputs`` and save the program to ``path``.

    Args:
        model: the model, usually after ``QAT2Quantize`` (a float model saves too).
        path: the ``.pt2`` file to write; its directory is created.
        example_inputs: one batch as the batch processor passes it (batch size may vary later).

    Returns:
        The absolute path written.

    Raises:
        QuantizationError: the model cannot be exported (names the module and the op).
        CheckpointError: the file cannot be written.
    """
    path = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    modes = {m: m.training for m in model.modules()}
    exported = _loadable(model).eval()
    try:
        with timed(logger, "save_quantized_model: exporting %s for %s", type(model).__name__, path):
            args = model_args(example_inputs)
            program = export_module(exported, args, {}, "", "save_quantized_model")
            unused = unused_entries(program, args, {})
            if unused:  # a batch's labels, say: the program takes what the model uses
                program = export_module(exported, without_entries(args, unused), {}, "", "save_quantized_model")
    finally:
        for m, training in modes.items():
            m.training = training
    from hat_ignite.callbacks.checkpoint_io import atomic_link

    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp.pt2", dir=directory)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; the model file is like the others
    try:
        torch.export.save(program, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        atomic_link(tmp, path)
    except OSError as exc:
        raise CheckpointError(f"Could not write the int8 model {path}: {exc}. Check free space and permissions.") from exc
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


class _Model(nn.Module):
    """``model`` one level down, so that none of its own names is at the top of the saved program."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)


def _loadable(model: nn.Module) -> nn.Module:
    """``model``, or ``model`` wrapped when a top-level name of its would hide one of ``GraphModule``'s.

    A loaded program becomes a ``torch.fx.GraphModule`` holding the model's weights under their
    names; a whole model prepared for int8 (a :class:`~.prepared.PreparedModule`) keeps its
    weights under ``graph.``, which is the ``GraphModule``'s own graph, and the program would not
    load ("references nonexistent attribute ... of graph").
    """
    names = [name for name, _ in model.named_children()]
    names += [name for name, _ in model.named_parameters(recurse=False)]
    names += [name for name, _ in model.named_buffers(recurse=False)]
    program = fx.GraphModule(nn.Module(), fx.Graph())  # what a loaded program is
    return _Model(model) if any(hasattr(program, name) for name in names) else model


def load_quantized_model(path: PathLike) -> nn.Module:
    """Load a model saved by :func:`save_quantized_model`; ``eval()`` / ``train()`` work on it.

    Raises:
        CheckpointError: the file is missing or is not a saved program; names the path.
    """
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise CheckpointError(
            f"int8 model {path} does not exist. It is written by the int_infer stage "
            f"(hat-predict CONFIG --stage int_infer) or by save_quantized_model()."
        )
    import_torchao()  # registers the quantize/dequantize ops
    from torchao.quantization.pt2e import allow_exported_model_train_eval

    try:
        program = torch.export.load(path)
    except Exception as exc:  # torch raises many types for bad archives
        raise CheckpointError(
            f"Cannot load the int8 model {path}: {type(exc).__name__}: {str(exc).strip()[:300]}. It is "
            f"not a complete torch.export archive; write it again with save_quantized_model()."
        ) from exc
    module = program.module()
    allow_exported_model_train_eval(module)
    keys = _dict_input_keys(program)
    if keys is not None:  # called with a whole batch, as the model was: the entries it uses are passed on
        module.register_forward_pre_hook(_KeepKeys(keys), with_kwargs=True, prepend=True)  # before its input check
    module.eval()
    return module


def _dict_input_keys(program: torch.export.ExportedProgram) -> list[frozenset | None] | None:
    """The keys each dict argument of the program takes (``None`` where an argument is no dict)."""
    spec = program.call_spec.in_spec
    if spec is None or not _children(spec):
        return None
    keys = [frozenset(a.context) if a.type is dict else None for a in _children(_children(spec)[0])]
    return keys if any(k is not None for k in keys) else None


def _children(spec: Any) -> list[Any]:
    """A pytree spec's child specs: ``children()`` where torch has it (2.14 warns on ``children_specs``)."""
    return list(spec.children()) if hasattr(spec, "children") else list(spec.children_specs)


class _KeepKeys:
    """A forward pre-hook cutting each dict argument down to the keys the program takes."""

    def __init__(self, keys: list[frozenset | None]) -> None:
        self.keys = keys

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return keep_keys(args, self.keys), kwargs
