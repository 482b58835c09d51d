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
import os
from typing import Any, Union

import torch
from torch import nn

from hat_ignite.quantization.capture import export_module, model_args
from hat_ignite.quantization.torchao_import import import_torchao
from hat_ignite.regular_files import open_regular

__all__ = ["save_quantized_model", "load_quantized_model", "file_sha256", "tensor_bytes"]

PathLike = Union[str, "os.PathLike[str]"]


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
    model.eval()
    try:
        program = export_module(model, model_args(example_inputs), {}, "", "save_quantized_model")
    finally:
        for m, training in modes.items():
            m.training = training
    from hat_ignite.pt2 import save_program

    return save_program(program, path)


def load_quantized_model(path: PathLike, sha256: Union[str, None] = None) -> nn.Module:
    """Load a model saved by :func:`save_quantized_model`; ``eval()`` / ``train()`` work on it.

    The file is checked before anything in it is deserialized (:func:`hat_ignite.pt2.load_program`):
    an archive holding a pickled entry, native code or a code string torch would evaluate is
    refused naming the entry, and the content must match the hash recorded inside the file
    when it was written. A ``.pt2`` written elsewhere records none: it loads with a warning,
    or is checked against ``sha256`` when given.

    Args:
        path: the ``.pt2`` file.
        sha256: the expected SHA-256 (hex) of the whole file (e.g. ``lineage.json``'s), optional.

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
    module.eval()
    return module
