"""The README's command blocks run as written once `scripts/setup.sh` has made `.venv`.

Every ```bash block of the README that uses the commands (`hat-train`, `hat-predict`,
`hat-curves`) is run with bash, line by line as shown, in a scratch directory holding the
repository's `configs/` and `.venv`; the set-up blocks (the first one's two commands, and any that
installs) are what `scripts/train_digits.sh` / `.ci/run` run. The `PATH` is the test's own minus
any directory holding a `hat-train`, as in a fresh shell, so a command that needs the venv must say
so in the block itself.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from conftest import ROOT, time_limit

README = ROOT / "README.md"
SETUP_BLOCK = ("bash scripts/train_digits.sh", "bash scripts/test.sh")


def bash_blocks() -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def fresh_shell_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    dirs = env.get("PATH", "/usr/bin:/bin").split(os.pathsep)
    env["PATH"] = os.pathsep.join(d for d in dirs if not os.path.exists(os.path.join(d, "hat-train")))
    env["PYTHONPATH"] = str(ROOT)  # this checkout's code, wherever .venv's editable install points
    return env


def test_the_first_block_is_the_two_set_up_commands():
    first = bash_blocks()[0]
    assert all(command in first for command in SETUP_BLOCK), first


@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "hat-train").exists(), reason="no .venv (run scripts/setup.sh)")
def test_the_readme_command_blocks_run_as_written(tmp_path):
    blocks = [block for block in bash_blocks()[1:] if re.search(r"\bhat-(train|predict|curves)\b", block)]
    assert blocks and not any(re.search(r"\bpip\b|scripts/setup\.sh", block) for block in blocks), blocks
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    for block in blocks:
        proc = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, env=fresh_shell_env(),
                              capture_output=True, text=True, timeout=time_limit(300))
        assert proc.returncode == 0, f"README block failed:\n{block}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    work_dir = tmp_path / "work_dirs" / "digits_mlp"
    metrics = json.loads((work_dir / "metrics.json").read_text())
    assert {"float_train", "float_predict"} <= set(metrics), metrics
    assert (work_dir / "float_training_curves.png").stat().st_size > 0
