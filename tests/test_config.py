"""Config files: loading, stages, --opts overrides, dumps, and the errors for bad input."""

from __future__ import annotations

import ast
import sys

import pytest

from hat_ignite.config import Config, parse_opts
from hat_ignite.errors import ConfigError

SOURCE = """
import os
import torch

work_dir = os.path.join(".", "work_dirs", "toy")
_private = 1
lr = 0.1
model = dict(type="MLPClassifier", hidden_features=16)

def loss_collector(outputs):
    return [outputs["loss"]]

float_trainer = dict(
    type="Trainer", model=model, num_epochs=2, device=None,
    optimizer=dict(type=torch.optim.SGD, lr=lr),
    callbacks=[dict(type="StatsMonitor", log_freq=0), dict(type="MetricUpdater", metric_update_func=loss_collector)],
    batch_processor=dict(type="BasicBatchProcessor", need_grad_update=True, loss_collector=loss_collector),
)
float_predictor = dict(type="Predictor", model=model)
qat_trainer = dict(float_trainer, num_epochs=1)
int_infer_predictor = dict(type="Predictor", model=model)
"""


@pytest.fixture
def cfg(write_config) -> Config:
    return Config.fromfile(write_config(SOURCE))


def test_load_keeps_public_values_functions_and_drops_modules(cfg):
    assert list(cfg)[:3] == ["work_dir", "lr", "model"]
    assert "os" not in cfg and "torch" not in cfg and "_private" not in cfg
    assert cfg["float_trainer"]["model"] is cfg["model"]
    assert cfg["loss_collector"]({"loss": 3}) == [3]
    assert cfg.filename.endswith("cfg.py")


def test_stages_are_the_engine_keys(cfg):
    assert cfg.stages() == {
        "float": ["float_trainer", "float_predictor"], "qat": ["qat_trainer"], "int_infer": ["int_infer_predictor"],
    }
    assert cfg.stage_key("qat", "trainer") == "qat_trainer"
    with pytest.raises(ConfigError, match=r"no 'int_infer_trainer'.*Stages with a trainer: float, qat"):
        cfg.stage_key("int_infer", "trainer")


def test_opts_are_typed_with_literal_eval_and_fall_back_to_strings():
    parsed = dict((".".join(map(str, k)), v) for k, v in parse_opts([
        "a=1", "b=0.5", "c=[1, 2]", "d=None", "e=True", "f=hello", "g='quoted'", "h={'x': (1, 2)}", "i=1e-3", "j=",
    ]))
    assert parsed == {
        "a": 1, "b": 0.5, "c": [1, 2], "d": None, "e": True, "f": "hello", "g": "quoted",
        "h": {"x": (1, 2)}, "i": 1e-3, "j": "",
    }


def test_opts_set_nested_keys_list_items_and_new_leaf_keys(cfg):
    cfg.merge_opts([
        "float_trainer.num_epochs=7", "float_trainer.callbacks[0].log_freq=5", "float_trainer.callbacks.1.step_log_freq=3",
        "model.dropout=0.1", "lr=[1, 2]",
    ])
    trainer = cfg["float_trainer"]
    assert trainer["num_epochs"] == 7 and trainer["callbacks"][0]["log_freq"] == 5
    assert trainer["callbacks"][1]["step_log_freq"] == 3
    assert cfg["float_predictor"]["model"]["dropout"] == 0.1  # the shared model dict changed everywhere
    assert cfg["lr"] == [1, 2] and trainer["optimizer"]["lr"] == 0.1  # copied values keep the file's value
    assert cfg.overrides[0] == "float_trainer.num_epochs=7"


@pytest.mark.parametrize("item, message", [
    ("num_epochs", r"--opts item 'num_epochs' has no value: .* Expected KEY=VALUE or KEY VALUE pairs"),
    ("=3", r"'' is not a key path"),
    ("a..b=1", r"'a\.\.b' is not a key path"),
    ("a[x]=1", r"'a\[x\]' is not a key path"),
    ("float_trainer.callbaks[0].x=1", r"has no key 'float_trainer\.callbaks'\. Did you mean 'callbacks'"),
    ("float_trainer.callbacks[5].x=1", r"index 5 is out of range at 'float_trainer\.callbacks\[5\]' \(a list of 2\)"),
    ("lr.x=1", r"'lr\.x' uses a key on a float value"),
    ("model[0]=1", r"'model\[0\]' uses an index on a dict value"),
])
def test_malformed_opts_name_the_item_and_the_expected_form(cfg, item, message):
    before = cfg.dumps()
    with pytest.raises(ConfigError, match=message):
        cfg.merge_opts(["float_trainer.num_epochs=9", item])
    if "=" not in item or item.startswith("=") or ".." in item or "[x]" in item:
        assert cfg.dumps() == before  # items are all parsed before any is applied


def test_missing_file_directory_and_wrong_suffix(tmp_path):
    with pytest.raises(ConfigError, match=r"config file .*nope\.py does not exist\. Pass the path"):
        Config.fromfile(tmp_path / "nope.py")
    with pytest.raises(ConfigError, match="is a directory"):
        Config.fromfile(tmp_path)
    (tmp_path / "c.yaml").write_text("a: 1\n")
    with pytest.raises(ConfigError, match=r"is not a \.py file"):
        Config.fromfile(tmp_path / "c.yaml")


def test_syntax_error_names_file_and_line(write_config):
    path = write_config("a = 1\nif a:\n    b = dict(type='Trainer',\nc = 3\n")
    with pytest.raises(ConfigError) as info:
        Config.fromfile(path)
    message = str(info.value)
    assert message.startswith(f"{path}:3: syntax error: '(' was never closed.")
    assert "\n    b = dict(type='Trainer',\n            ^\n" in message  # the caret under the '('
    assert "Fix that line" in message


def test_a_nul_byte_names_its_line_and_column(write_config):
    path = write_config("a = 1\nb = 'x\0y'\n")
    with pytest.raises(ConfigError) as info:
        Config.fromfile(path)
    assert str(info.value).startswith(f"{path}:2:7: the file holds a NUL byte (\\x00)"), str(info.value)
    assert ":None" not in str(info.value)


def test_a_config_value_that_contains_itself_names_both_key_paths(write_config):
    """Every walk over such a value (the stage inputs, the build, the dump) would recurse until a
    RecursionError; the config is refused as it is read, naming where it refers back."""
    path = write_config(SOURCE + "float_trainer['callbacks'][1]['me'] = float_trainer\n")
    with pytest.raises(ConfigError) as info:
        Config.fromfile(path)
    message = str(info.value)
    assert message.startswith(f"{path}: float_trainer.callbacks[1].me refers back to float_trainer, which contains it"), \
        message
    assert "Give a copy there (e.g. dict(float_trainer)" in message
    shared = Config.fromfile(write_config(SOURCE))  # a dict used in two places is no cycle
    assert shared["float_trainer"]["model"] is shared["float_predictor"]["model"]
    from hat_ignite.registry import build_from_cfg

    looped = {"type": "datetime.timedelta", "minutes": []}
    looped["minutes"].append(looped)
    with pytest.raises(ConfigError, match=r"^delay.minutes\[0\] refers back to delay, which contains it"):
        build_from_cfg(looped, key_path="delay")


def test_error_raised_while_the_config_runs_names_file_and_line(write_config):
    path = write_config("a = 1\nb = undefined_name + 1\n")
    with pytest.raises(ConfigError, match=rf"{path}:2: running the config raised NameError: name 'undefined_name'"):
        Config.fromfile(path)
    path = write_config("raise RuntimeError('the data root is not set.')\n")
    with pytest.raises(ConfigError) as info:
        Config.fromfile(path)
    assert str(info.value) == f"{path}:1: running the config raised RuntimeError: the data root is not set."


def test_dump_is_readable_python_with_functions_and_classes_by_qualified_name(cfg, tmp_path):
    cfg.merge_opts(["float_trainer.num_epochs=3"])
    out = tmp_path / "dump.py"
    cfg.dump(out)
    text = out.read_text()
    assert text.startswith(f"# Resolved config of {cfg.filename}\n# --opts float_trainer.num_epochs=3\n")
    tree = ast.parse(text)
    names = [node.targets[0].id for node in tree.body if isinstance(node, ast.Assign)]
    assert names == list(cfg)
    values = {}
    exec(compile(text, str(out), "exec"), {}, values)
    assert values["lr"] == 0.1 and values["float_trainer"]["num_epochs"] == 3
    assert values["loss_collector"] == "hat_config.cfg.loss_collector"
    assert values["float_trainer"]["optimizer"]["type"] == "torch.optim.sgd.SGD"
    assert list(values["float_trainer"])[0] == "type"  # the config's key order is kept


def test_relocate_paths_moves_strings_under_the_old_work_dir(cfg):
    cfg["ckpt"] = {"save_dir": "./work_dirs/toy/ckpt", "shared": cfg["model"]}
    cfg["other"] = "work_dirs/toy_other/x"
    assert cfg.relocate_paths("./work_dirs/toy", "/runs/new") == 2
    assert cfg["work_dir"] == "/runs/new" and cfg["ckpt"]["save_dir"] == "/runs/new/ckpt"
    assert cfg["other"] == "work_dirs/toy_other/x"
    assert cfg.relocate_paths("/runs/new", "/runs/new/inner") == 2  # a shared dict moves once
    assert cfg["ckpt"]["save_dir"] == "/runs/new/inner/ckpt"


def test_config_imports_modules_next_to_it_relatively_and_absolutely(tmp_path):
    """A plain directory and a package directory: ``from .x import`` and ``import pkg.x`` both work."""
    plain = tmp_path / "plain"
    (plain / "helpers").mkdir(parents=True)
    (plain / "consts.py").write_text("WIDTH = 7\n")
    (plain / "helpers" / "__init__.py").write_text("")
    (plain / "helpers" / "sizes.py").write_text("DEPTH = 3\n")
    (plain / "cfg.py").write_text("from .consts import WIDTH\nimport helpers.sizes\nmodel = dict(width=WIDTH, depth=helpers.sizes.DEPTH)\n")
    cfg = Config.fromfile(plain / "cfg.py")
    assert cfg.model == {"width": 7, "depth": 3} and cfg["model"] is cfg.model  # HAT's attribute access too
    # it imported modules from its directory: the directory stays first on sys.path, so processes
    # started later with spawn / forkserver (which get this sys.path) import them too
    assert sys.path[0] == str(plain)
    sys.path.remove(str(plain))
    (plain / "alone.py").write_text("lr = 0.1\n")
    Config.fromfile(plain / "alone.py")
    assert str(plain) not in sys.path  # nothing imported from there: on sys.path only while the file ran

    pkg = tmp_path / "proj" / "configs"
    pkg.mkdir(parents=True)
    (tmp_path / "proj" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "base.py").write_text("LR = 0.5\n")
    (pkg / "exp.py").write_text("from .base import LR\nfrom ..configs import base\nlr = LR\nsame = base.LR == LR\n")
    cfg = Config.fromfile(pkg / "exp.py")
    assert (cfg["lr"], cfg["same"]) == (0.5, True)
    assert sys.modules["proj.configs.base"].LR == 0.5  # the package's own module
    assert sys.path[:2] == [str(pkg), str(tmp_path)]
    del sys.path[:2]
    with pytest.raises(AttributeError, match="has no key 'lrr'. Did you mean 'lr'"):
        cfg.lrr


def test_merge_from_list_or_dict_as_hat():
    cfg = Config({"model": {"depth": 18}, "lr": 0.1}, filename="c.py")
    cfg.merge_from_list_or_dict(["model.depth", "50", "lr", "0.2"], overwrite=True)
    cfg.merge_from_list_or_dict({"model.width": 64, "lr": 9})  # HAT's default: existing keys are kept
    assert cfg.to_dict() == {"model": {"depth": 50, "width": 64}, "lr": 0.2}
    with pytest.raises(ConfigError, match="odd length"):
        cfg.merge_from_list_or_dict(["lr"])


def test_a_hat_import_without_hat_says_how_to_get_it(write_config):
    import importlib.util

    if importlib.util.find_spec("hat") is not None:
        pytest.skip("a hat package is importable here")
    path = write_config("from hat.registry import OBJECT_REGISTRY\n")
    with pytest.raises(ConfigError, match=r"cfg\.py:1: running the config raised ModuleNotFoundError: No module "
                                          r"named 'hat'\. The config .* imports from HAT: install HAT, or .*"
                                          r"install_hat_alias\(\)"):
        Config.fromfile(path)
