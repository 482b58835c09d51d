"""The suite's command (scripts/test.sh, run by .ci/run) shows its progress one line per test file."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from conftest import ROOT, time_limit

FILES = ["tests/test_hat_alias_served.py", "hat_ignite/registry.py"]


def pytest_arguments() -> list[str]:
    """The pytest options of scripts/test.sh's pytest line (what comes before its "$@"), its worker
    count computed by the script's own ``workers=`` line."""
    lines = (ROOT / "scripts" / "test.sh").read_text().splitlines()
    (line,) = [ln for ln in lines if " -m pytest " in ln]
    (count,) = [ln for ln in lines if ln.startswith("workers=")]
    workers = subprocess.run(["bash", "-c", f'{count}; echo "$workers"'], cwd=ROOT, capture_output=True,
                             text=True, check=True, timeout=time_limit(60)).stdout.strip()
    words = shlex.split(line.split(" -m pytest ", 1)[1], comments=True)
    return [workers if word == "$workers" else word for word in words[: words.index("$@")]]


def test_the_suite_command_prints_a_line_per_file():
    options = pytest_arguments()
    proc = subprocess.run([sys.executable, "-m", "pytest", *options, *FILES], cwd=ROOT,
                          capture_output=True, text=True, timeout=time_limit(300))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    progress = [ln for ln in lines if re.fullmatch(r"\[ *\d+% +\d+:\d\d\] \S+: .* \(\d+\.\d s\)", ln)]
    # before: "-q" alone printed one line of dots for the whole run. A file's line comes once all its
    # tests are done, in whichever order the files finish (several workers run them at once)
    by_file = {ln.split("] ", 1)[1].split(":")[0]: ln for ln in progress}
    assert sorted(by_file) == sorted(FILES) and len(progress) == len(FILES), proc.stdout
    assert ": 16 passed (" in by_file[FILES[0]] and ": 4 passed (" in by_file[FILES[1]]
    shares = [int(ln[1:4]) for ln in progress]
    assert shares == sorted(shares) and progress[-1].startswith("[100%"), progress
    assert not any(re.fullmatch(r"\.+( *\[ *\d+%\])?", ln) for ln in lines), proc.stdout
    assert re.search(r"\b20 passed\b", lines[-1]), lines[-1]


def test_the_readme_says_how_long_the_suite_takes_and_what_it_shows():
    readme = (ROOT / "README.md").read_text()
    text = " ".join(readme.split())
    assert "The test command runs the test files in parallel, one pytest-xdist worker per core and one more" in text
    assert re.search(r"takes about \d+ minutes on an idle 2-core", text)
    assert "prints a line per test file as each file finishes" in text
