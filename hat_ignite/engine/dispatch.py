"""Attaching HAT hooks to an engine's events, and calling them.

Which methods are hooks: every method named like one of the 13 hooks of
:data:`~hat_ignite.engine.events.HOOK_EVENTS` whose body does something. A method whose body is
only ``pass``, ``...`` or a docstring is a no-op, as HAT's ``CallbackMixin`` base hooks are: it is
not attached, so a hook nobody implements costs nothing per step (:func:`is_noop`). Any other
method whose name starts with ``on_`` (``on_step_ends``) is an error at attach time, naming the
hooks that exist: a misspelled hook is never silently not called. Objects with no ``attach``
method (HAT callbacks, which subclass HAT's own ``CallbackMixin``, or any plain class) are
attached by :func:`attach_hat_callback`.

Each hook method becomes one Ignite handler (a :class:`HookCall`) on the matching
:class:`HatEvents` event, in the order callbacks are attached (config-list order), so HAT
callbacks and Ignite handlers interleave exactly as registered, and Ignite's tools
(``has_event_handler``, ``HandlersTimeProfiler``) see every callback by name. The hook's signature
is checked once, when attached (:func:`check_hook_signature`): a keyword the hook never passes is an
error. A method taking ``**kwargs`` is passed every keyword of its hook; one without ``**kwargs``
only the names it declares.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import textwrap
import weakref
from types import FunctionType, MethodType
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ignite.engine.events import RemovableEventHandle

from hat_ignite.engine.events import HOOK_EVENTS
from hat_ignite.engine.state import accepted_kwargs
from hat_ignite.errors import CallbackSignatureError

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = [
    "HookCall", "attach_hooks", "attach_hat_callback", "check_hook_signature", "check_hook_names", "fire_hat_event",
    "hat_hook_methods", "is_noop",
]


def _is_empty_statement(node: ast.stmt) -> bool:
    """``pass``, ``...``, a docstring, ``return`` or ``return None``: a statement that does nothing."""
    if isinstance(node, ast.Pass):
        return True
    if isinstance(node, ast.Expr):
        return isinstance(node.value, ast.Constant)
    return isinstance(node, ast.Return) and (node.value is None or isinstance(node.value, ast.Constant)
                                             and node.value.value is None)


def _body_is_empty(func: FunctionType) -> bool:
    """Whether the source of ``func`` is a ``def`` whose body is only empty statements."""
    if func.__code__.co_names:  # it reads an attribute, a global or calls a method: it does something
        return False
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):  # no source to read (made at run time): not known empty
        return False
    node = tree.body[0] if tree.body else None
    return (
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == func.__name__
        and not node.decorator_list and all(_is_empty_statement(stmt) for stmt in node.body)
    )


#: :func:`_body_is_empty` of each function seen, forgotten with the function.
_EMPTY_BODIES: weakref.WeakKeyDictionary[FunctionType, bool] = weakref.WeakKeyDictionary()


def is_noop(method: Any) -> bool:
    """Whether calling ``method`` does nothing: its body is only ``pass``, ``...``, a docstring or ``return None``.

    Read from the function's source, once per function. Decorated and wrapped functions,
    builtins, functions whose source cannot be read, and callables other than plain Python
    functions are never no-ops: they are attached and called.

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
    if not isinstance(func, FunctionType) or hasattr(func, "__wrapped__"):
        return False
    empty = _EMPTY_BODIES.get(func)
    if empty is None:
        empty = _EMPTY_BODIES[func] = _body_is_empty(func)
    return empty


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
        ``None`` when the method takes ``**kwargs`` (it is passed every keyword of the hook),
        else the names to pass it: the parameters it declares that the hook passes.

    Raises:
        CallbackSignatureError: the method needs a keyword the hook never passes (a parameter
            without a default), or takes positional-only or ``*args`` parameters that a keyword
            call cannot fill.
    """
    if hook not in HOOK_EVENTS:
        raise CallbackSignatureError(f"{hook!r} is not a HAT hook; the hooks are {', '.join(HOOK_EVENTS)}.")
    available = accepted_kwargs(hook)
    name = f"{type(owner).__name__}.{hook}"
    takes_var_kw = False
    wanted = set()
    for p in inspect.signature(method).parameters.values():
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
    return None if takes_var_kw else frozenset(wanted)


class HookCall:
    """The Ignite handler that calls one HAT hook with its keywords.

    Holds the bound method (never the engine: Ignite passes the engine at each call), so
    attaching a callback creates no reference cycle. The keywords are those of the event being
    fired (:meth:`~hat_ignite.engine.loop.LoopBase.hook_kwargs`: built once per firing and shared
    by the event's hooks, as HAT's loop builds them once for all its callbacks); a hook taking
    ``**kwargs`` is passed all of them, a hook naming its keywords just those.

    Args:
        hook: the HAT hook name, e.g. ``"on_step_end"``.
        method: the bound hook method.
        names: the keywords to pass (see :func:`check_hook_signature`); ``None`` for all.
    """

    def __init__(self, hook: str, method: Callable, names: frozenset[str] | None) -> None:
        self.hook = hook
        self.method = method
        self.names = None if names is None else tuple(sorted(names))
        owner = getattr(method, "__self__", None)
        self.__name__ = hook
        self.__qualname__ = f"{type(owner).__name__}.{hook}" if owner is not None else hook

    def __call__(self, engine: LoopBase) -> None:
        kwargs = engine.hook_kwargs(self.hook)
        if self.names is None:
            self.method(**kwargs)
        else:
            self.method(**{name: kwargs[name] for name in self.names})

    def __repr__(self) -> str:
        return f"<HookCall {self.__qualname__}>"


def fire_hat_event(engine: LoopBase, event: Any) -> None:
    """Call the handlers of a HAT event, in registration order, as Ignite calls handlers.

    The handlers are Ignite's own list for the event (``engine.hat_handlers``, by
    ``event.hat_index``), so ``add_event_handler``, ``remove_event_handler``, event filters and
    profilers that wrap handlers all keep working; an event nobody listens to costs one list
    index. A handler registered taking the engine is passed it, as Ignite does. Ignite's own
    ``Engine.fire_event`` is not used for HAT events: its check of the event against the
    registered events scans a list with a Python-level ``==`` and costs ≈ 5 µs a firing, more
    than all the hooks of a typical event (``docs/benchmarks.md``).

    The hooks' keywords are built for this firing when the first ``**kwargs`` hook asks for them
    (:meth:`~hat_ignite.engine.loop.LoopBase.hook_kwargs`), and forgotten when it ends.
    """
    handlers = engine.hat_handlers[event.hat_index]
    if not handlers:
        return
    engine.last_event_name = event
    outer = engine.firing_kwargs
    engine.firing_kwargs = {}  # this firing's keywords, by hook (an event fired inside a hook has its own)
    try:
        for func, args, kwargs in handlers:
            if args and isinstance(args[0], weakref.ref):  # registered taking the engine
                func(engine, *args[1:], **kwargs)
            else:
                func(*args, **kwargs)
    finally:
        engine.firing_kwargs = outer


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
