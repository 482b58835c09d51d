"""Saving and loading int8 models as ``torch.export`` programs, and measuring them.

An int8 model is saved whole, in eval mode, with :func:`torch.export.save` (a ``.pt2`` archive:
graph, int8 weights and quantization parameters, no pickled Python objects, and the content hash
hat-ignite records in it), written crash-safely next to the destination and renamed into place
(:mod:`hat_ignite.pt2`). :func:`load_quantized_model` checks the file (nothing pickled, no code,
content as recorded) and gives back a module that computes the same outputs, in a fresh process,
without the model's Python code.
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Any, Union

import torch
from torch import fx, nn

from hat_ignite.quantization.capture import export_module, model_args
from hat_ignite.quantization.timed import timed
from hat_ignite.quantization.used_inputs import keep_keys, unused_entries, without_entries
from hat_ignite.quantization.inductor import LoadedProgram
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


def save_quantized_model(model: nn.Module, path: PathLike, example_inputs: Any) -> str:
    """Export ``model`` in eval mode on ``example_inputs`` and save the program to ``path``.

    The program takes what the model uses: entries of a dict batch the model never reads (a
    batch's labels) are left out of its inputs, and the loaded program still accepts a whole batch.

    Args:
        model: the model, usually after ``QAT2Quantize`` (a float model saves too).
        path: the ``.pt2`` file to write; its directory is created.
        example_inputs: one batch as the batch processor passes it (batch size may vary later).

    Returns:
        The absolute path written.

    Raises:
        QuantizationError: the model cannot be exported (names the module and the op).
        CheckpointError: the file cannot be written (or the program holds what
            :func:`load_quantized_model` refuses, such as a pickled tensor subclass).
    """
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
    from hat_ignite.pt2 import save_program

    return save_program(program, path)


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


def load_quantized_model(path: PathLike, sha256: Union[str, None] = None, inductor: bool | None = None) -> LoadedProgram:
    """Load a model saved by :func:`save_quantized_model`, in eval mode; ``eval()`` / ``train()``
    work on it.

    The file is checked before anything in it is deserialized (:func:`hat_ignite.pt2.load_program`):
    an archive holding a pickled entry, native code or a code string torch would evaluate is
    refused naming the entry, and the content must match the hash recorded inside the file
    when it was written. A ``.pt2`` written elsewhere records none: it loads with a warning,
    or is checked against ``sha256`` when given.

    In eval mode without gradients the program runs through inductor with freezing (int8
    kernels), compiled at the first call; where that cannot be built it runs as saved, with a log
    line saying why (see ``hat_ignite.quantization.inductor``). The program as saved is the
    returned module's ``program``. Called with a whole batch, it passes on the entries the
    program takes.

    Args:
        path: the ``.pt2`` file.
        sha256: the expected SHA-256 (hex) of the whole file (e.g. ``lineage.json``'s), optional.
        inductor: ``False`` runs the program as saved; ``None`` (default): through inductor
            unless the environment variable ``HAT_IGNITE_INT8_INDUCTOR`` is ``0``.

    Raises:
        CheckpointError: the file is missing, is not a saved program, holds something that
            would run code, or does not match its hash; names the path.
    """
    from hat_ignite.pt2 import load_program

    import_torchao()  # registers the quantize/dequantize ops
    from torchao.quantization.pt2e import allow_exported_model_train_eval

    program = load_program(path, sha256=sha256)
    module = program.module()
    allow_exported_model_train_eval(module)
    keys = _dict_input_keys(program)
    if keys is not None:  # called with a whole batch, as the model was: the entries it uses are passed on
        module.register_forward_pre_hook(_KeepKeys(keys), with_kwargs=True, prepend=True)  # before its input check
    return LoadedProgram(module, f"the int8 model {os.path.abspath(os.fspath(path))}", inductor).eval()


def _dict_input_keys(program: torch.export.ExportedProgram) -> list[frozenset | None] | None:
    """The keys each dict argument of the program takes (``None`` where an argument is no dict)."""
    spec = program.call_spec.in_spec
    children = _children(spec) if spec is not None else []
    if not children:
        return None
    keys = [frozenset(a.context) if a.type is dict else None for a in _children(children[0])]
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
