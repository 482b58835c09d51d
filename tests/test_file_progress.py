"""The suite's command (scripts/test.sh, run by .ci/run) shows its progress one line per test file."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from conftest import ROOT

FILES = ["tests/test_hat_alias_served.py", "hat_ignite/registry.py"]


def pytest_arguments() -> list[str]:
    """The pytest options of scripts/test.sh's pytest line (what comes before its "$@")."""
    (line,) = [ln for ln in (ROOT / "scripts" / "test.sh").read_text().splitlines() if " -m pytest " in ln]
    words = shlex.split(line.split(" -m pytest ", 1)[1], comments=True)
    return words[: words.index("$@")]


def test_the_suite_command_prints_a_line_per_file():
    options = pytest_arguments()
    proc = subprocess.run([sys.executable, "-m", "pytest", *options, *FILES], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    progress = [ln for ln in lines if re.fullmatch(r"\[ *\d+% +\d+:\d\d\] \S+: .* \(\d+\.\d s\)", ln)]
    # before: "-q" alone printed one line of dots for the whole run
    assert [ln.split("] ", 1)[1].split(":")[0] for ln in progress] == FILES, proc.stdout
    assert ": 17 passed (" in progress[0] and ": 4 passed (" in progress[1]
    assert progress[-1].startswith("[100%")
    assert not any(re.fullmatch(r"\.+( *\[ *\d+%\])?", ln) for ln in lines), proc.stdout
    assert re.search(r"\b21 passed\b", lines[-1]), lines[-1]


def test_the_readme_says_how_long_the_suite_takes_and_what_it_shows():
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"The test command takes about \d+ minutes on an idle 2-core", readme)
    assert "prints a line per test file as it goes" in readme
