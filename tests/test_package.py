"""Package rules: the engine never imports callbacks, and import has no side effects."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
from conftest import time_limit

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_engine_sources_never_import_callbacks():
    offenders = []
    for path in (ROOT / "hat_ignite" / "engine").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.startswith("hat_ignite.callbacks")]
    assert offenders == []


def test_import_has_no_side_effects():
    code = (
        "import logging, signal, sys\n"
        "before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)\n"
        "import hat_ignite, hat_ignite.engine, hat_ignite.callbacks\n"
        "assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before\n"
        "assert logging.getLogger().handlers == []\n"
        "print('tensorboardX' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=time_limit(120), cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"  # optional pieces load only when used


def test_engine_import_does_not_pull_callbacks():
    code = "import sys, hat_ignite.engine; print('hat_ignite.callbacks' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=time_limit(120), cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


LAZY_PACKAGES = ["callbacks", "engine", "metrics", "models", "data", "quantization", "pt2", "checkpoint"]


def _type_checking_imports(package: str) -> dict[str, list[str]]:
    """module -> names imported under ``if TYPE_CHECKING:`` in the package's __init__."""
    tree = ast.parse((ROOT / "hat_ignite" / package / "__init__.py").read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING")
    return {node.module: [a.name for a in node.names] for node in block.body if isinstance(node, ast.ImportFrom)}


def test_lazy_packages_serve_the_names_type_checkers_see():
    """Each package's lazy table, its __all__ and its TYPE_CHECKING imports name the same objects."""
    import importlib

    for package in LAZY_PACKAGES:
        module = importlib.import_module(f"hat_ignite.{package}")
        table = module._EXPORTS
        assert {m: sorted(n) for m, n in table.items()} == {
            m: sorted(n) for m, n in _type_checking_imports(package).items()}, package
        assert sorted(module.__all__) == sorted(name for names in table.values() for name in names), package
        for source, names in table.items():
            for name in names:
                assert getattr(module, name) is getattr(importlib.import_module(source), name), (package, name)
        assert set(module.__all__) <= set(dir(module))
        try:
            module.NoSuchName
        except AttributeError as exc:
            assert str(exc) == f"module 'hat_ignite.{package}' has no attribute 'NoSuchName'"


def test_importing_a_package_imports_none_of_its_modules():
    code = ("import sys; import " + ", ".join(f"hat_ignite.{p}" for p in LAZY_PACKAGES) + "\n"
            "print(sorted(m for m in sys.modules if m.startswith('hat_ignite.') and m.count('.') > 1))\n"
            "from hat_ignite.callbacks import Checkpoint\n"
            "print('hat_ignite.callbacks.checkpoint' in sys.modules, 'hat_ignite.callbacks.freeze' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=time_limit(120), cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[]", "True False"]


def test_hat_train_help_imports_neither_torch_nor_ignite():
    """``hat-train CONFIG --help`` answers from the parser alone: importing an engine module for a
    default (as the parser does) must not run an engine package that imports torch."""
    config = ROOT / "configs" / "classification" / "digits_mlp.py"
    code = ("import sys; from hat_ignite.cli.train import main; code = main([sys.argv[1], '--help']); "
            "print(code, 'torch' in sys.modules, 'ignite' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(config)], capture_output=True, text=True, timeout=time_limit(120),
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "--stage" in out.stdout and out.stdout.splitlines()[-1] == "0 False False"
    assert "use only configs you trust" in " ".join(out.stdout.split())  # reading a config runs it
