#!/usr/bin/env bash
# Set up .venv (scripts/setup.sh), run the whole test suite, then type-check hat_ignite with mypy
# (settings in pyproject.toml's [tool.mypy]). Fails when either fails; mypy runs even when pytest fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
rc=0
# -n: one pytest-xdist worker per core and one more, each given its share of the cores
# (conftest.py): many tests wait on the processes they start (a signal's effect, a hung loader's
# report, a rank's handshake), and the extra worker runs another file meanwhile (with one worker
# per core the cores were idle 7 % of the run, with one more 0.5 %);
# --dist loadfile: a file's tests run in one worker, so a module's fixtures are made once; the files
# go to the workers in collection order, the longest first (conftest.py), so they end together
# (--no-loadscope-reorder); a line per test file as each file finishes (conftest.py)
workers=$(($(.venv/bin/python -c 'import os; print(os.cpu_count() or 1)') + 1))
.venv/bin/python -m pytest -q --file-progress -n "$workers" --dist loadfile --no-loadscope-reorder "$@" || rc=$?
.venv/bin/python -m mypy hat_ignite || rc=$((rc ? rc : 1))
exit "$rc"
