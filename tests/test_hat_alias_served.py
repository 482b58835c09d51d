"""Names HAT code imports next to the engine: served by the alias, behaving as HAT's; the rest refused by name.

Figures marked "HAT's" were measured by running HAT's own code on the same inputs.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import random

import numpy as np
import pytest
import torch
from torch import nn

from hat_ignite.registry import build_from_cfg
from hat_ignite.errors import ConfigError


def test_hat_module_paths_of_engine_and_callback_classes(hat_alias):
    from hat.callbacks import CosOptimParamUpdater, DumpData, MeanTeacher
    from hat.callbacks.dump_data import DumpData as DumpData2
    from hat.callbacks.mean_teacher import MeanTeacher as MeanTeacher2
    from hat.callbacks.online_model_trick import FreezeModule, FuseBN
    from hat.callbacks.param_updater import CyclicOptimParamUpdater, StepDecayOptimParamUpdater
    from hat.callbacks.validation import MeanTeacherValidation
    from hat.core.event import EventStorage
    from hat.engine.loop_base import PipeBase
    from hat.models.model_convert.converters import TorchCompile

    import hat_ignite.callbacks as cb
    import hat_ignite.engine as engine

    assert (FreezeModule, FuseBN, MeanTeacherValidation) == (cb.FreezeModule, cb.FuseBN, cb.MeanTeacherValidation)
    assert (MeanTeacher, MeanTeacher2, DumpData, DumpData2) == (cb.MeanTeacher,) * 2 + (cb.DumpData,) * 2
    assert (StepDecayOptimParamUpdater, CosOptimParamUpdater, CyclicOptimParamUpdater) == (
        cb.StepDecayOptimParamUpdater, cb.CosOptimParamUpdater, cb.CyclicOptimParamUpdater)
    assert (EventStorage, PipeBase) == (engine.EventStorage, engine.PipeBase)
    assert TorchCompile.__name__ == "TorchCompile"


def test_event_storage_as_hats_unit_test_uses_it(hat_alias):
    from hat.core.event import EventStorage

    with EventStorage() as storage:
        storage.put("viz_img", {"image1": 1})
        storage.put("viz_img", {"image2": 2})
    assert [list(r)[0] for r in storage.get("viz_img")] == ["image1", "image2"]
    storage.put("orig_img", {"image1": 1})
    storage.clear_key("viz_img")
    assert storage.histories["viz_img"] == [] and "orig_img" in storage.histories


def test_pipe_base_runs_hat_callbacks_in_a_hand_written_loop(hat_alias):
    """HAT's unit tests drive callbacks with a PipeBase subclass of their own (a boring trainer)."""
    from hat.callbacks import CallbackMixin, MeanTeacher
    from hat.engine.loop_base import PipeBase

    class Steps(CallbackMixin):
        def __init__(self):
            self.seen = []

        def on_step_end(self, global_step_id, **kwargs):
            self.seen.append(global_step_id)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.student_fc, self.teacher_fc = nn.Linear(2, 1), nn.Linear(2, 1)

    class BoringTrainer(PipeBase):
        def __init__(self, model, callbacks):
            super().__init__(callbacks)
            self.model = model

        def fit(self):
            self.on_loop_begin(model=self.model, loop=self)
            for g in range(3):
                self.on_step_end(model=self.model, global_step_id=g, loop=self)
            self.on_loop_end(model=self.model, loop=self)

    steps, net = Steps(), Net()
    trainer = BoringTrainer(net, [MeanTeacher(decay=0.5, decay_base=1e-9), steps])
    trainer.fit()
    assert steps.seen == [0, 1, 2] and trainer.name == "BoringTrainer"
    # three updates with d = 0.5 toward a fixed student: the teacher covered 7/8 of the gap
    torch.testing.assert_close(net.teacher_fc.weight, net.student_fc.weight, atol=1.0, rtol=0)
    with pytest.raises(TypeError, match="abstract"):
        PipeBase()


def test_torch_compile_is_torch2compile_with_hats_arguments():
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
    x = torch.randn(4, 3)
    eager = model(x)
    compiled = build_from_cfg({"type": "TorchCompile", "compile_backend": counting})(model)
    assert compiled is model and sorted(model.state_dict()) == ["0.bias", "0.weight"]
    torch.testing.assert_close(model(x), eager)
    assert len(graphs) == 1
    with pytest.raises(ValueError, match=r"load_extensions='trt'.*not part of hat-ignite.*compile_backend"):
        build_from_cfg({"type": "TorchCompile", "load_extensions": "trt"})


@pytest.mark.parametrize("name, why", [
    ("MultiStageBatchProcessor", r"MultitaskGraphModel\.split_module.*use 'MultiBatchProcessor'"),
    ("ExceptionMonitor", r"AIDI's monitoring service.*drop the callback"),
])
def test_engine_classes_left_out_are_refused_by_name(hat_alias, name, why):
    with pytest.raises(ConfigError, match=rf"x\.type: type '{name}' is a HAT class hat-ignite does not provide: .*{why}"):
        build_from_cfg({"type": name}, key_path="x")
    module = {"MultiStageBatchProcessor": "hat.engine.processors",
              "ExceptionMonitor": "hat.callbacks.exception_monitor"}[name]
    with pytest.raises(ImportError, match=rf"{name} is a HAT class hat-ignite does not provide: .*{why}"):
        exec(f"from {module} import {name}")


def test_the_alias_messages_name_the_right_fix(hat_alias):
    with pytest.raises(ImportError) as info:
        from hat.utils import save_pickle  # noqa: F401
    text = str(info.value)
    assert "Did you mean 'hat.utils'" not in text and "OBJECT_REGISTRY" not in text
    assert "Define 'save_pickle' in a module of your own and import it from there" in text
    with pytest.raises(ImportError) as info:
        from hat.utils.apply_func import convert_numpy  # noqa: F401
    assert "OBJECT_REGISTRY" not in str(info.value) and "provides" in str(info.value)
    with pytest.raises(ImportError, match=r"hat-ignite serves FuseBN as hat\.callbacks\.online_model_trick\.FuseBN"):
        from hat.callbacks.freeze_bn import FuseBN  # noqa: F401
    with pytest.raises(ImportError, match=r"Did you mean 'hat.engine'"):
        from hat.engin import Trainer  # noqa: F401
    with pytest.raises(ImportError, match=r"model zoo .* OBJECT_REGISTRY"):
        from hat.models.backbones import ResNet18  # noqa: F401


# -- helpers ---------------------------------------------------------------------------------
def test_seed_everything_gives_hats_random_streams(hat_alias):
    from hat.utils.seed import seed_everything

    assert seed_everything(7) == 7
    # HAT's seed_everything(7), then one draw from each generator
    assert random.random() == 0.32383276483316237
    assert float(np.random.rand()) == 0.07630828937395717
    assert float(torch.rand(1)) == pytest.approx(0.5349225401878357, abs=0)
    assert os.environ["PYTHONHASHSEED"] == "7"


def test_flatten_and_regroup_give_hats_layout(hat_alias):
    from hat.utils.apply_func import flatten, regroup

    nested = {"a": [1, (2, 3)], "b": {"c": 4, "d": []}, "e": 5}
    flat, layout = flatten(nested)
    assert flat == (1, 2, 3, 4, 5)
    assert repr(layout) == (  # HAT's layout for the same object
        "(<class 'dict'>, (('a', (<class 'list'>, (<class 'object'>, (<class 'tuple'>, (<class 'object'>, "
        "<class 'object'>))))), ('b', (<class 'dict'>, (('c', <class 'object'>), ('d', (<class 'list'>, ()))))), "
        "('e', <class 'object'>)))"
    )
    assert regroup(flat, layout) == (nested, 5)


def test_get_binding_module_unwraps_data_parallel(hat_alias):
    from hat.utils.model_helpers import get_binding_module

    net = nn.Linear(2, 2)
    assert get_binding_module(nn.DataParallel(net)) is net and get_binding_module(net) is net


def test_the_hash_helper_accepts_the_checkpoints_hat_ignite_names_after_their_content(hat_alias, tmp_path):
    """HAT's own Checkpoint tests resolve each saved file with get_hash_file_if_hashed_and_local:
    hat-ignite names a periodic checkpoint after the hash of what it holds, which the helper
    verifies by loading it; a damaged one is still refused."""
    import torch

    from hat.utils.hash import get_hash_file_if_hashed_and_local

    from hat_ignite.callbacks.checkpoint import Checkpoint
    from hat_ignite.engine import BasicBatchProcessor, Trainer

    model = torch.nn.Linear(2, 1)
    data = [(torch.randn(4, 2),)] * 2
    Trainer(model=model, data_loader=data, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), device=None,
            batch_processor=BasicBatchProcessor(need_grad_update=True,
                                                loss_collector=lambda out: [out.sum()]),
            num_epochs=1, callbacks=[Checkpoint(str(tmp_path), interval_by="step")]).fit()
    (saved,) = [p for p in tmp_path.iterdir() if p.name.startswith("checkpoint-step-0-")]
    assert get_hash_file_if_hashed_and_local(str(tmp_path / "checkpoint-step-0.pth.tar")) == str(saved)
    data = bytearray(saved.read_bytes())
    data[len(data) // 2] ^= 0xFF
    saved.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="does not match the hash in its name"):
        get_hash_file_if_hashed_and_local(str(tmp_path / "checkpoint-step-0.pth.tar"))


def test_hashed_checkpoint_names_resolve_as_hats(hat_alias, tmp_path, caplog):
    from hat.utils.hash import get_hash_file_if_hashed_and_local

    content = b"checkpoint bytes"
    sha = hashlib.sha256(content).hexdigest()
    (tmp_path / f"float-checkpoint-best-{sha[:8]}.pth.tar").write_bytes(content)
    found = get_hash_file_if_hashed_and_local(str(tmp_path / "float-checkpoint-best.pth.tar"))
    assert os.path.basename(found) == "float-checkpoint-best-469f693d.pth.tar"  # HAT's answer
    (tmp_path / "bad-checkpoint-00000000.pth.tar").write_bytes(content)
    with pytest.raises(ValueError, match="the name carries .00000000., its SHA-256 starts with .469f693d."):  # HAT: ValueError too
        get_hash_file_if_hashed_and_local(str(tmp_path / "bad-checkpoint.pth.tar"))
    with pytest.raises(ValueError, match="does not exist"):  # HAT: ValueError too
        get_hash_file_if_hashed_and_local(str(tmp_path / "none.pth.tar"))
    plain = tmp_path / "plain.pth.tar"
    plain.write_bytes(content)
    with caplog.at_level(logging.WARNING):
        assert get_hash_file_if_hashed_and_local(str(plain)) == str(plain)
    assert "no hash in its name" in caplog.text
    assert get_hash_file_if_hashed_and_local("hdfs://cluster/ckpt.pth.tar") == "hdfs://cluster/ckpt.pth.tar"


def test_check_packages_available_answers_as_hats(hat_alias):
    from hat.utils.package_helper import check_packages_available

    # HAT's answers: True, False, False, and a ModuleNotFoundError when asked to raise
    assert check_packages_available("torch>=1.0", "torch.nn") is True
    assert check_packages_available("torch>=1000", raise_exception=False) is False
    assert check_packages_available("no_such_pkg_xyz", raise_exception=False) is False
    with pytest.raises(ModuleNotFoundError, match="no_such_pkg_xyz.*pip install it"):
        check_packages_available("no_such_pkg_xyz", raise_msg="pip install it")


def test_init_logger_writes_hats_file_and_line(hat_alias, tmp_path):
    from hat.utils.logger import init_logger

    init_logger(str(tmp_path / "logs" / "train"), logger_name="hat_served_test", rank=1,
                set_stdout=False, set_stderr=False)
    log = logging.getLogger("hat_served_test")
    try:
        line_no = inspect.currentframe().f_lineno + 1
        log.info("hello")
        assert os.listdir(tmp_path / "logs") == ["train-rank1.log"]  # HAT's file name
        line = (tmp_path / "logs" / "train-rank1.log").read_text()
        # HAT's line after the time stamp
        assert line.split(" ", 2)[2] == f"INFO [test_hat_alias_served.py:{line_no}] Node[1] hello\n"
    finally:
        for handler in list(log.handlers):
            log.removeHandler(handler)
            handler.close()


class _Tasks(nn.Module):
    """A backbone and two task heads, each with a BatchNorm (the layout of HAT's toy graph model)."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
        self.task1 = nn.Sequential(nn.Conv2d(4, 2, 1), nn.BatchNorm2d(2))
        self.task2 = nn.Sequential(nn.Conv2d(4, 2, 1), nn.BatchNorm2d(2))


@pytest.mark.parametrize("update_by, points, nodes", [
    ("step", [1, 2], [["backbone"], ["task1"]]),
    ("epoch", [2], [["backbone", "task1", "task2"]]),
])
def test_online_model_tricks_run_with_hats_hook_keywords(hat_alias, update_by, points, nodes):
    """HAT's test_online_model_trick drives the callbacks by hand with only ``model=`` (no loop)."""
    from hat.callbacks.online_model_trick import FreezeModule, FuseBN
    from hat.utils.model_helpers import has_normalization

    model = nn.DataParallel(_Tasks())
    freeze = FreezeModule(nodes, points, update_by)
    model.train()
    for i in range(max(points) + 1):
        freeze.on_loop_begin(model=model)
        freeze.on_epoch_begin(epoch_id=i, model=model)
        freeze.on_step_begin(step_id=i, global_step_id=i, model=model)
        for at, names in zip(points, nodes):
            for name in names:
                sub = getattr(model.module, name)
                assert sub.training is (i < at)
                assert all(p.requires_grad is (i < at) for p in sub.parameters())

    model = nn.DataParallel(_Tasks()).train()
    fuse = FuseBN(nodes, points, update_by, inplace=True)
    for i in range(max(points) + 1):
        fuse.on_loop_begin(model=model)
        fuse.on_epoch_begin(epoch_id=i, model=model)
        fuse.on_step_begin(step_id=i, global_step_id=i, model=model)
        for at, names in zip(points, nodes):
            for name in names:
                assert has_normalization(getattr(model.module, name), check_list=["bn"]) is (i < at)
