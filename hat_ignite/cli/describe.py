"""``--dry-run``: describe a built engine and the handlers each HAT event runs, in firing order."""

from __future__ import annotations

from typing import Any

__all__ = ["describe_engine"]


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
    n_params = sum(p.numel() for p in model.parameters())
    out = [f"{stage_key}: {type(engine).__module__}.{type(engine).__qualname__}"]
    out.append(f"  model: {type(model).__name__} ({n_params:,} parameters)")
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
        for event in ignite_events:
            out.append(f"  {event.name}: " + ", ".join(engine.event_handlers(event)))
    registered = {name for event in HatEvents for name in engine.event_handlers(event)}
    unattached = [
        f"callbacks[{i}] {type(cb).__name__}" for i, cb in enumerate(engine.callbacks)
        if isinstance(cb, CallbackMixin) and cb.overridden_hooks()
        and not any(name.startswith(f"{type(cb).__qualname__}.") for name in registered)
    ]
    if unattached:
        out.append("Attached for each data loader while it runs: " + ", ".join(unattached))
    return "\n".join(out)
