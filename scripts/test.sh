#!/usr/bin/env bash
# Set up .venv (scripts/setup.sh), run the whole test suite and, beside it, type-check hat_ignite
# with mypy (settings in pyproject.toml's [tool.mypy]); mypy's report follows pytest's. Fails when
# either fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
rc=0
# mypy's first run (no .mypy_cache yet, as in a fresh clone) keeps one core busy for about 10 s:
# beside the tests rather than after them
mypy_report=$(mktemp)
trap 'rm -f "$mypy_report"' EXIT
.venv/bin/python -m mypy hat_ignite > "$mypy_report" 2>&1 &
mypy_pid=$!
# -n: one pytest-xdist worker per core and one more, each given its share of the cores
# (conftest.py): many tests wait on the processes they start (a signal's effect, a hung loader's
# report, a rank's handshake), and the extra worker runs another file meanwhile (with one worker
# per core the cores were idle 7 % of the run, with one more 0.5 %);
# --dist loadfile: a file's tests run in one worker, so a module's fixtures are made once; the files
# go to the workers in collection order, the longest first (conftest.py), so they end together
# (--no-loadscope-reorder); a line per test file as each file finishes (conftest.py)
workers=$(($(.venv/bin/python -c 'import os; print(os.cpu_count() or 1)') + 1))
.venv/bin/python -m pytest -q --file-progress -n "$workers" --dist loadfile --no-loadscope-reorder "$@" || rc=$?
mypy_rc=0
wait "$mypy_pid" || mypy_rc=$?
cat "$mypy_report"
[ "$mypy_rc" = 0 ] || rc=$((rc ? rc : 1))
exit "$rc"
