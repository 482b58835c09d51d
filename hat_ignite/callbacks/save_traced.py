"""`SaveTraced`: trace the trained model when the loop ends and save it for deployment.

At ``on_loop_end`` (rank 0 only) a CPU copy (``save_gpu_pt``: a GPU copy) of the model
(unwrapped from DataParallel/DDP/``torch.compile``, in eval mode, with its plain forward; the
training model is not touched) is traced with :func:`torch.jit.trace` on ``trace_inputs`` and
saved as ``<save_dir>/<name_prefix>deploy-checkpoint-last.pt``; load it with
``torch.jit.load(path)``, without hat_ignite or the model's code. The same copy is also exported
with :func:`torch.export.export` and saved with :func:`torch.export.save` as ``...-last.pt2``
(load with ``hat_ignite.pt2.load_program(path).module()``, which checks that the file holds no
pickled object or code and that its content is the one recorded inside it when it was written,
or with ``torch.export.load(path).module()``); a model that does not export (data-dependent
control flow the exporter cannot follow ...) gets a warning in the log naming the reason, and the
traced file is still written.

Inputs follow the batch processors' convention: a tuple or list is unpacked into the call
(``model(*trace_inputs)``), anything else (a dict, a tensor) is passed as the one argument.
They are moved to the CPU (to the GPU with ``save_gpu_pt``).

Names: ``<name_prefix>deploy-checkpoint-last.pt`` (:data:`DEPLOY_FILE_FORMAT` ``% (name_prefix,
"last")``, the file deploy scripts open) is always written; with ``save_hash`` a copy named with
the first 8 hex digits of its SHA-256 (``...-last-1a2b3c4d.pt``) is left beside it, as in HAT, so
``sha256sum`` checks a copied file, and hashed files of earlier runs with the same prefix are
removed once the new one is written. Files are written
crash-safely (:func:`~hat_ignite.checkpoint.atomic.atomic_write`).

Output annotations: HAT checks that every output tensor of the traced model carries a deploy
annotation. Here an output's annotation is its name: the key of a dict output (or the field of a
named tuple). The names are logged, stored in the ``.pt`` file as the extra file
``output_names.json`` (read it with ``torch.jit.load(path, _extra_files={"output_names.json": ""})``),
and with ``allow_anno_miss=False`` an output without a name (a bare tensor, a tuple item) is an
error.
"""

from __future__ import annotations

import copy
import glob
import hashlib
import io
import json
import logging
import os
import re
import warnings
from collections.abc import Mapping
from typing import Any, Callable

import ignite.distributed as idist
import torch

from hat_ignite.callbacks.base import CallbackMixin
from hat_ignite.checkpoint.atomic import atomic_write
from hat_ignite.checkpoint.payload import unwrap_model
from hat_ignite.engine.compile import remove_compiled_forward

__all__ = ["SaveTraced", "output_names", "OUTPUT_NAMES_FILE", "DEPLOY_FILE_FORMAT"]

logger = logging.getLogger(__name__)

#: Extra file inside the saved ``.pt`` holding the output names (a JSON list, ``null`` for unnamed).
OUTPUT_NAMES_FILE = "output_names.json"

#: HAT's name of a deploy file: ``DEPLOY_FILE_FORMAT % (name_prefix, "last")``.
DEPLOY_FILE_FORMAT = "%sdeploy-checkpoint-%s.pt"


def _to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to(device)
    if isinstance(obj, Mapping):
        return {k: _to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_to_device(v, device) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(v, device) for v in obj)
    return obj


def output_names(outputs: Any, prefix: str = "") -> list[str | None]:
    """The name of each output tensor, in order; ``None`` for a tensor without one.

    Dict keys and named-tuple fields name what they hold (nested names are dotted); list and
    tuple positions do not.

    >>> output_names({"logits": torch.zeros(1), "aux": (torch.zeros(1), torch.zeros(1))})
    ['logits', 'aux.0', 'aux.1']
    >>> output_names((torch.zeros(1), {"box": torch.zeros(1)}))
    [None, 'box']
    """
    if isinstance(outputs, torch.Tensor):
        return [prefix or None]
    names: list[str | None] = []
    if isinstance(outputs, Mapping):
        for key, value in outputs.items():
            names += output_names(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(outputs, tuple) and hasattr(outputs, "_fields"):
        for key, value in zip(outputs._fields, outputs):
            names += output_names(value, f"{prefix}.{key}" if prefix else key)
    elif isinstance(outputs, (list, tuple)):
        for i, value in enumerate(outputs):
            names += output_names(value, f"{prefix}.{i}" if prefix else "")
    return names


def _quiet_jit(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a ``torch.jit`` function without the warnings that are torch's own, not the model's:
    its deprecation (the .pt2 is written too), and a trace's warning about the input checks
    (``torch._assert``) that ``torch.export`` puts in the modules it makes, such as an int8
    model's quantized submodules: the trace leaves those checks out. A trace's warning about the
    model's own code still shows."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\..*is deprecated", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning, module=r"torch\Z")
        return func(*args, **kwargs)


class SaveTraced(CallbackMixin):
    """Trace the model when training ends and save it (file names, formats: module docstring).

    Args:
        save_dir: directory for the saved files (created if missing).
        trace_inputs: example inputs: a tuple/list of positional arguments, or one argument
            (a dict batch, a tensor).
        name_prefix: prefix of the file names.
        allow_anno_miss: whether outputs without a name are allowed (see the module docstring).
        save_hash: put the first 8 hex digits of each file's SHA-256 in its name.
        forward_before_trace: run the model once on ``trace_inputs`` before tracing (to check
            it, or to trigger lazy initialisation).
        save_exported: also write the ``torch.export`` program (``.pt2``).
        save_gpu_pt: trace (and export) on the current CUDA device instead of the CPU, so the
            saved module runs on the GPU, as HAT's flag does. Needs CUDA.

    Attributes:
        traced_path: the ``.pt`` written by the latest run (``None`` before).
        exported_path: the ``.pt2`` written by the latest run (``None`` when none was).

    Example:
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 2))
        >>> saver = SaveTraced(tmp.name, trace_inputs=(torch.ones(1, 4),), save_hash=False, save_exported=False)
        >>> os.path.basename(saver.save(model))
        'deploy-checkpoint-last.pt'
    """

    def __init__(
        self,
        save_dir: str,
        trace_inputs: Any,
        name_prefix: str = "",
        allow_anno_miss: bool = True,
        save_hash: bool = True,
        forward_before_trace: bool = False,
        save_exported: bool = True,
        save_gpu_pt: bool = False,
    ) -> None:
        if not isinstance(save_dir, (str, os.PathLike)) or not os.fspath(save_dir):
            raise ValueError(f"SaveTraced: save_dir must be a directory path, got {save_dir!r}.")
        if trace_inputs is None:
            raise ValueError(
                "SaveTraced: trace_inputs is required: example inputs of the model's forward, e.g. "
                "(torch.rand(1, 64),) or {'img': torch.rand(1, 64)}."
            )
        if not isinstance(name_prefix, str) or os.sep in name_prefix:
            raise ValueError(f"SaveTraced: name_prefix must be a file name prefix without '{os.sep}', got {name_prefix!r}.")
        self.save_dir = os.fspath(save_dir)
        self.trace_inputs = trace_inputs
        self.name_prefix = name_prefix
        self.allow_anno_miss = allow_anno_miss
        self.save_hash = save_hash
        self.forward_before_trace = forward_before_trace
        self.save_exported = save_exported
        if save_gpu_pt and not torch.cuda.is_available():
            raise ValueError(
                f"SaveTraced(save_gpu_pt=True) traces the model on a GPU, but this torch has no usable CUDA "
                f"(torch {torch.__version__}). Set save_gpu_pt=False to save a CPU module."
            )
        self.save_gpu_pt = save_gpu_pt
        self._device = torch.device("cuda", torch.cuda.current_device()) if save_gpu_pt else torch.device("cpu")
        self.traced_path: str | None = None
        self.exported_path: str | None = None

    def _args(self) -> tuple[Any, ...]:
        inputs = _to_device(self.trace_inputs, self._device)
        return tuple(inputs) if isinstance(inputs, (list, tuple)) and not hasattr(inputs, "_fields") else (inputs,)

    def _write(self, data: bytes, suffix: str) -> str:
        """Write ``data`` under the deploy name, and a hashed copy (returned) with ``save_hash``."""
        stem = (DEPLOY_FILE_FORMAT % (self.name_prefix, "last"))[: -len(".pt")]
        path = atomic_write(os.path.join(self.save_dir, f"{stem}{suffix}"), lambda f: f.write(data))
        if self.save_hash:
            digest = hashlib.sha256(data).hexdigest()[:8]
            path = atomic_write(os.path.join(self.save_dir, f"{stem}-{digest}{suffix}"), lambda f: f.write(data))
            pattern = re.compile(re.escape(stem) + r"-[0-9a-f]{8}" + re.escape(suffix) + "$")
            for old in glob.glob(os.path.join(glob.escape(self.save_dir), f"{glob.escape(stem)}-*{suffix}")):
                if pattern.search(os.path.basename(old)) and os.path.abspath(old) != path:
                    os.remove(old)
        return path

    def save(self, model: torch.nn.Module) -> str:
        """Trace a copy of ``model`` and save it (and its export program); return the ``.pt`` path.

        Raises:
            RuntimeError: tracing fails; names the model and the inputs' structure.
            ValueError: ``allow_anno_miss=False`` and an output has no name.
        """
        module = copy.deepcopy(unwrap_model(model)).to(self._device).eval()
        remove_compiled_forward(module)  # a compiled model (compiler=...) is traced eagerly
        args = self._args()
        with torch.no_grad():
            if self.forward_before_trace:
                module(*args)
            try:
                traced = _quiet_jit(torch.jit.trace, module, args, strict=False)
            except Exception as exc:
                raise RuntimeError(
                    f"SaveTraced: torch.jit.trace of {type(module).__name__} failed on inputs "
                    f"{_structure(args)}: {type(exc).__name__}: {exc}. Check that trace_inputs are what "
                    f"the model's forward takes in eval mode (a model with lazy modules also needs "
                    f"forward_before_trace=True)."
                ) from exc
            names = output_names(traced(*args))
        logger.info("SaveTraced: output names of the traced %s: %s", type(module).__name__, names)
        missing = [i for i, n in enumerate(names) if n is None]
        if missing and not self.allow_anno_miss:
            raise ValueError(
                f"SaveTraced: output tensors {missing} of the traced {type(module).__name__} have no name "
                f"(outputs named: {names}). Return a dict (or named tuple) of tensors from forward in "
                f"eval mode, or set allow_anno_miss=True."
            )
        buffer = io.BytesIO()
        _quiet_jit(torch.jit.save, traced, buffer, _extra_files={OUTPUT_NAMES_FILE: json.dumps(names)})
        os.makedirs(self.save_dir, exist_ok=True)
        self.traced_path = self._write(buffer.getvalue(), ".pt")
        logger.info("SaveTraced: saved the traced model to %s", self.traced_path)
        self.exported_path = self._export(module, args) if self.save_exported else None
        return self.traced_path

    def _export(self, module: torch.nn.Module, args: tuple[Any, ...]) -> str | None:
        from hat_ignite.pt2 import export_program, program_bytes

        try:
            program = export_program(module, args)
            data = program_bytes(program)  # records its content hash, checked by hat_ignite.pt2.load_program
        except Exception as exc:  # the exporter fails in many ways; the traced file is what HAT gives
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            logger.warning(
                "SaveTraced: %s does not export with torch.export (%s: %s); only the traced .pt was written.",
                type(module).__name__, type(exc).__name__, first,
            )
            return None
        path = self._write(data, ".pt2")
        logger.info("SaveTraced: saved the exported program to %s", path)
        return path

    def on_loop_end(self, model: torch.nn.Module, **kwargs: Any) -> None:
        if idist.get_rank() == 0:
            self.save(model)

    def __repr__(self) -> str:
        return (
            f"SaveTraced(save_dir={self.save_dir!r}, name_prefix={self.name_prefix!r}, "
            f"save_hash={self.save_hash}, allow_anno_miss={self.allow_anno_miss})"
        )


def _structure(obj: Any) -> str:
    """A short description of nested inputs: types and tensor shapes.

    >>> _structure(({"img": torch.zeros(2, 3)}, 4))
    "({'img': Tensor[2, 3]}, int)"
    """
    if isinstance(obj, torch.Tensor):
        return f"Tensor[{', '.join(map(str, obj.shape))}]"
    if isinstance(obj, Mapping):
        return "{" + ", ".join(f"{k!r}: {_structure(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple)):
        inner = ", ".join(_structure(v) for v in obj)
        return f"[{inner}]" if isinstance(obj, list) else f"({inner}{',' if len(obj) == 1 else ''})"
    return type(obj).__name__
