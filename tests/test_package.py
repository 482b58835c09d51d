"""Package rules: the engine never imports callbacks, and import has no side effects."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

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
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"  # optional pieces load only when used


def test_engine_import_does_not_pull_callbacks():
    code = "import sys, hat_ignite.engine; print('hat_ignite.callbacks' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
