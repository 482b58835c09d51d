#!/usr/bin/env bash
# Create .venv with everything hat-ignite needs; safe to run again (it only installs what changed).
#
# torch: a torch the Python already has (for example a CUDA build) is kept: the venv then sees the
# system site-packages. With no torch, torch==2.13.0 is installed (a CPU wheel where one lies on
# the machine's pip find-links), never a bare `torch` that would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    if "$PY" -c "import torch" >/dev/null 2>&1; then
        echo "setup: reusing the torch of $PY ($("$PY" -c 'import torch; print(torch.__version__)'))"
        "$PY" -m venv --system-site-packages .venv
    else
        "$PY" -m venv .venv
    fi
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
    .venv/bin/python -m pip install --quiet "torch==2.13.0"
fi
stamp=.venv/.hat-ignite-installed
want=$(cat pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    .venv/bin/python -m pip install --quiet -e ".[test]"
    echo "$want" > "$stamp"
fi
