"""Fuzzing the config loader and builder: every failure is a ConfigError that says where.

Bounded with hypothesis (few examples, a deadline) so the file runs in seconds; docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import copy
import math
import signal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hat_ignite.config import Config
from hat_ignite.errors import ConfigError
from hat_ignite.registry import build_from_cfg

from conftest import DIGITS_CONFIG

FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Malformed values of every kind a config may hold by mistake.
BAD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10**6, max_value=10**6), st.floats(allow_nan=True),
    st.sampled_from([math.inf, -1, 0, 10**30, "", "abc", "Trainr", "torch.optim.NoSuch", "1e-3"]),
    st.text(max_size=12), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    st.just({"type": "NoSuchType"}), st.just({"type": 3}), st.just({"no_type": 1}),
)


@contextlib.contextmanager
def no_hang(seconds: float = 20):
    """Turn a hang into a failure: raise TimeoutError if the block runs longer than ``seconds``."""

    def stop(signum, frame):
        raise TimeoutError(f"no answer within {seconds} s: the config code hangs")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _paths(node, prefix=()):
    """Every key path under a config node (dict keys and list indexes)."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        yield prefix + (key,)
        yield from _paths(value, prefix + (key,))


@pytest.fixture(scope="module")
def digits():
    cfg = Config.fromfile(DIGITS_CONFIG)
    build_from_cfg(copy.deepcopy(cfg["float_trainer"]), key_path="float_trainer")  # imports done once
    return cfg


def _mutable_paths(cfg):
    trainer = cfg["float_trainer"]
    # the validation data loader and model are cheap to build; skip paths under the big dataset list
    return [p for p in _paths(trainer) if p[0] != "callbacks" or len(p) <= 3]


@FUZZ
@given(data=st.data(), value=BAD_VALUES)
def test_builder_failures_are_config_errors_naming_the_key_path(digits, data, value):
    node = copy.deepcopy(digits["float_trainer"])
    path = data.draw(st.sampled_from(_mutable_paths(digits)))
    target = node
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    try:
        with no_hang():
            build_from_cfg(node, key_path="float_trainer")
    except ConfigError as exc:
        assert str(exc).startswith("float_trainer"), str(exc)


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), value=BAD_VALUES)
def test_building_a_loaded_config_names_the_file_and_the_key_path(digits, data, value):
    cfg = Config(copy.deepcopy(digits.to_dict()), filename=digits.filename)
    path = data.draw(st.sampled_from(_mutable_paths(digits)))
    target = cfg["float_trainer"]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    try:
        with no_hang():
            cfg.build("float_trainer")
    except ConfigError as exc:
        assert str(exc).startswith(f"{DIGITS_CONFIG}: float_trainer"), str(exc)


def test_building_a_missing_key_names_the_file(digits):
    with pytest.raises(ConfigError, match=rf"^{DIGITS_CONFIG}.* has no key 'float_trainr'.*Did you mean 'float_trainer'"):
        digits.build("float_trainr")


@FUZZ
@given(source=st.one_of(
    st.text(max_size=200),
    st.binary(max_size=64).map(lambda b: b.decode("latin-1")),
    st.sampled_from(["exit(3)", "raise SystemExit", "x = (" * 300 + ")" * 300, "a = 1\0", "import no_such_mod",
                     "1/0", "def f(:\n pass", "float_trainer = dict(type=)", "\udcff = 1"]),
))
def test_loader_failures_are_config_errors_naming_the_file(tmp_path_factory, source):
    path = tmp_path_factory.mktemp("fuzz") / "cfg.py"
    path.write_bytes(source.encode("utf-8", "surrogateescape"))
    try:
        with no_hang():
            Config.fromfile(path)
    except ConfigError as exc:
        assert str(path) in str(exc)


@FUZZ
@given(opts=st.lists(st.one_of(
    st.text(max_size=30),
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(["float_trainer.num_epochs", "float_trainer.callbacks[9].x",
                                                         "float_trainer..a", "model[0]", "nope.x", "lr.x.y", "[1]"]),
              st.text(max_size=10)),
), max_size=3))
def test_opts_failures_are_config_errors(digits, opts):
    cfg = Config(copy.deepcopy(digits.to_dict()), digits.filename)
    try:
        with no_hang():
            cfg.merge_opts(opts)
    except ConfigError as exc:
        assert str(exc).startswith("--opts item")
