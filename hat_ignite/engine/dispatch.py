"""Attaching HAT hooks to an engine's events.

Which methods are hooks: every method named like one of the 13 hooks of
:data:`~hat_ignite.engine.events.HOOK_EVENTS` whose body does something. A method whose body is
empty (``pass``, ``...``, only a docstring) is a no-op, as HAT's ``CallbackMixin`` base hooks
are: it is not attached, so a hook nobody implements costs nothing per step
(:func:`is_noop`). Any other method whose name starts with ``on_`` (``on_step_ends``) is an error
at attach time, naming the hooks that exist: a misspelled hook is never silently not called.
Objects with no ``attach`` method (HAT callbacks, which subclass HAT's own ``CallbackMixin``, or
any plain class) are attached by :func:`attach_hat_callback`.

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

import difflib
import dis
import inspect
import weakref
from types import FunctionType, MethodType
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ignite.engine.events import RemovableEventHandle

from hat_ignite.engine.events import HOOK_EVENTS
from hat_ignite.engine.kwargs_use import keywords_read
from hat_ignite.engine.state import accepted_kwargs, keyword_caller, kwargs_builder
from hat_ignite.errors import CallbackSignatureError

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = [
    "HookCall", "attach_hooks", "attach_hat_callback", "check_hook_signature", "check_hook_names", "fire_hat_event",
    "hat_hook_methods", "is_noop",
]


_FULL_BUILDERS = {hook: kwargs_builder(hook) for hook in HOOK_EVENTS}
# hook name by ``event.hat_index``: a tuple index, where a dict keyed by the event would pay its
# Python-level ``__hash__`` at every firing
_HOOK_BY_INDEX = tuple(sorted(HOOK_EVENTS, key=lambda hook: HOOK_EVENTS[hook].hat_index))


_NOOP_SKIP = frozenset({"RESUME", "NOP", "CACHE", "EXTENDED_ARG"})


def is_noop(method: Any) -> bool:
    """Whether calling ``method`` does nothing: its body is ``pass``, ``...`` or only a docstring.

    Decorated functions, builtins and callables other than plain Python functions are never
    no-ops (what they do cannot be read from their code).

    >>> class Base:
    ...     def on_step_end(self, **kwargs):
    ...         pass
    ...     def on_epoch_end(self, **kwargs):
    ...         \"\"\"Only a docstring.\"\"\"
    ...     def on_loop_end(self, **kwargs):
    ...         self.ended = True
    >>> is_noop(Base.on_step_end), is_noop(Base().on_epoch_end), is_noop(Base.on_loop_end)
    (True, True, False)
    >>> is_noop(print)
    False
    """
    func = method.__func__ if isinstance(method, MethodType) else method
    if not isinstance(func, FunctionType):
        return False
    code = func.__code__
    ops = [(ins.opname, ins.argval) for ins in dis.get_instructions(code) if ins.opname not in _NOOP_SKIP]
    return ops in ([("RETURN_CONST", None)], [("LOAD_CONST", None), ("RETURN_VALUE", None)])


def check_hook_names(owner: Any) -> None:
    """Refuse a callback with an ``on_*`` method that is no HAT hook (a misspelled hook).

    Raises:
        CallbackSignatureError: naming the class, the method, the closest hook names and all
            13 hooks.
    """
    cls = type(owner)
    for name in dir(cls):
        if not name.startswith("on_") or name in HOOK_EVENTS or not callable(getattr(cls, name, None)):
            continue
        close = difflib.get_close_matches(name, HOOK_EVENTS, n=2, cutoff=0.6)
        hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise CallbackSignatureError(
            f"{cls.__name__}.{name} is named like a HAT hook, but no engine event calls a hook of "
            f"that name, so it would never run.{hint} The hooks are: {', '.join(HOOK_EVENTS)}. "
            f"Rename the method (a helper method must not start with 'on_')."
        )


def hat_hook_methods(owner: Any) -> dict[str, Callable]:
    """The bound method of each hook ``owner`` implements (not a no-op, see :func:`is_noop`), in firing order."""
    methods = {}
    for hook in HOOK_EVENTS:
        method = getattr(owner, hook, None)
        if method is not None and callable(method) and not is_noop(method):
            methods[hook] = method
    return methods


def check_hook_signature(owner: Any, hook: str, method: Callable) -> frozenset[str] | None:
    """Check ``method`` against the keywords ``hook`` passes.

    A parameter with a default that the hook never passes is left out of the call, so its
    default is used, as when HAT's loop calls the method.

    Args:
        owner: the callback the method belongs to (named in the error).
        hook: the HAT hook name, e.g. ``"on_step_end"``.
        method: the bound hook method.

    Returns:
        ``None`` when the method needs every keyword (it takes ``**kwargs`` and uses it other
        than by reading constant keys), else the set of names to pass it: the parameters it
        declares plus the keys it reads from its ``**kwargs``.

    Raises:
        CallbackSignatureError: the method needs a keyword the hook never passes (a parameter
            without a default), or takes positional-only or ``*args`` parameters that a keyword
            call cannot fill.
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
                if p.default is not p.empty:
                    continue  # never passed, so its default is used, as when HAT's loop calls it
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
    Ignite's ``_event_handlers`` for the thirteen events, by ``event.hat_index``, so finding that an
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
    cache: dict[str, dict[str, Any]]
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

    Every signature, and the names of ``owner``'s ``on_*`` methods (:func:`check_hook_names`),
    are checked before anything is attached, so a bad callback attaches nothing.

    Returns:
        The handles; ``handle.remove()`` detaches a hook again.
    """
    check_hook_names(owner)
    for hook in HOOK_EVENTS:  # the hooks not attached (no-ops) must still be callable as HAT calls them
        method = getattr(owner, hook, None)
        if hook not in methods and callable(method):
            check_hook_signature(owner, hook, method)
    calls = [
        HookCall(hook, methods[hook], check_hook_signature(owner, hook, methods[hook]))
        for hook in HOOK_EVENTS
        if hook in methods
    ]
    return [engine.add_event_handler(HOOK_EVENTS[call.hook], call) for call in calls]


def attach_hat_callback(engine: LoopBase, owner: Any) -> list[RemovableEventHandle]:
    """Attach a HAT callback that has no ``attach`` method: each hook it implements, as is.

    This is how a callback written for HAT (a subclass of HAT's ``CallbackMixin``, whose base
    hooks are no-ops, or any plain class with ``on_*`` methods) runs unchanged.

    Example:
        >>> import torch
        >>> from hat_ignite.engine import BasicBatchProcessor, HatEvents, Predictor
        >>> class HatBase:                      # HAT's callback base: no-op hooks, no attach()
        ...     def on_step_end(self, **kwargs):
        ...         pass
        ...     def on_batch_end(self, **kwargs):
        ...         pass
        >>> class CountSteps(HatBase):
        ...     steps = 0
        ...     def on_step_end(self, global_step_id, **kwargs):
        ...         self.steps = global_step_id + 1
        >>> counter = CountSteps()
        >>> predictor = Predictor(model=torch.nn.Linear(2, 1), data_loader=[torch.zeros(1, 2)] * 3,
        ...     batch_processor=BasicBatchProcessor(need_grad_update=False), callbacks=[counter])
        >>> predictor.event_handlers(HatEvents.STEP_END), predictor.event_handlers(HatEvents.BATCH_END)
        (['CountSteps.on_step_end'], [])
        >>> _ = predictor.fit(); counter.steps
        3
    """
    return attach_hooks(engine, owner, hat_hook_methods(owner))
