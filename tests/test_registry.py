"""The registry: names, import paths, objects, nesting, errors, the built-in table, optimizers."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import torch

from hat_ignite.errors import ConfigError
from hat_ignite.optimizers import build_optimizer
from hat_ignite.builtin_names import HAT_ALIASES
from hat_ignite.registry import BUILTIN_OBJECTS, OBJECT_REGISTRY, Registry, build_from_cfg

# Class and function names of HAT's engine and callbacks APIs, and the HAT metrics configs use.
SEED_NAMES = [
    "LoopBase", "Trainer", "Predictor", "Calibrator", "DistributedDataParallelTrainer",
    "DataParallelTrainer", "BatchProcessorMixin", "BasicBatchProcessor", "MultiBatchProcessor",
    "collect_loss_by_index", "collect_loss_by_regex",
    "CallbackMixin", "Checkpoint", "CosLrUpdater", "CosineAnnealingLrUpdater", "CyclicLrUpdater",
    "ExponentialMovingAverage", "FreezeBNStatistics", "FreezeModule", "FuseBN", "GradScale",
    "MeanTeacherValidation", "MetricUpdater", "NoamLrUpdater", "OneCycleUpdater", "PolyLrUpdater",
    "SaveTraced", "StatsMonitor", "StepDecayLrUpdater", "TensorBoard", "Validation",
    "Accuracy", "TopKAccuracy", "LossShow", "MeanIoU",
]
# Table names that are HAT's other spelling of a class (its snake-case engine aliases too).
ALIASES = {"MeanIOU", *HAT_ALIASES}
# Interfaces that are not built from configs.
NOT_BUILDABLE = {"BatchProcessorMixin"}


def _package_objects() -> dict[str, object]:
    """Every public name of the engine, callbacks and metrics modules that exist."""
    found: dict[str, object] = {}
    for pkg_name in ("hat_ignite.engine", "hat_ignite.callbacks", "hat_ignite.metrics"):
        pkg = importlib.import_module(pkg_name)
        modules = [pkg] + [
            importlib.import_module(f"{pkg_name}.{m.name}") for m in pkgutil.walk_packages(pkg.__path__) if not m.ispkg
        ]
        for module in modules:
            for name in getattr(module, "__all__", []):
                found.setdefault(name, getattr(module, name))
    return found


def test_every_table_entry_imports_and_is_named_as_registered():
    for name in BUILTIN_OBJECTS:
        obj = OBJECT_REGISTRY.get(name)
        assert callable(obj), name
        assert obj.__name__ == name or name in ALIASES, (name, obj)


def test_every_seed_name_in_the_package_is_registered():
    present = _package_objects()
    missing = [n for n in SEED_NAMES if n in present and n not in NOT_BUILDABLE and n not in OBJECT_REGISTRY]
    assert missing == []


def test_every_callback_and_metric_class_is_registered():
    from hat_ignite.callbacks.base import CallbackMixin
    from hat_ignite.metrics.base import EvalMetric

    missing = [
        name for name, obj in _package_objects().items()
        if inspect.isclass(obj) and issubclass(obj, (CallbackMixin, EvalMetric))
        and obj is not EvalMetric and not name.endswith("Base")  # bases to subclass, not to build
        and name not in OBJECT_REGISTRY
    ]
    assert missing == []


def test_build_by_registered_name_dotted_path_and_object():
    ds = build_from_cfg({"type": "DigitsDataset", "split": "val"})
    assert type(ds).__name__ == "DigitsDataset" and len(ds) == 360
    assert build_from_cfg({"type": "torch.nn.Linear", "in_features": 2, "out_features": 3}).out_features == 3
    assert build_from_cfg({"type": "torch.nn:Identity"}).__class__ is torch.nn.Identity
    assert isinstance(build_from_cfg({"type": torch.nn.ReLU}), torch.nn.ReLU)
    collector = build_from_cfg({"type": "collect_loss_by_index", "indexes": 0})
    assert collector(([torch.tensor(1.0)], "preds")) == [torch.tensor(1.0)]


def test_nested_configs_are_built_and_plain_dicts_stay_dicts():
    cfg = {
        "type": "torch.nn.Sequential",
        "0": {"type": "torch.nn.Linear", "in_features": 4, "out_features": 2},
    }
    with pytest.raises(ConfigError):  # Sequential takes *args: keyword "0" is rejected, with its signature
        build_from_cfg(cfg)
    built = build_from_cfg({
        "type": "builtins.dict",
        "layers": [{"type": "torch.nn.ReLU"}, {"type": "torch.nn.Tanh"}],
        "options": {"depth": 2, "act": {"type": "torch.nn.GELU"}},
    })
    assert [type(m).__name__ for m in built["layers"]] == ["ReLU", "Tanh"]
    assert built["options"]["depth"] == 2 and isinstance(built["options"]["act"], torch.nn.GELU)


def test_a_shared_config_dict_is_built_once_and_the_config_is_not_changed():
    metric = {"type": "Accuracy"}
    cfg = {"type": "builtins.dict", "a": metric, "b": [metric]}
    before = repr(cfg)
    built = build_from_cfg(cfg)
    assert built["a"] is built["b"][0]
    assert repr(cfg) == before


def test_build_recursive_false_leaves_a_config_for_later():
    built = build_from_cfg({"type": "builtins.dict", "later": {"type": "Accuracy", "__build_recursive": False}})
    assert built["later"] == {"type": "Accuracy"}


def test_unknown_type_names_the_key_path_and_the_closest_names():
    cfg = {"type": "Trainer", "callbacks": [{"type": "CallbackMixin"}, {"type": "CallbackMixin"}, {"type": "MetricUpdatr"}]}
    with pytest.raises(ConfigError) as info:
        build_from_cfg(cfg, key_path="float_trainer")
    message = str(info.value)
    assert message.startswith("float_trainer.callbacks[2].type: unknown type 'MetricUpdatr'")
    assert "Did you mean 'MetricUpdater'" in message


def test_bad_import_paths_say_what_is_missing():
    with pytest.raises(ConfigError, match=r"x\.type: cannot import 'torch\.optim\.SGDD'.*has no attribute 'SGDD'"):
        build_from_cfg({"type": "torch.optim.SGDD"}, key_path="x")
    with pytest.raises(ConfigError, match="no module named 'no_such_pkg'"):
        build_from_cfg({"type": "no_such_pkg.Thing"})
    with pytest.raises(ConfigError, match="type must be a name"):
        build_from_cfg({"type": 3})


def test_wrong_or_missing_arguments_name_the_key_path_and_the_signature():
    with pytest.raises(ConfigError) as info:
        build_from_cfg({"type": "DigitsDataset", "colour": "red"}, key_path="data_loader.dataset")
    message = str(info.value)
    assert message.startswith("data_loader.dataset: cannot build DigitsDataset")
    assert "unexpected keyword argument 'colour'" in message
    assert "DigitsDataset(split: str = 'train', val_ratio: float = 0.2" in message
    with pytest.raises(ConfigError, match=r"cb: cannot build MetricUpdater: missing a required argument: 'metric_update_func'"):
        build_from_cfg({"type": "MetricUpdater"}, key_path="cb")


def test_a_constructor_rejecting_a_value_is_reported_at_its_key_path():
    with pytest.raises(ConfigError, match=r"ds: building DigitsDataset failed: .*split must be one of"):
        build_from_cfg({"type": "DigitsDataset", "split": "test"}, key_path="ds")


def _trainer_cfg(optimizer):
    return {
        "type": "Trainer",
        "model": {"type": "MLPClassifier", "hidden_features": 8},
        "data_loader": [],
        "optimizer": optimizer,
        "batch_processor": {"type": "BasicBatchProcessor", "need_grad_update": True,
                            "loss_collector": {"type": "collect_loss_by_index", "indexes": 0}},
        "device": None,
        "num_epochs": 1,
    }


def test_an_optimizer_config_inside_a_trainer_gets_the_model_parameters():
    trainer = build_from_cfg(_trainer_cfg({"type": "torch.optim.SGD", "lr": 0.5}), key_path="float_trainer")
    params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    assert params == list(trainer.model.parameters())
    grouped = build_from_cfg(_trainer_cfg({
        "type": "torch.optim.SGD", "lr": 0.5, "weight_decay": 1e-3, "params": {"bias": {"weight_decay": 0.0}},
    }))
    groups = grouped.optimizer.param_groups
    assert [(len(g["params"]), g["weight_decay"]) for g in groups] == [(2, 0.0), (2, 1e-3)]


def test_an_error_inside_the_deferred_optimizer_has_the_full_key_path():
    with pytest.raises(ConfigError) as info:
        build_from_cfg(_trainer_cfg({"type": "torch.optim.SGD", "lrr": 0.1}), key_path="float_trainer")
    message = str(info.value)
    assert message.startswith("float_trainer.optimizer: cannot build SGD")
    assert "Did you mean 'lr' for 'lrr'?" in message


def test_build_optimizer_param_group_patterns():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    opt = build_optimizer({"type": "torch.optim.AdamW", "lr": 1e-3, "params": {r"^1\.": {"lr": 1e-2}}}, model)
    assert [(len(g["params"]), g["lr"]) for g in opt.param_groups] == [(2, 1e-2), (2, 1e-3)]
    assert opt.param_groups[0]["params"][0] is model[1].weight
    with pytest.raises(ConfigError, match=r"opt\.params: the pattern\(s\) 'wieght' match no trainable parameter"):
        build_optimizer({"type": "torch.optim.SGD", "lr": 0.1, "params": {"wieght": {}}}, model, key_path="opt")
    explicit = build_optimizer({"type": "torch.optim.SGD", "lr": 0.1, "params": list(model[0].parameters())}, model)
    assert len(explicit.param_groups[0]["params"]) == 2


def test_registration_is_explicit_and_duplicates_are_errors():
    reg = Registry("test", {"Builtin": "collections:OrderedDict"})

    @reg.register
    class Box:
        def __init__(self, size: int = 1) -> None:
            self.size = size

    reg.register(name="Crate")(Box)
    assert reg.build({"type": "Crate", "size": 4}).size == 4
    assert reg.names() == ["Builtin", "Box", "Crate"]
    with pytest.raises(ConfigError, match="'Box' is already registered"):
        reg.register_module("Box", dict)
    with pytest.raises(ConfigError, match="'Builtin' is already registered .*collections.OrderedDict"):
        reg.register_module("Builtin", dict)
    with pytest.raises(ConfigError, match="must be an identifier"):
        reg.register_module("not a name", dict)
    with pytest.raises(ConfigError, match="unknown type 'Bux'.*Did you mean 'Box'"):
        build_from_cfg({"type": "Bux"}, registry=reg)
    assert "Box" not in OBJECT_REGISTRY  # a registry of its own leaves the global one alone


def test_the_docs_api_map_lists_every_registered_name():
    from conftest import ROOT

    text = (ROOT / "docs" / "config.md").read_text()
    assert [name for name in BUILTIN_OBJECTS if f"`{name}`" not in text] == []


def test_hat_registration_spellings():
    """HAT's forms: @register, register(obj, name=...), @register(name=...), @alias, @register_module."""
    reg = Registry("hat-style")

    @reg.register
    @reg.alias("box_alias")
    class Box:
        def __init__(self, size: int = 1) -> None:
            self.size = size

    @reg.register_module
    class Bag(Box):
        pass

    @reg.register_module()  # MMEngine's spelling
    class Bin(Box):
        pass

    @reg.register(name="crate")
    class Crate(Box):
        pass

    def make_box(size: int) -> Box:
        return Box(size)

    assert reg.register(make_box, name="make") is make_box
    assert reg.register_module(make_box) is make_box
    assert reg.register_module(make_box, name="make_again") is make_box
    assert sorted(reg.keys()) == ["Bag", "Bin", "Box", "box_alias", "crate", "make", "make_again", "make_box"]
    assert [type(reg.build({"type": n, "size": 2})).__name__ for n in ("Box", "box_alias", "Bag", "Bin", "crate")] == [
        "Box", "Box", "Bag", "Bin", "Crate"]
    assert reg.build({"type": "make", "size": 5}).size == 5
    with pytest.raises(ConfigError, match="register_module takes"):
        reg.register_module(Box, "x", "y")


def test_running_a_module_again_re_registers_its_classes_without_error():
    """A config (or module) executed twice defines its classes again: same module and name is no clash."""
    reg = Registry("rerun")
    source = "class Net:\n    pass\nreg.register(Net)\n"
    first, second = {"reg": reg, "__name__": "user_models"}, {"reg": reg, "__name__": "user_models"}
    exec(source, first)
    exec(source, second)
    assert reg.get("Net") is second["Net"]  # the newest definition
    other = {"reg": reg, "__name__": "other_models"}
    with pytest.raises(ConfigError, match=r"'Net' is already registered \(as user_models\.Net\)"):
        exec(source, other)


def test_hat_snake_case_engine_aliases_resolve_to_the_engines():
    from hat_ignite.engine import DataParallelTrainer, DistributedDataParallelTrainer

    assert OBJECT_REGISTRY.resolve("distributed_data_parallel_trainer") is DistributedDataParallelTrainer
    assert OBJECT_REGISTRY.resolve("data_parallel_trainer") is DataParallelTrainer
    OBJECT_REGISTRY.register(DataParallelTrainer)  # HAT code re-registering the class: a no-op, not a clash
    OBJECT_REGISTRY.register(DistributedDataParallelTrainer, name="distributed_data_parallel_trainer")
    assert "DataParallelTrainer" not in OBJECT_REGISTRY._objects
    with pytest.raises(ConfigError, match=r"type 'deepspeed_trainer' is a HAT class hat-ignite does not provide: "
                                          r"DeepSpeed is not supported; use 'distributed_data_parallel_trainer'"):
        build_from_cfg({"type": "deepspeed_trainer"})
    with pytest.raises(ConfigError, match=r"cb\.type: type 'AIDIExperimentManager' is a HAT class hat-ignite does "
                                          r"not provide: AIDI experiment tracking .* enable_model_tracking"):
        build_from_cfg({"type": "AIDIExperimentManager", "model_name": "x"}, key_path="cb")


def test_a_typo_in_an_argument_name_names_the_closest_valid_one():
    cfg = {"type": "torch.nn.Linear", "in_features": 2, "out_feature": 3}
    with pytest.raises(ConfigError, match=r"layer: cannot build Linear: .*'out_features'\. Did you mean "
                                          r"'out_features' for 'out_feature'\?$"):
        build_from_cfg(cfg, key_path="layer")


def test_a_typo_in_a_trainer_argument_is_one_short_line_without_the_signature():
    cfg = {"type": "Trainer", "model": None, "data_loader": None, "optimizer": None, "batch_processor": None,
           "num_epoch": 2}
    with pytest.raises(ConfigError) as info:
        build_from_cfg(cfg, key_path="float_trainer")
    message = str(info.value)
    assert "Did you mean 'num_epochs' for 'num_epoch'?" in message
    assert "signature" not in message and len(message) < 200, message


def test_an_argument_with_no_close_name_gets_the_signature():
    cfg = {"type": "torch.nn.Linear", "in_features": 2, "out_features": 3, "zzz": 1}
    with pytest.raises(ConfigError, match=r"layer: cannot build Linear: .*'zzz'\. Its signature is Linear\("):
        build_from_cfg(cfg, key_path="layer")


def test_hat_sampler_idiom_builds_the_sampler_on_the_loader_dataset():
    """``sampler=dict(type=DistributedSampler)`` in a DataLoader config, as HAT configs write it."""
    cfg = {
        "type": torch.utils.data.DataLoader,
        "dataset": {"type": "hat_ignite.data.digits:DigitsDataset", "split": "val"},
        "sampler": {"type": torch.utils.data.DistributedSampler, "shuffle": False},
        "batch_size": 4,
        "shuffle": True,  # HAT turns it off: the sampler decides the order
    }
    loader = build_from_cfg(cfg)
    assert isinstance(loader.sampler, torch.utils.data.DistributedSampler)
    assert loader.sampler.dataset is loader.dataset  # one dataset object, built once
    # no process group in this process: one replica, rank 0, every sample once in order
    assert (loader.sampler.num_replicas, loader.sampler.rank) == (1, 0)
    assert list(loader.sampler) == list(range(len(loader.dataset)))
    assert sum(len(batch["labels"]) for batch in loader) == 360
    assert "dataset" not in cfg["sampler"] and cfg["shuffle"] is True  # the config is not modified
    explicit = build_from_cfg({"type": "torch.utils.data.DistributedSampler", "dataset": list(range(10)),
                               "num_replicas": 2, "rank": 1, "shuffle": False})
    assert list(explicit) == [1, 3, 5, 7, 9]


def _names(model, optimizer):
    names = {id(p): n for n, p in model.named_parameters()}
    return [([names[id(p)] for p in g["params"]], g["lr"], g["weight_decay"]) for g in optimizer.param_groups]


def test_an_optimizer_dict_with_model_is_built_for_that_model_hat_style():
    # HAT's registry builds dict(type=<optimizer>, ..., model=model) at once. Expected groups were
    # measured with HAT's own _build_optimizer on this model: name-matched groups in the order of
    # `params`, then the others, whose weight_decay is the config's or 0 (also for AdamW).
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    sgd = build_from_cfg({"type": torch.optim.SGD, "lr": 0.1, "params": {"weight": {"weight_decay": 1e-4}},
                          "model": model})
    assert _names(model, sgd) == [
        (["0.weight", "1.weight", "2.weight"], 0.1, 1e-4), (["0.bias", "1.bias", "2.bias"], 0.1, 0),
    ]
    decayed = build_from_cfg({"type": "torch.optim.SGD", "lr": 0.1, "weight_decay": 5e-4,
                              "params": {"bias": {"weight_decay": 0.0}}, "model": model})
    assert _names(model, decayed) == [
        (["0.bias", "1.bias", "2.bias"], 0.1, 0.0), (["0.weight", "1.weight", "2.weight"], 0.1, 5e-4),
    ]
    adamw = build_from_cfg({"type": torch.optim.AdamW, "lr": 0.1,
                            "params": {"1.": {"weight_decay": 0.0, "lr": 0.5}}, "model": model})
    assert _names(model, adamw) == [
        (["1.weight", "1.bias"], 0.5, 0.0), (["0.weight", "0.bias", "2.weight", "2.bias"], 0.1, 0),
    ]
    plain = build_from_cfg({"type": torch.optim.SGD, "lr": 0.1, "model": model})
    assert [p for g in plain.param_groups for p in g["params"]] == list(model.parameters())


def test_an_optimizer_dict_with_a_model_config_shares_the_built_model():
    model_cfg = {"type": "torch.nn.Linear", "in_features": 2, "out_features": 1}
    built = build_from_cfg({"model": model_cfg,
                            "optimizer": {"type": "torch.optim.SGD", "lr": 0.1, "model": model_cfg}})
    assert [p for g in built["optimizer"].param_groups for p in g["params"]] == list(built["model"].parameters())
    with pytest.raises(ConfigError, match=r"optimizer\.model: an optimizer's model must be a torch\.nn\.Module"):
        build_from_cfg({"type": "torch.optim.SGD", "lr": 0.1, "model": 3}, key_path="optimizer")


def test_hats_trainer_config_with_the_model_dict_shared_by_its_optimizer_trains_that_model():
    # HAT's trainer tests write trainer_cfg["optimizer"]["model"] = trainer_cfg["model"] (one dict
    # object, kept shared by copy.deepcopy): the optimizer must update the trainer's own model.
    import copy

    from torch.utils.data import DataLoader, Subset

    from hat_ignite.data.digits import DigitsDataset

    cfg = _trainer_cfg({"type": torch.optim.SGD, "params": {"weight": {"weight_decay": 4e-5}}, "lr": 0.1})
    cfg["optimizer"]["model"] = cfg["model"]
    cfg = copy.deepcopy(cfg)
    cfg["data_loader"] = DataLoader(Subset(DigitsDataset("train"), range(16)), batch_size=8)
    trainer = build_from_cfg(cfg)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.fit()
    grouped = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    assert {id(p) for p in grouped} == {id(p) for p in trainer.model.parameters()}
    assert all(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    assert [g["weight_decay"] for g in trainer.optimizer.param_groups] == [4e-5, 0]
