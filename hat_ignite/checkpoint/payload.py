"""What a training checkpoint holds: :func:`training_state` collects it from a running loop.

Putting it back is :mod:`~hat_ignite.checkpoint.restore`'s job. The layout of a checkpoint (all of it
loadable with ``torch.load(weights_only=True)``):

==================  ==========================================================================
key                 content
==================  ==========================================================================
hat_ignite_format   format version (int)
epoch, step         the 0-based ``epoch_id`` / ``global_step_id`` the saving hook received
state_dict          model weights (``.module`` of a DDP/DataParallel model)
optimizer           ``optimizer.state_dict()`` or None
optimizer_type      the optimizer's class name (``"SGD"``), checked when the state is resumed
grad_scaler         the batch processor's ``GradScaler.state_dict()`` or None
ema_state_dict      weights of ``loop.ema_model`` or None
prepared_modules    the export record of each quantization-prepared module of the model (where
                    it is, its stage, the structure, shapes and dtypes of its inputs), so that a
                    stage without data prepares the model again (see
                    :mod:`hat_ignite.quantization.record`); ``[]`` for a float model
callbacks           ``{"ClassName": cb.state_dict()}`` for each stateful callback (a second
                    callback of the same class is ``"ClassName#1"``, and so on)
progress            Ignite counters: ``epoch``, ``iteration`` (steps done), ``epoch_length``,
                    the run's ``stop_by``, ``num_epochs``, ``num_steps``, and ``world_size``
                    (the number of training processes that wrote it)
rng                 python / numpy / torch (and CUDA) generator states as tensors and numbers
data                the data position (``loop.data_state_dict()``): steps done in the running
                    epoch, whether its on_epoch_end hooks are still to run, and the generator
                    states its data iterator started from (shuffle order, worker seeds)
versions            ``hat_ignite`` and ``torch`` versions that wrote it
content_sha256      SHA-256 of all of the above (see :mod:`~hat_ignite.checkpoint.hashing`)
==================  ==========================================================================
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

import ignite.distributed as idist
import torch
from torch import nn

# The generator helpers live in the engine, which sets them at the right moment of a resume.
from hat_ignite.engine.resume import rng_state, set_rng_state
from hat_ignite.quantization.prepared import prepared_modules

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["unwrap_model", "plain_state_dict", "rng_state", "set_rng_state", "stateful_callbacks", "training_state"]

logger = logging.getLogger(__name__)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module inside ``DistributedDataParallel`` / ``DataParallel`` / ``torch.compile`` wrappers.

    >>> net = nn.Linear(2, 2)
    >>> unwrap_model(nn.DataParallel(net)) is net, unwrap_model(net) is net
    (True, True)
    """
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
            continue
        dynamo = sys.modules.get("torch._dynamo.eval_frame")  # a compiled model has imported it
        if dynamo is not None and isinstance(model, dynamo.OptimizedModule):
            model = model._orig_mod
            continue
        return model


def _wrapped_attribute(module: nn.Module) -> str | None:
    """The attribute a wrapper holds its module in (``module``, ``_orig_mod``), or ``None``."""
    if isinstance(module, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        return "module"
    dynamo = sys.modules.get("torch._dynamo.eval_frame")
    if dynamo is not None and isinstance(module, dynamo.OptimizedModule):
        return "_orig_mod"
    return None


def plain_state_dict(model: nn.Module) -> dict[str, Any]:
    """``model``'s state dict with the keys of the unwrapped model, wherever the wrappers are.

    A whole-model wrapper is looked through (:func:`unwrap_model`); a submodule wrapped on its own
    (``convert_submodule_list`` DDP, a ``torch.compile``'d submodule) loses the wrapper's segment
    (``backbone.module.fc.weight`` -> ``backbone.fc.weight``).

    >>> net = nn.Sequential(nn.Linear(2, 2))
    >>> net[0] = nn.DataParallel(net[0])
    >>> list(plain_state_dict(net))
    ['0.weight', '0.bias']
    """
    model = unwrap_model(model)
    state = model.state_dict()
    wrappers = [(name, attr) for name, m in model.named_modules() if name for attr in [_wrapped_attribute(m)] if attr]
    if not wrappers:
        return state
    wrappers.sort(key=lambda item: len(item[0]), reverse=True)  # the innermost first
    plain: dict[str, Any] = {}
    for key, value in state.items():
        for name, attr in wrappers:
            inner = f"{name}.{attr}."
            if key.startswith(inner):
                key = f"{name}.{key[len(inner):]}"
        plain[key] = value
    return plain


# -- saving ----------------------------------------------------------------------------------
def stateful_callbacks(callbacks: Any) -> list[tuple[str, Any]]:
    """``(key, callback)`` for each callback with ``state_dict()`` and ``load_state_dict()``.

    The key is the class name; a second callback of the same class gets ``"Name#1"``, a third
    ``"Name#2"``, so keys stay stable while the callback list keeps its order.

    >>> class Counter:
    ...     def state_dict(self): return {}
    ...     def load_state_dict(self, sd): pass
    >>> [k for k, _ in stateful_callbacks([Counter(), object(), Counter()])]
    ['Counter', 'Counter#1']
    """
    seen: dict[str, int] = {}
    out = []
    for cb in callbacks or ():
        if callable(getattr(cb, "state_dict", None)) and callable(getattr(cb, "load_state_dict", None)):
            name = type(cb).__name__
            n = seen.get(name, 0)
            seen[name] = n + 1
            out.append((name if n == 0 else f"{name}#{n}", cb))
    return out


def training_state(loop: LoopBase, epoch_id: int, global_step_id: int) -> dict[str, Any]:
    """Everything needed to resume ``loop`` at this point (see the module docstring's table).

    Args:
        loop: the running engine.
        epoch_id: the 0-based epoch id the saving hook received (stored as ``"epoch"``).
        global_step_id: the 0-based global step id the saving hook received (``"step"``).
    """
    from hat_ignite import __version__

    state = loop.state
    scaler: Any = getattr(loop.batch_processor, "grad_scaler", None)
    return {
        "epoch": int(epoch_id),
        "step": int(global_step_id),
        "state_dict": plain_state_dict(loop.model),
        "optimizer": loop.optimizer.state_dict() if loop.optimizer is not None else None,
        "optimizer_type": type(loop.optimizer).__name__ if loop.optimizer is not None else None,
        "grad_scaler": scaler.state_dict() if callable(getattr(scaler, "state_dict", None)) else None,
        "ema_state_dict": plain_state_dict(loop.ema_model) if loop.ema_model is not None else None,
        "prepared_modules": [m.export_record() for m in prepared_modules(unwrap_model(loop.model))],
        "callbacks": {key: cb.state_dict() for key, cb in stateful_callbacks(loop.callbacks)},
        "progress": {
            "epoch": int(state.epoch),
            "iteration": int(state.iteration),
            "epoch_length": int(state.epoch_length) if state.epoch_length else None,
            "stop_by": str(loop.stop_by),
            "num_epochs": loop.num_epochs,
            "num_steps": loop.num_steps,
            "world_size": int(idist.get_world_size()),
        },
        "rng": rng_state(),
        "data": loop.data_state_dict() if callable(getattr(loop, "data_state_dict", None)) else None,
        "versions": {"hat_ignite": str(__version__), "torch": str(torch.__version__)},
    }
