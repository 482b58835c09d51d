#!/usr/bin/env bash
# Create .venv with hat-ignite and the extras named as arguments (scripts/train_digits.sh: demo,
# scripts/test.sh: test); safe to run again (it only installs what changed or was not there yet).
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
# The stamp holds the hash of pyproject.toml and the extras installed with it: a second command
# asking for other extras installs them too, keeping the first command's.
stamp=.venv/.hat-ignite-installed
want=$(sha256sum < pyproject.toml | cut -d' ' -f1)
[ -f "$stamp" ] && read -r have_hash have_extras < "$stamp" || true
extras=$(printf '%s\n' $([ "${have_hash:-}" = "$want" ] && echo "${have_extras:-}" | tr ',' ' ') "$@" | sort -u | paste -sd, -)
if [ "${have_hash:-}" != "$want" ] || [ "${have_extras:-}" != "$extras" ]; then
    .venv/bin/python -m pip install --quiet -e ".${extras:+[$extras]}"
    echo "$want $extras" > "$stamp"
fi
# The project's own modules compiled once, here: pip compiles what it installs, but hat-ignite is
# installed editable, and where PYTHONDONTWRITEBYTECODE is set (as on CI machines) every process
# would otherwise compile each module it imports anew (about 70 ms of each command's start-up; the
# test suite starts hundreds). Files already compiled are skipped.
.venv/bin/python -m compileall -q hat_ignite tests configs >/dev/null
