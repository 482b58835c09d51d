"""The ``hat`` import alias: HAT's module names serve hat-ignite's objects, only when asked, never over HAT."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT, time_limit

from hat_ignite.hat_alias import hat_alias_installed, install_hat_alias, uninstall_hat_alias


def _run_python(code: str, *path: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter with the repository (and ``path``) importable."""
    env_path = ":".join([str(ROOT), *path])
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=time_limit(60),
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
    )


def test_the_alias_serves_hat_ignite_objects_under_hat_names(hat_alias):
    assert hat_alias.alias and "hat-ignite" in str(hat_alias)
    import hat.engine.processors as processors
    from hat.callbacks import CallbackMixin, Checkpoint, StepDecayLrUpdater
    from hat.callbacks.callbacks import CallbackMixin as CallbackMixin2
    from hat.engine import DistributedDataParallelTrainer, Predictor, Trainer
    from hat.engine.processors.loss_collector import collect_loss_by_index
    from hat.metrics import Accuracy, LossShow
    from hat.models.model_convert import ModelConvertPipeline
    from hat.registry import OBJECT_REGISTRY, build_from_registry
    from hat.utils.config import Config, ConfigVersion

    import hat_ignite.callbacks as callbacks
    import hat_ignite.engine as engine
    import hat_ignite.metrics as metrics
    from hat_ignite import config, registry
    from hat_ignite.quantization import ModelConvertPipeline as OurPipeline

    assert OBJECT_REGISTRY is registry.OBJECT_REGISTRY
    assert (Trainer, Predictor, DistributedDataParallelTrainer) == (
        engine.Trainer, engine.Predictor, engine.DistributedDataParallelTrainer)
    assert processors.MultiBatchProcessor is engine.MultiBatchProcessor
    assert collect_loss_by_index is engine.collect_loss_by_index
    assert CallbackMixin is CallbackMixin2 is callbacks.CallbackMixin
    assert (Checkpoint, StepDecayLrUpdater) == (callbacks.Checkpoint, callbacks.StepDecayLrUpdater)
    assert (Accuracy, LossShow) == (metrics.Accuracy, metrics.LossShow)
    assert (Config, ConfigVersion) == (config.Config, config.ConfigVersion)
    assert ModelConvertPipeline is OurPipeline
    assert build_from_registry({"type": "fractions.Fraction", "numerator": 2, "denominator": 4}) == 0.5


def test_a_class_registered_through_hat_registry_builds_with_hat_ignite(hat_alias):
    from hat.registry import OBJECT_REGISTRY

    from hat_ignite.registry import build_from_cfg

    @OBJECT_REGISTRY.register
    class HatAliasProbe:
        def __init__(self, width: int = 1) -> None:
            self.width = width

    try:
        assert build_from_cfg({"type": "HatAliasProbe", "width": 3}).width == 3
    finally:
        OBJECT_REGISTRY._objects.pop("HatAliasProbe")


def test_install_is_idempotent_and_uninstall_removes_everything(hat_alias):
    import hat.engine  # noqa: F401

    assert install_hat_alias().alias
    assert sum(type(f).__name__ == "_HatFinder" for f in sys.meta_path) == 1
    uninstall_hat_alias()
    assert not hat_alias_installed()
    assert not [name for name in sys.modules if name == "hat" or name.startswith("hat.")]
    with pytest.raises(ModuleNotFoundError):
        import hat  # noqa: F401


def test_missing_model_zoo_names_say_what_is_missing_and_how_to_register_one(hat_alias):
    with pytest.raises(ImportError) as info:
        from hat.models.backbones import ResNet18  # noqa: F401
    message = str(info.value)
    assert message.startswith("hat.models.backbones.ResNet18: HAT's model zoo is not part of hat-ignite")
    assert "@OBJECT_REGISTRY.register" in message and "type='ResNet18'" in message
    with pytest.raises(ImportError, match=r"hat\.data\.collates\.collates\.collate_2d: HAT's datasets"):
        from hat.data.collates.collates import collate_2d  # noqa: F401
    with pytest.raises(ImportError, match=r"hat\.engine\.Trainr: hat-ignite's hat\.engine provides "
                                          r".*Did you mean 'Trainer'"):
        from hat.engine import Trainr  # noqa: F401
    with pytest.raises(ImportError, match=r"hat\.engin\.Trainer: hat-ignite serves no module 'hat\.engin'\. "
                                          r"Did you mean 'hat\.engine'\?"):
        from hat.engin import Trainer  # noqa: F401


def test_a_missing_name_is_an_attribute_error_and_a_from_import_keeps_the_message(hat_alias):
    import hat.models.backbones
    import hat.utils.model_helpers

    from hat_ignite.errors import MissingHatNameError

    assert not hasattr(hat.utils.model_helpers, "fx_wrap")
    assert getattr(hat.models.backbones, "ResNet18", None) is None
    assert hasattr(hat.utils.model_helpers, "has_normalization")  # a served name
    with pytest.raises(MissingHatNameError, match=r"^hat\.models\.backbones\.ResNet18: HAT's model zoo") as info:
        hat.models.backbones.ResNet18
    assert isinstance(info.value, AttributeError) and info.value.name == "ResNet18"
    for _ in range(2):  # after hasattr / getattr asked for them too
        with pytest.raises(ImportError, match=r"^hat\.utils\.model_helpers\.fx_wrap: hat-ignite's "):
            from hat.utils.model_helpers import fx_wrap  # noqa: F401
        with pytest.raises(ImportError, match=r"^hat\.models\.backbones\.ResNet18: HAT's model zoo"):
            from hat.models.backbones import ResNet18  # noqa: F401
    assert "hat.utils.model_helpers.fx_wrap" not in sys.modules  # no empty module was served
    from hat_ignite.registry import build_from_cfg
    with pytest.raises(ValueError, match=r"cannot import 'hat\.models\.backbones\.ResNet18': .*model zoo"):
        build_from_cfg({"type": "hat.models.backbones.ResNet18"})


def test_importing_hat_ignite_installs_nothing():
    proc = _run_python(
        """
        import importlib.util, sys
        import hat_ignite, hat_ignite.registry, hat_ignite.config, hat_ignite.hat_alias
        import hat_ignite.cli.train, hat_ignite.cli.predict
        assert importlib.util.find_spec("hat") is None, "hat became importable"
        assert not any(type(f).__name__ == "_HatFinder" for f in sys.meta_path)
        print("clean")
        """
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "clean", proc.stderr


def test_a_real_hat_package_is_left_alone(tmp_path):
    real = tmp_path / "hat"
    (real / "engine").mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n")
    (real / "engine" / "__init__.py").write_text("class Trainer:\n    pass\n")
    proc = _run_python(
        """
        import sys
        from hat_ignite.hat_alias import install_hat_alias
        source = install_hat_alias()
        import hat
        from hat.engine import Trainer
        assert hat.REAL and Trainer.__module__ == "hat.engine"
        assert not any(type(f).__name__ == "_HatFinder" for f in sys.meta_path)
        print(source.alias, source)
        """,
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("False hat.* imports use the installed HAT package at ")
    assert str(real / "__init__.py") in proc.stdout


def test_the_command_line_says_which_hat_it_uses(tmp_path, write_config):
    real = tmp_path / "real" / "hat"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n")
    config = write_config(
        """
        import hat
        assert hat.REAL
        float_predictor = dict(type="Predictor")
        """
    )
    env = {"PYTHONPATH": f"{ROOT}:{tmp_path / 'real'}", "PATH": "/usr/bin:/bin"}
    # the config loads with the real hat, then the stage fails to build (no model): the log says which hat
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bin" / "hat-predict"), "-c", str(config), "--work-dir", str(tmp_path / "w")],
        capture_output=True, text=True, timeout=time_limit(120), env=env,
    )
    assert proc.returncode == 1
    assert f"hat.* imports use the installed HAT package at {real / '__init__.py'}" in proc.stderr
    assert "cannot build Predictor" in proc.stderr


def test_hat_utilities_user_files_import(hat_alias, caplog):
    import torch
    from hat.registry import build_from_cfg
    from hat.utils.apply_func import _as_list, apply_to_collection
    from hat.utils.distributed import get_dist_info, rank_zero_only
    from hat.utils.logger import MSGColor, format_msg, rank_zero_info

    from hat_ignite.registry import OBJECT_REGISTRY

    assert _as_list(3) == [3] and _as_list([1]) == [1]
    doubled = apply_to_collection({"x": torch.ones(2), "n": [torch.zeros(1), "s"]}, torch.Tensor, lambda t: t + 1)
    assert doubled["x"].tolist() == [2.0, 2.0] and doubled["n"][1] == "s"
    assert get_dist_info() == (0, 1) and rank_zero_only(lambda: 5)() == 5
    with caplog.at_level("INFO", logger=__name__):
        rank_zero_info(format_msg("hello", MSGColor.RED))
    # logged as the caller's: its module's logger, file and line
    assert [(r.name, r.filename, r.getMessage()) for r in caplog.records] == [
        (__name__, "test_hat_alias.py", "\x1b[31mhello\x1b[0m")]
    # HAT's build_from_cfg(registry, cfg) builds one level: nested dicts stay dicts
    built = build_from_cfg(OBJECT_REGISTRY, {"type": "collections.OrderedDict", "inner": {"type": "x"}})
    assert built == {"inner": {"type": "x"}}


USER_DATASET = '''
import torch

from hat.registry import OBJECT_REGISTRY


@OBJECT_REGISTRY.register
class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor(float(i * i))
'''


def test_the_alias_holds_in_dataloader_workers_of_every_start_method(tmp_path):
    """A worker started with spawn or forkserver unpickles a dataset whose module imports ``hat``:
    it gets the parent's sys.path (not its import hook), and ``import hat`` still finds the alias.
    The alias's directory on sys.path is never taken for a real HAT."""
    (tmp_path / "user_data.py").write_text(textwrap.dedent(USER_DATASET))
    proc = _run_python(
        """
        import importlib.util, sys
        import torch
        from hat_ignite.hat_alias import ALIAS_PATH, install_hat_alias, uninstall_hat_alias

        assert install_hat_alias().alias and sys.path[-1] == ALIAS_PATH
        from hat_ignite.registry import build_from_cfg
        import user_data  # registers Squares through hat.registry

        dataset = build_from_cfg({"type": "Squares"})
        for method in ("fork", "spawn", "forkserver"):
            loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context=method)
            print(method, sum(float(b.sum()) for b in loader))
        assert importlib.util.find_spec("hat").origin.startswith(ALIAS_PATH)  # imported already: ours
        uninstall_hat_alias()
        assert ALIAS_PATH not in sys.path and importlib.util.find_spec("hat") is None
        assert install_hat_alias().alias  # its own directory is not a real HAT
        """,
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["fork", "140.0", "spawn", "140.0", "forkserver", "140.0"]
