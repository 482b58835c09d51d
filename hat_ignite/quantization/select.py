"""Which submodules a converter prepares when the config names none.

An exported graph is fixed to one path through ``forward``. HAT models take another path in
training: they compute their loss in ``forward`` and return it (``(preds, losses)``), and return
only predictions in eval. Exporting such a model whole loses one of the two. So the model is run
on the example batches once in eval mode and once in training mode (no gradients, its buffers
and the random generators put back afterwards), and a module counts as *stable* when it and
every module inside it ran as often, and took and returned the same structures, in both modes and
on every example batch (a multitask model, whose forward takes each task's batch its own way, is
not; its shared backbone and each task's head are).

:func:`stable_modules` picks the model when it is stable (the whole model is exported, as
before); otherwise the outermost stable submodules that hold parameters (a backbone, a head),
leaving the rest in float and in Python: the model's own ``forward``, its loss, anything that
runs in one mode only.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from hat_ignite.errors import QuantizationError
from hat_ignite.quantization.capture import model_args

__all__ = ["stable_modules"]

logger = logging.getLogger(__name__)

Trace = dict[str, list[str]]


def _signature(outputs: Any) -> str:
    """The structure of a module's outputs: containers, keys, and each tensor's dtype and rank."""
    leaves, spec = tree_flatten(outputs)
    kinds = [f"{leaf.dtype}/{leaf.dim()}" if isinstance(leaf, torch.Tensor) else type(leaf).__name__ for leaf in leaves]
    return f"{spec}|{','.join(kinds)}"


@torch.no_grad()
def _trace(model: nn.Module, batches: list[Any], training: bool) -> tuple[Trace, BaseException | None]:
    """Run ``model`` on ``batches`` in one mode; the input and output signature of each call of each module."""
    trace: Trace = {name: [] for name, _ in model.named_modules()}
    handles = []
    for name, module in model.named_modules():
        def hook(mod: nn.Module, args: Any, out: Any, _name: str = name) -> None:
            trace[_name].append(_signature((args, out)))

        handles.append(module.register_forward_hook(hook))
    modes = {m: m.training for m in model.modules()}
    saved = [(b, b.detach().clone()) for b in model.buffers()]  # BatchNorm statistics move in training
    error = None
    try:
        model.train(training)
        with torch.random.fork_rng(devices=[]):  # dropout draws
            for batch in batches:
                model(*model_args(batch))
    except Exception as exc:  # the caller decides what a failing mode means
        error = exc
    finally:
        for handle in handles:
            handle.remove()
        for module, was in modes.items():
            module.training = was
        for buf, value in saved:
            buf.copy_(value)
    return trace, error


def _holds_weights(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def stable_modules(model: nn.Module, batches: list[Any], who: str) -> list[str]:
    """The modules to prepare: ``[""]`` (the model) when it runs alike in training and eval, else
    the outermost submodules that do and hold parameters.

    Args:
        model: the float model.
        batches: example batches, each as the model receives it.
        who: the converter, named in messages.

    Raises:
        QuantizationError: the model fails in eval mode on the batches, or no submodule runs
            alike in both modes; names the fix (``modules=[...]``).
    """
    evals, eval_error = _trace(model, batches, training=False)
    if eval_error is not None:
        raise QuantizationError(
            f"{who}: the model failed on the example batch before tracing ({type(eval_error).__name__}: "
            f"{eval_error}). Give example inputs the model accepts in eval mode."
        ) from eval_error
    trains, train_error = _trace(model, batches, training=True)
    if train_error is not None:
        # e.g. a loss that needs labels the batch lacks: the model's own forward differs in
        # training; its submodules are taken to run alike
        logger.info("%s: the model's training forward failed on the example batch (%s: %s); taking its "
                    "forward to differ in training.", who, type(train_error).__name__, train_error)
        trains = dict(evals, **{"": []})
    names = list(evals)
    # a graph is fixed to one path: a module must take and return the same structures in both
    # modes and on every example batch (a multitask model takes each task's batch its own way)
    unstable = {name for name in names if evals[name] != trains[name] or len(set(evals[name])) > 1}

    def stable(name: str) -> bool:
        prefix = f"{name}." if name else ""
        return not any(n == name or n.startswith(prefix) for n in unstable)

    if stable(""):
        return [""]
    chosen: list[str] = []
    left: list[str] = []

    def visit(module: nn.Module, path: str) -> None:
        for child_name, child in module.named_children():
            child_path = f"{path}.{child_name}" if path else child_name
            if stable(child_path):
                if evals[child_path] and _holds_weights(child):
                    chosen.append(child_path)
                elif evals[child_path]:
                    left.append(child_path)
            elif evals[child_path]:
                visit(child, child_path)
            else:
                left.append(child_path)

    visit(model, "")
    if not chosen:
        raise QuantizationError(
            f"{who}: {type(model).__name__} runs differently in training and in eval mode (its forward "
            f"returns other outputs, or calls other submodules), so it cannot be exported whole, and none "
            f"of its submodules with weights runs alike in both modes. Name the submodules to quantize: "
            f"{who}(modules=['backbone', ...])."
        )
    logger.info(
        "%s: %s runs differently in training and eval mode (a loss computed in forward, HAT's convention), so "
        "it is not exported whole: preparing %s; left in float: %s. Name them with modules=[...] to choose.",
        who, type(model).__name__, chosen, left or "nothing else",
    )
    return chosen
