"""Shared fixtures: the repository root, small config files, and running the command-line tools."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap
from typing import Callable

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DIGITS_CONFIG = ROOT / "configs" / "classification" / "digits_mlp.py"


@pytest.fixture
def hat_alias():
    """The ``hat`` alias installed afresh for one test (every virtual module new), and removed
    afterwards (with every virtual module), so that the next test starts without it."""
    from hat_ignite.hat_alias import install_hat_alias, uninstall_hat_alias

    uninstall_hat_alias()
    yield install_hat_alias()
    uninstall_hat_alias()


@pytest.fixture
def write_config(tmp_path: pathlib.Path) -> Callable[..., pathlib.Path]:
    """``write_config(source, name="cfg.py")`` writes a dedented config file and returns its path."""

    def write(source: str, name: str = "cfg.py") -> pathlib.Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        return path

    return write


def run_tool(tool: str, *args: str, cwd: pathlib.Path | str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``bin/<tool> args...`` with this Python in a real subprocess."""
    return subprocess.run(
        [sys.executable, str(ROOT / "bin" / tool), *map(str, args)],
        cwd=cwd, capture_output=True, text=True, timeout=timeout,
    )


def flat_digits_loader(n: int = 240, batch_size: int = 40):
    """The first ``n`` sklearn digits as ``(x [n, 64] in [0, 1], label)`` batches, in order."""
    import torch
    from sklearn.datasets import load_digits
    from torch.utils.data import DataLoader, TensorDataset

    x, y = load_digits(return_X_y=True)
    ds = TensorDataset(torch.tensor(x[:n] / 16.0, dtype=torch.float32), torch.tensor(y[:n]))
    return DataLoader(ds, batch_size=batch_size, shuffle=False)

# projects/ holds whole user projects (configs, their own model files) that tests copy and run
# through the command line; their files are not test modules
collect_ignore = ["projects"]
