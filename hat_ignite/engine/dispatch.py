"""Attaching HAT hooks to an engine's events.

Each hook method becomes one Ignite handler on the matching :class:`HatEvents` event, in the order
callbacks are attached (config-list order), so HAT callbacks and Ignite handlers interleave
exactly as registered, and Ignite's tools (``has_event_handler``, ``HandlersTimeProfiler``) see
every callback by name. The hook's signature is checked once, when attached: a keyword the hook
never passes is an error, and a method without ``**kwargs`` receives only the names it declares.
A method whose ``**kwargs`` is only read by constant key (``kwargs["epoch_id"]``,
``kwargs.get("batch")``) or not at all receives only those keys (see
:mod:`hat_ignite.engine.kwargs_use`); any other ``**kwargs`` hook gets the full HAT keyword dict.
"""

from __future__ import annotations

import inspect
import weakref
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ignite.engine.events import RemovableEventHandle

from hat_ignite.engine.events import HOOK_EVENTS
from hat_ignite.engine.kwargs_use import keywords_read
from hat_ignite.engine.state import accepted_kwargs, keyword_caller, kwargs_builder
from hat_ignite.errors import CallbackSignatureError

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["HookCall", "attach_hooks", "check_hook_signature", "fire_hat_event"]


_FULL_BUILDERS = {hook: kwargs_builder(hook) for hook in HOOK_EVENTS}
# hook name by ``event.hat_index``: a tuple index, where a dict keyed by the event would pay its
# Python-level ``__hash__`` at every firing
_HOOK_BY_INDEX = tuple(sorted(HOOK_EVENTS, key=lambda hook: HOOK_EVENTS[hook].hat_index))


def check_hook_signature(owner: Any, hook: str, method: Callable) -> frozenset[str] | None:
    """Check ``method`` against the keywords ``hook`` passes.

    Args:
        owner: the callback the method belongs to (named in the error).
        hook: the HAT hook name, e.g. ``"on_step_end"``.
        method: the bound hook method.

    Returns:
        ``None`` when the method needs every keyword (it takes ``**kwargs`` and uses it other
        than by reading constant keys), else the set of names to pass it: the parameters it
        declares plus the keys it reads from its ``**kwargs``.

    Raises:
        CallbackSignatureError: the method names a keyword the hook never passes, or takes
            positional-only or ``*args`` parameters that a keyword call cannot fill.
    """
    if hook not in HOOK_EVENTS:
        raise CallbackSignatureError(f"{hook!r} is not a HAT hook; the hooks are {', '.join(HOOK_EVENTS)}.")
    available = accepted_kwargs(hook)
    name = f"{type(owner).__name__}.{hook}"
    params = inspect.signature(method).parameters.values()
    takes_var_kw = False
    wanted = set()
    for p in params:
        if p.kind is p.VAR_KEYWORD:
            takes_var_kw = True
        elif p.kind is p.VAR_POSITIONAL:
            continue
        elif p.kind is p.POSITIONAL_ONLY and p.default is p.empty:
            raise CallbackSignatureError(
                f"{name} has the positional-only parameter {p.name!r}; HAT hooks are called with "
                f"keywords only. Make it a keyword parameter or take **kwargs."
            )
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            if p.name not in available:
                raise CallbackSignatureError(
                    f"{name} asks for the keyword {p.name!r}, which {hook} never passes. "
                    f"{hook} passes: {', '.join(sorted(available))}. Rename the parameter or read "
                    f"it from **kwargs."
                )
            wanted.add(p.name)
    if takes_var_kw:
        read = keywords_read(method)
        if read is None:
            return None
        wanted.update(read & available)  # a key the hook never passes stays absent, as in the full dict
    return frozenset(wanted)


class HookCall:
    """The Ignite handler that calls one HAT hook with its keywords.

    Holds the bound method (never the engine: Ignite passes the engine at each call), so
    attaching a callback creates no reference cycle. A hook needing the full ``**kwargs`` gets
    the firing's shared keyword dict (built once per firing, by the first such hook); a hook
    needing some keywords (or none) is called by a caller made once, at attach time, that writes
    just those keywords out (:func:`~hat_ignite.engine.state.keyword_caller`).
    """

    def __init__(self, hook: str, method: Callable, only: frozenset[str] | None) -> None:
        self.hook = hook
        self.method = method
        self.only = only
        #: ``caller(method, engine)``, or ``None`` for a hook that gets the full keyword dict.
        self.call = None if only is None else keyword_caller(hook, tuple(sorted(only)))
        owner = getattr(method, "__self__", None)
        self.__name__ = hook
        self.__qualname__ = f"{type(owner).__name__}.{hook}" if owner is not None else hook

    def __call__(self, engine: LoopBase) -> None:
        if self.call is None:
            self.method(**engine.hook_kwargs(self.hook))
        else:
            self.call(self.method, engine)

    def __repr__(self) -> str:
        return f"<HookCall {self.__qualname__}>"


def fire_hat_event(engine: LoopBase, event: Any) -> None:
    """Call the handlers of a HAT event, in registration order; return at once if none.

    The handlers are read from the engine's registry (``engine.hat_handlers`` holds the lists of
    Ignite's ``_event_handlers`` for the nine events, by ``event.hat_index``, so finding that an
    event has no handler costs no hashing of the event), so Ignite's ``add_event_handler``,
    ``remove_event_handler``, event filters and profilers that wrap handlers all keep working.
    A HAT hook is called directly; any other handler as Ignite calls it (with the engine first
    when it was registered taking one). Unlike ``Engine.fire_event`` this skips Ignite's check
    of the event against the registered list (a HAT event always is registered) and its
    per-call debug message, which together cost more than a trivial handler.
    """
    index = event.hat_index
    handlers = engine.hat_handlers[index]
    if not handlers:
        return
    engine.last_event_name = event
    hook = _HOOK_BY_INDEX[index]
    outer = engine._kwargs_cache
    engine._kwargs_cache = cache = {}  # this firing's keywords, shared by its **kwargs hooks
    shared = None
    try:
        for func, args, kwargs in handlers:
            if func.__class__ is HookCall:  # inlined HookCall.__call__
                call = func.call
                if call is not None:
                    call(func.method, engine)
                else:
                    if shared is None:
                        shared = cache.get(hook)
                        if shared is None:
                            shared = cache[hook] = _FULL_BUILDERS[hook](engine)
                    func.method(**shared)
            elif args and args[0].__class__ is weakref.ref:
                func(engine, *args[1:], **kwargs)
            else:
                func(*args, **kwargs)
    finally:
        engine._kwargs_cache = outer


def attach_hooks(engine: LoopBase, owner: Any, methods: Mapping[str, Callable]) -> list[RemovableEventHandle]:
    """Attach each ``hook -> bound method`` of ``owner`` to ``engine``, in firing order.

    Every signature is checked before anything is attached, so a bad callback attaches nothing.

    Returns:
        The handles; ``handle.remove()`` detaches a hook again.
    """
    calls = [
        HookCall(hook, methods[hook], check_hook_signature(owner, hook, methods[hook]))
        for hook in HOOK_EVENTS
        if hook in methods
    ]
    return [engine.add_event_handler(HOOK_EVENTS[call.hook], call) for call in calls]
