"""Hooks get only the keywords they read: the bytecode analysis and what hooks observe in a real run."""

from __future__ import annotations

import functools

import pytest

from hat_ignite.callbacks import CallbackMixin
from hat_ignite.engine import HatEvents
from hat_ignite.engine.dispatch import HookCall
from hat_ignite.engine.kwargs_use import keywords_read

from test_hot_path import make_trainer


def reads_by_constant_key(self, **kwargs):
    a = kwargs["epoch_id"]
    b = kwargs.get("step_id")
    c = kwargs.get("batch", None)
    return a, b, c, "loop" in kwargs, "storage" not in kwargs


def never_reads(self, **kwargs):
    self.calls = getattr(self, "calls", 0) + 1


def named_and_read(self, global_step_id, **kw):
    return global_step_id, kw["model"]


@pytest.mark.parametrize(
    ("func", "expected"),
    [
        (reads_by_constant_key, {"epoch_id", "step_id", "batch", "loop", "storage"}),
        (never_reads, set()),
        (named_and_read, {"model"}),
        (lambda **kwargs: kwargs["x"], {"x"}),
    ],
    ids=["subscript-get-in", "unused", "named-plus-read", "lambda"],
)
def test_constant_key_reads_are_found(func, expected):
    assert keywords_read(func) == frozenset(expected)


def forwards(self, **kwargs):
    return print(**kwargs)


def counts(self, **kwargs):
    return len(kwargs)


def iterates(self, **kwargs):
    return [k for k in kwargs]


def stores(self, **kwargs):
    kwargs["epoch_id"] = 0


def augments(self, **kwargs):
    kwargs["epoch_id"] += 1


def variable_key(self, key="epoch_id", **kwargs):
    return kwargs[key]


def variable_default(self, **kwargs):
    return kwargs.get("epoch_id", self.default)


def captured(self, **kwargs):
    return lambda: kwargs["epoch_id"]


def reads_locals(self, **kwargs):
    return locals()["kwargs"]


def aliases(self, **kwargs):
    other = kwargs
    return other["epoch_id"]


def pops(self, **kwargs):
    return kwargs.pop("epoch_id")


@pytest.mark.parametrize(
    "func",
    [forwards, counts, iterates, stores, augments, variable_key, variable_default, captured, reads_locals, aliases,
     pops, print, functools.partial(never_reads, None), lambda self, epoch_id: None],
    ids=lambda f: getattr(f, "__name__", type(f).__name__),
)
def test_any_other_use_needs_the_full_dict(func):
    assert keywords_read(func) is None


def test_hooks_see_the_same_values_with_the_smaller_dict():
    seen: dict[str, list] = {"full": [], "read": [], "missing": []}

    class Full(CallbackMixin):
        def on_step_end(self, **kwargs):
            seen["full"].append((kwargs["epoch_id"], kwargs["step_id"], kwargs["global_step_id"],
                                 kwargs.get("batch"), "loop" in kwargs, "losses" in kwargs, len(kwargs)))

    class Reads(CallbackMixin):
        def on_step_end(self, **kwargs):
            seen["read"].append((kwargs["epoch_id"], kwargs["step_id"], kwargs["global_step_id"],
                                 kwargs.get("batch"), "loop" in kwargs, "losses" in kwargs, 17))

    class Missing(CallbackMixin):
        def on_step_end(self, **kwargs):
            seen["missing"].append(kwargs.get("losses", "absent"))  # on_step_end passes no losses
            try:
                kwargs["grad_scaler"]
            except KeyError as exc:
                seen["missing"].append(f"KeyError {exc}")

    class Counter(CallbackMixin):
        calls = 0

        def on_step_end(self, **kwargs):
            Counter.calls += 1

    trainer = make_trainer([Full(), Reads(), Missing(), Counter()], n=6)
    calls = {h.method.__self__.__class__.__name__: h for h, _, _ in trainer._event_handlers[HatEvents.STEP_END]}
    assert calls["Full"].only is None  # len(kwargs): the full dict
    assert calls["Reads"].only == {"epoch_id", "step_id", "global_step_id", "batch", "loop"}
    assert calls["Counter"].only == frozenset() and calls["Counter"].call.__doc__ == "method()"  # no dict at all
    assert isinstance(calls["Missing"], HookCall) and calls["Missing"].only == frozenset()
    trainer.fit()
    assert len(seen["full"]) == 6 and seen["full"][0][-1] == 17
    assert [s[:-1] for s in seen["read"]] == [s[:-1] for s in seen["full"]]
    assert all(a[3] is b[3] for a, b in zip(seen["read"], seen["full"]))  # the very batch objects
    assert seen["missing"][:2] == ["absent", "KeyError 'grad_scaler'"]
    assert Counter.calls == 6


def test_hat_handlers_follow_handlers_added_and_removed():
    trainer = make_trainer([])
    index = HatEvents.STEP_END.hat_index
    assert trainer.hat_handlers[index] is trainer._event_handlers[HatEvents.STEP_END]
    assert not trainer.hat_handlers[index]

    def every_other(engine):
        pass

    trainer.add_event_handler(HatEvents.STEP_END(every=2), every_other)
    handle = trainer.add_event_handler(HatEvents.STEP_END, lambda: None)
    assert len(trainer.hat_handlers[index]) == 2
    handle.remove()  # Ignite replaces the event's list on removal
    assert trainer.hat_handlers[index] is trainer._event_handlers[HatEvents.STEP_END]
    assert len(trainer.hat_handlers[index]) == 1
