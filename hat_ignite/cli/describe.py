"""``--dry-run``: describe a built engine and the handlers each HAT event runs, in firing order."""

from __future__ import annotations

from typing import Any

__all__ = ["describe_engine", "model_size_text"]


def _loader_text(loader: Any) -> str:
    try:
        length = f"{len(loader)} batches"
    except TypeError:
        length = "unknown length"
    batch_size = getattr(loader, "batch_size", None)
    dataset = getattr(loader, "dataset", None)
    extra = f", batch_size={batch_size}" if batch_size is not None else ""
    extra += f", dataset={dataset!r:.80}" if dataset is not None else ""
    return f"{type(loader).__name__} ({length}{extra})"


def model_size_text(model: Any) -> str:
    """The model's class and its numbers of values: parameters, buffers, and 8-bit integer ones.

    An int8-converted model keeps its weights as int8 buffers (its parameters are the float
    biases), so the parameter count alone would undersell it.

    >>> import torch
    >>> model_size_text(torch.nn.Linear(4, 2))
    'Linear (10 parameters)'
    >>> model_size_text(torch.nn.BatchNorm1d(3))
    'BatchNorm1d (6 parameters, 7 buffer values)'
    >>> q = torch.nn.Linear(4, 2, bias=False)
    >>> q.register_buffer("weight_int8", torch.zeros(2, 4, dtype=torch.int8))
    >>> model_size_text(q)
    'Linear (8 parameters, 8 buffer values; 8 int8 values)'
    """
    import torch

    params = list(model.parameters())
    buffers = list(model.buffers())
    text = f"{sum(p.numel() for p in params):,} parameters"
    if buffers:
        text += f", {sum(b.numel() for b in buffers):,} buffer values"
    small = sum(t.numel() for t in (*params, *buffers) if t.dtype in (torch.int8, torch.uint8))
    if small:
        text += f"; {small:,} int8 values"
    return f"{type(model).__name__} ({text})"


def describe_engine(engine: Any, stage_key: str) -> str:
    """Describe a built engine and the handlers each HAT event runs, in firing order.

    HAT callbacks are listed under the events of the hooks they override, in config-list order
    (the order they run in). Other handlers in ``callbacks`` are listed with the events they are
    registered on when the handler object itself is the registered callable.
    """
    from ignite.engine import Events

    from hat_ignite.callbacks.base import CallbackMixin
    from hat_ignite.engine.events import HOOK_EVENTS, HatEvents

    model = engine.model
    out = [f"{stage_key}: {type(engine).__module__}.{type(engine).__qualname__}"]
    out.append(f"  model: {model_size_text(model)}")
    for loader in getattr(engine, "data_loaders", None) or [engine.data_loader]:
        out.append(f"  data_loader: {_loader_text(loader)}")
    if engine.optimizer is not None:
        defaults = {k: v for k, v in engine.optimizer.defaults.items() if isinstance(v, (int, float, bool))}
        out.append(f"  optimizer: {type(engine.optimizer).__name__} {defaults}")
    processor = engine.batch_processor
    out.append(
        f"  batch_processor: {type(processor).__name__}(need_grad_update={getattr(processor, 'need_grad_update', '?')})"
    )
    limit = f"num_epochs={engine.num_epochs}" if engine.stop_by == "epoch" else f"num_steps={engine.num_steps}"
    out.append(f"  stop_by={engine.stop_by}, {limit}, device={engine.torch_device}")

    out.append("Handlers by event, in firing order (callbacks run in config-list order):")
    for hook, event in HOOK_EVENTS.items():
        names = engine.event_handlers(event)
        out.append(f"  {event.name} ({hook}):" + ("" if names else " -"))
        out.extend(f"    {n}. {name}" for n, name in enumerate(names, 1))
    ignite_events = [e for e in Events if e not in HatEvents and engine.event_handlers(e)]
    if ignite_events:
        out.append("Ignite events (engine bookkeeping and handlers attached to them):")
        for ignite_event in ignite_events:
            out.append(f"  {ignite_event.name}: " + ", ".join(engine.event_handlers(ignite_event)))
    registered = {name for event in HatEvents for name in engine.event_handlers(event)}
    unattached = [
        f"callbacks[{i}] {type(cb).__name__}" for i, cb in enumerate(engine.callbacks)
        if isinstance(cb, CallbackMixin) and cb.overridden_hooks()
        and not any(name.startswith(f"{type(cb).__qualname__}.") for name in registered)
    ]
    if unattached:
        out.append("Attached for each data loader while it runs: " + ", ".join(unattached))
    return "\n".join(out)
