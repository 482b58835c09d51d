"""The object registry and the builders that turn config dicts into objects.

A config describes an object with a dict whose ``type`` key names what to build; every other key
is a constructor argument. ``type`` may be

* a registered name (``"Trainer"``, ``"StepDecayLrUpdater"``): see :data:`BUILTIN_OBJECTS` and
  :meth:`Registry.register`;
* a dotted import path (``"torch.optim.SGD"`` or ``"torch.optim:SGD"``);
* the class or function itself (``type=torch.optim.SGD``, as HAT configs often write it).

Arguments are built first, depth first, so any argument may itself be such a dict, or a list of
them; a dict without ``type`` stays a dict. Within one :func:`build_from_cfg` call the same dict
*object* is built once and its result shared, so a metric referenced by the trainer and by a
checkpoint callback is one metric.

Two kinds of sub-config are left as dicts for the receiving object to build:

* an optimizer config without ``params`` or with name-pattern groups as ``params``: it needs
  the model, so the loop builds it with :func:`hat_ignite.optimizers.build_optimizer` once the model exists
  (one that names its model, HAT's ``model=model``, is built at once for that model);
* any dict with ``"__build_recursive": False`` (the key is removed when the dict is built later).

Building is a pure function of the config and the registry: the config is not modified and
nothing global changes. Built-in names live in one explicit table, :data:`BUILTIN_OBJECTS`, and
are imported on first use, so importing this module imports nothing heavy.

>>> build_from_cfg({"type": "fractions.Fraction", "numerator": 3, "denominator": 6})
Fraction(1, 2)
>>> build_from_cfg({"type": "collections:Counter", "x": {"type": "fractions.Fraction", "numerator": 2}})
Counter({'x': Fraction(2, 1)})
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Mapping
from typing import Any, Callable, Iterable

from hat_ignite.build_data import distributed_sampler_args, loader_sampler_args
from hat_ignite.builtin_names import BUILTIN_OBJECTS, NOT_PROVIDED
from hat_ignite.errors import ConfigError, HatIgniteError, MissingHatNameError

__all__ = ["Registry", "OBJECT_REGISTRY", "BUILTIN_OBJECTS", "build_from_cfg", "config_error"]

_NO_RECURSE = "__build_recursive"


def config_error(key_path: str, detail: str) -> ConfigError:
    """A ConfigError that remembers its key path, so an outer build can prefix it.

    Example:
        >>> str(config_error("float_trainer.optimizer", "lr must be positive."))
        'float_trainer.optimizer: lr must be positive.'
    """
    exc = ConfigError(f"{key_path}: {detail}" if key_path else detail)
    exc.key_path = key_path
    exc.detail = detail
    return exc


def _join(key_path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{key_path}[{key}]"
    return f"{key_path}.{key}" if key_path else str(key)


def _import_path(path: str) -> Any:
    """Import ``"pkg.mod:attr"`` or ``"pkg.mod.attr"`` (the longest importable module prefix)."""
    if ":" in path:
        module_name, _, attr_path = path.partition(":")
        candidates = [(module_name, attr_path.split("."))]
    else:
        parts = path.split(".")
        candidates = [(".".join(parts[:i]), parts[i:]) for i in range(len(parts) - 1, 0, -1)]
    last_error: str = f"no module in {path!r} could be imported"
    for module_name, attrs in candidates:
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                last_error = f"no module named {exc.name!r}"
                continue
            raise
        for i, attr in enumerate(attrs):
            try:
                obj = getattr(obj, attr)
            except MissingHatNameError as exc:  # a hat.* alias module: its message says what to do
                raise LookupError(str(exc)) from exc
            except AttributeError as exc:
                where = ".".join([module_name, *attrs[:i]])
                raise LookupError(f"{where!r} has no attribute {attr!r}") from exc
        return obj
    raise LookupError(last_error)


class Registry:
    """Names -> classes/functions that configs may use as ``type``.

    Names come from an explicit ``builtins`` table of import paths (imported when first looked up)
    and from explicit registration. Registering a name twice is an error.

    Args:
        name: what the registry holds, used in error messages.
        builtins: ``{name: "module:attribute"}`` entries known without registration.

    Example:
        >>> reg = Registry("demo")
        >>> @reg.register
        ... class Box:
        ...     def __init__(self, size: int = 1):
        ...         self.size = size
        >>> reg.build({"type": "Box", "size": 3}).size
        3
        >>> _ = reg.register_module("Crate", Box)
        >>> sorted(reg.names())
        ['Box', 'Crate']
    """

    def __init__(self, name: str, builtins: Mapping[str, str] | None = None) -> None:
        self.name = name
        self._builtins: dict[str, str] = dict(builtins or {})
        self._objects: dict[str, Any] = {}

    def register(self, obj: Any = None, *, name: str | None = None) -> Any:
        """Register a class or function under its ``__name__`` (or ``name``).

        Usable as ``@registry.register``, ``@registry.register()``, ``@registry.register(name="alias")``,
        ``registry.register(obj)`` or ``registry.register(obj, name="alias")``, as in HAT; returns
        the object unchanged (or, without ``obj``, the decorator).
        """
        if obj is None:
            return lambda o: self.register(o, name=name)
        self._add(name or getattr(obj, "__name__", None), obj)
        return obj

    def register_module(self, *args: Any, **kwargs: Any) -> Any:
        """Register an object; HAT's and MMEngine's spellings as well as ``(name, obj)``.

        ``register_module(obj)``, ``@register_module``, ``@register_module()`` and
        ``register_module(obj, name=...)`` behave as :meth:`register`;
        ``register_module("Name", obj)`` registers ``obj`` as ``Name``.

        Raises:
            ConfigError: the name is already registered to another object or is not an identifier.
        """
        if len(args) == 2 and isinstance(args[0], str) and not kwargs:
            self._add(args[0], args[1])
            return args[1]
        if len(args) > 1 or set(kwargs) - {"obj", "name"}:
            raise ConfigError(
                f"{self.name} registry: register_module takes (obj), (obj, name=...), (name=...) or "
                f"(name, obj), got {len(args)} positional and {sorted(kwargs)} keyword arguments."
            )
        return self.register(*args, **kwargs)

    def alias(self, name: str) -> Callable[[Any], Any]:
        """A decorator registering its object under the extra name ``name`` (HAT's ``alias``)."""
        return lambda obj: self.register(obj, name=name)

    def _add(self, name: Any, obj: Any) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"{self.name} registry: a name must be an identifier, got {name!r}.")
        if not callable(obj):
            raise ConfigError(f"{self.name} registry: {name!r} must be a class or function, got {obj!r}.")
        old = self._objects.get(name)
        if old is not None and _same_definition(old, obj):
            self._objects[name] = obj  # the same module run again (a config loaded twice): keep the newest
            return
        if old is None and name in self._builtins and self._builtin_is(name, obj):
            return  # HAT code registering one of hat-ignite's own classes again (through the hat alias)
        if name in self:
            where = _qualified(old) if old is not None else self._builtins[name].replace(":", ".")
            raise ConfigError(
                f"{self.name} registry: {name!r} is already registered (as {where}). "
                f"Pick another name, e.g. register(obj, name='My{name}')."
            )
        self._objects[name] = obj

    def __contains__(self, name: object) -> bool:
        return name in self._objects or name in self._builtins

    def _builtin_is(self, name: str, obj: Any) -> bool:
        try:
            return _import_path(self._builtins[name]) is obj
        except (ImportError, LookupError):
            return False

    def keys(self) -> list[str]:
        """Every registered name (HAT's spelling of :meth:`names`)."""
        return self.names()

    def names(self) -> list[str]:
        """Every registered name, built-in ones first."""
        return [*self._builtins, *(n for n in self._objects if n not in self._builtins)]

    def get(self, name: str) -> Any:
        """The class or function registered as ``name``.

        Raises:
            KeyError: ``name`` is not registered (the message lists the closest names).
        """
        if name in self._objects:
            return self._objects[name]
        if name in self._builtins:
            return _import_path(self._builtins[name])
        raise KeyError(self.unknown_name_message(name))

    def unknown_name_message(self, name: str) -> str:
        """Say that ``name`` is unknown and list the closest registered names."""
        if name in NOT_PROVIDED:
            return f"type {name!r} is a HAT class hat-ignite does not provide: {NOT_PROVIDED[name]}."
        names = self.names()
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
        close += [n for n in names if n.lower() == name.lower() and n not in close]
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        return (
            f"unknown type {name!r}: it is not registered in the {self.name} registry and is not a "
            f"dotted import path.{hint} Use a registered name, a path such as 'torch.optim.SGD', "
            f"or register your class with @OBJECT_REGISTRY.register."
        )

    def resolve(self, type_: Any, key_path: str = "") -> Any:
        """Turn a config's ``type`` value into the class or function it names.

        Raises:
            ConfigError: the name is unknown or the import path does not import.
        """
        where = _join(key_path, "type")
        if callable(type_):
            return type_
        if not isinstance(type_, str) or not type_:
            raise config_error(where, f"type must be a name, a dotted import path or a class, got {type_!r}.")
        if type_ in self:
            try:
                return self.get(type_)
            except (ImportError, LookupError) as exc:
                raise config_error(where, f"registered type {type_!r} failed to import: {exc}.") from exc
        if "." not in type_ and ":" not in type_:
            raise config_error(where, self.unknown_name_message(type_))
        try:
            obj = _import_path(type_)
        except (ImportError, LookupError) as exc:
            raise config_error(where, f"cannot import {type_!r}: {exc}. Check the spelling of the path.") from exc
        if not callable(obj):
            raise config_error(where, f"{type_!r} is a {type(obj).__name__}, not a class or function.")
        return obj

    def build(
        self, cfg: Any, key_path: str = "", default_args: Mapping[str, Any] | None = None
    ) -> Any:
        """Build ``cfg`` with this registry; see :func:`build_from_cfg`."""
        return _Builder(self).build(cfg, key_path, default_args)


def _qualified(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def _same_definition(old: Any, new: Any) -> bool:
    """Whether ``new`` is ``old`` or the same definition made again (same module and qualified name)."""
    return old is new or (
        getattr(old, "__module__", None) is not None and _qualified(old) == _qualified(new)
        and "<lambda>" not in _qualified(old)
    )


def _signature_text(obj: Any) -> str:
    """``Name(arg: type = default, ...)``, with string annotations resolved where possible."""
    try:
        try:
            signature = inspect.signature(obj, eval_str=True)
        except Exception:  # an annotation that does not evaluate: show it as written
            signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return repr(obj)
    signature = signature.replace(return_annotation=inspect.Signature.empty)
    return f"{getattr(obj, '__qualname__', obj)}{signature}"


def _unknown_argument_hint(signature: inspect.Signature, kwargs: Mapping[str, Any]) -> str:
    """`` Did you mean 'num_epochs' for 'num_epoch'?`` for arguments the signature does not name."""
    names = [n for n, p in signature.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    hints = []
    for key in kwargs:
        if key not in signature.parameters:
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
            if close:
                hints.append(f"{close[0]!r} for {key!r}")
    return f" Did you mean {', '.join(hints)}?" if hints else ""


def _is_optimizer_class(target: Any) -> bool:
    if not isinstance(target, type):
        return False
    import torch  # only needed when a config holds an optimizer

    return issubclass(target, torch.optim.Optimizer)


def _is_deferred_optimizer(target: Any, cfg: Mapping) -> bool:
    """An optimizer config whose ``params`` need the model (absent, or name-pattern groups).

    One that names its model (``model=``) is built where it stands.
    """
    if isinstance(cfg.get("params"), Iterable) and not isinstance(cfg.get("params"), Mapping):
        return False
    return "model" not in cfg and _is_optimizer_class(target)


class _Builder:
    """One build: depth-first, with a memo so a dict object shared in the config is built once."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.memo: dict[int, tuple[Any, Any]] = {}  # id(cfg) -> (cfg kept alive, built object)

    def build(self, cfg: Any, key_path: str, default_args: Mapping[str, Any] | None = None) -> Any:
        if not (isinstance(cfg, Mapping) and "type" in cfg):
            if default_args:
                raise config_error(key_path, f"expected a config dict with a 'type' key, got {cfg!r}.")
            return self.value(cfg, key_path)
        if default_args is None and id(cfg) in self.memo:
            return self.memo[id(cfg)][1]
        target = self.registry.resolve(cfg["type"], key_path)
        if "model" in cfg and _is_optimizer_class(target):
            result = self.optimizer_with_model(cfg, key_path)
            if default_args is None:
                self.memo[id(cfg)] = (cfg, result)
            return result
        kwargs = {k: v for k, v in cfg.items() if k != "type"}
        for k, v in (default_args or {}).items():
            kwargs.setdefault(k, v)
        if isinstance(kwargs.get("sampler"), Mapping) and "type" in kwargs["sampler"]:
            kwargs = loader_sampler_args(target, kwargs)
        elif "num_replicas" not in kwargs or "rank" not in kwargs:
            kwargs = distributed_sampler_args(target, kwargs)
        for k in kwargs:
            if not isinstance(k, str):
                raise config_error(key_path, f"argument names must be strings, got {k!r}.")
        built = {k: self.value(v, _join(key_path, k)) for k, v in kwargs.items()}
        result = self.call(target, built, key_path)
        if default_args is None:
            self.memo[id(cfg)] = (cfg, result)
        return result

    def optimizer_with_model(self, cfg: Mapping[str, Any], key_path: str) -> Any:
        """HAT's ``dict(type=<optimizer>, ..., model=model)``: the optimizer of that model, built now."""
        from hat_ignite.optimizers import build_optimizer

        model = self.value(cfg["model"], _join(key_path, "model"))
        if not hasattr(model, "named_parameters"):
            raise config_error(
                _join(key_path, "model"),
                f"an optimizer's model must be a torch.nn.Module (or its config), got {type(model).__name__}.",
            )
        rest = {k: v for k, v in cfg.items() if k != "model"}
        return build_optimizer(rest, model, key_path=key_path)

    def value(self, value: Any, key_path: str) -> Any:
        if isinstance(value, Mapping):
            if value.get(_NO_RECURSE, True) is False:
                return {k: v for k, v in value.items() if k != _NO_RECURSE}
            if "type" in value:
                target = self.registry.resolve(value["type"], key_path)
                if _is_deferred_optimizer(target, value):
                    return value
                return self.build(value, key_path)
            return type(value)((k, self.value(v, _join(key_path, k))) for k, v in value.items())  # type: ignore[call-arg]
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            return type(value)(self.value(v, _join(key_path, i)) for i, v in enumerate(value))
        return value

    def call(self, target: Callable, kwargs: dict[str, Any], key_path: str) -> Any:
        name = getattr(target, "__qualname__", repr(target))
        try:
            signature: inspect.Signature | None = inspect.signature(target)
        except (TypeError, ValueError):  # some builtins have none: let the call decide
            signature = None
        try:
            if signature is not None:
                signature.bind(**kwargs)
        except TypeError as exc:
            hint = _unknown_argument_hint(signature, kwargs) if signature is not None else ""
            # With a close name found, that name is the fix; the whole signature only buries it.
            detail = f"cannot build {name}: {exc}.{hint}" if hint else (
                f"cannot build {name}: {exc}. Its signature is {_signature_text(target)}."
            )
            raise config_error(key_path, detail) from None
        try:
            return target(**kwargs)
        except ConfigError as exc:
            inner = getattr(exc, "key_path", None)
            if inner is not None:  # an argument the object built itself: complete the key path
                raise config_error(_join(key_path, inner) if inner else key_path, exc.detail) from exc
            raise config_error(key_path, f"building {name} failed: {exc}") from exc
        except (TypeError, ValueError) as exc:
            raise config_error(key_path, f"building {name} failed: {exc}") from exc
        except HatIgniteError:
            raise  # a checkpoint or data error already names what and where
        except Exception as exc:  # any other failure of the constructor is still this key's fault
            raise config_error(key_path, f"building {name} failed: {type(exc).__name__}: {exc}") from exc


#: The registry configs use. Add your own names with ``@OBJECT_REGISTRY.register``.
OBJECT_REGISTRY = Registry("object", BUILTIN_OBJECTS)


def build_from_cfg(
    cfg: Any,
    key_path: str = "",
    default_args: Mapping[str, Any] | None = None,
    registry: Registry | None = None,
) -> Any:
    """Build an object (or a nested structure of objects) from a config.

    Args:
        cfg: a dict with a ``type`` key, or a list/dict holding such dicts (built element by
            element; other values are returned as they are).
        key_path: where ``cfg`` sits in the config file, e.g. ``"float_trainer"``; error
            messages start with it (``float_trainer.callbacks[2].type: ...``).
        default_args: constructor arguments used when ``cfg`` does not set them.
        registry: the registry resolving ``type`` names (default :data:`OBJECT_REGISTRY`).

    Returns:
        The built object. ``cfg`` itself is left unchanged.

    Raises:
        ConfigError: an unknown ``type`` (with the closest registered names), arguments that do
            not fit the constructor (with the closest argument name, or else its signature), or
            a constructor that rejects a value, or a value that contains itself (names both key
            paths).

    Example:
        >>> sched = build_from_cfg({"type": "datetime.timedelta", "minutes": 2})
        >>> sched.total_seconds()
        120.0
        >>> build_from_cfg({"type": "Trainr"})
        Traceback (most recent call last):
        ...
        hat_ignite.errors.ConfigError: type: unknown type 'Trainr': ... Did you mean 'Trainer'? ...
    """
    if isinstance(cfg, (Mapping, list, tuple)):
        from hat_ignite.config_cycles import cycle_message, self_reference

        found = self_reference({key_path or "<cfg>": cfg})
        if found:  # the message names both key paths itself
            exc = config_error("", cycle_message(found))
            exc.key_path = found[0]
            raise exc
    return (registry or OBJECT_REGISTRY).build(cfg, key_path, default_args)
