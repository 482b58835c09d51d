#!/usr/bin/env bash
# Set up .venv (scripts/setup.sh), run the whole test suite, then type-check hat_ignite with mypy
# (settings in pyproject.toml's [tool.mypy]). Fails when either fails; mypy runs even when pytest fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
rc=0
.venv/bin/python -m pytest -q --file-progress "$@" || rc=$?  # a line per test file (conftest.py)
.venv/bin/python -m mypy hat_ignite || rc=$((rc ? rc : 1))
exit "$rc"
