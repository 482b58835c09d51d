#!/usr/bin/env bash
# Create .venv with hat-ignite and the extras named as arguments (scripts/train_digits.sh: demo,
# scripts/test.sh: test); safe to run again (it only installs what changed or was not there yet).
#
# torch: a torch the Python already has (for example a CUDA build) is kept: the venv then sees the
# system site-packages. With no torch, torch==2.13.0 is installed (a CPU wheel where one lies on
# the machine's pip find-links), never a bare `torch` that would pull a multi-GB CUDA build.
#
# The installer: uv (from the package index, into .venv) where the venv holds every package itself:
# it fetches, unpacks and compiles in parallel, a fresh venv in about half pip's time. It is given
# pip's find-links, index URLs and constraint files. A venv that sees the system site-packages is
# left to pip: uv does not look there, and would install a second torch over the user's. Should uv
# not install, or fail, pip does the same install.
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
wanted=""
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
    wanted="torch==2.13.0"
fi
# The stamp holds the hash of pyproject.toml and the extras installed with it: a second command
# asking for other extras installs them too, keeping the first command's.
stamp=.venv/.hat-ignite-installed
want=$(sha256sum < pyproject.toml | cut -d' ' -f1)
[ -f "$stamp" ] && read -r have_hash have_extras < "$stamp" || true
extras=$(printf '%s\n' $([ "${have_hash:-}" = "$want" ] && echo "${have_extras:-}" | tr ',' ' ') "$@" | sort -u | paste -sd, -)
project=""
if [ "${have_hash:-}" != "$want" ] || [ "${have_extras:-}" != "$extras" ]; then
    project=".${extras:+[$extras]}"
fi

# pip's settings as uv options: find-links, index URLs (a local index that does not exist left
# out, as pip ignores it) and constraint files.
uv_options() {
    .venv/bin/python -m pip config list 2>/dev/null | .venv/bin/python -c '
import os, re, sys
option = {"find-links": "--find-links", "index-url": "--index-url", "extra-index-url": "--extra-index-url",
          "constraint": "--constraint"}
for line in sys.stdin:
    match = re.match(r"[^.]*\.([a-z-]+)=(.*)$", line.strip())
    if not match or match.group(1) not in option:
        continue
    for value in match.group(2).strip("\x27\"").split():
        local = value[len("file://"):] if value.startswith("file://") else value if "://" not in value else None
        if local is None or os.path.exists(local):
            print(option[match.group(1)], value)
' | sort -u
}

install_with_uv() {
    grep -qi "^include-system-site-packages *= *false" .venv/pyvenv.cfg || return 1
    [ -x .venv/bin/uv ] || .venv/bin/python -m pip install --quiet uv >/dev/null 2>&1 || return 1
    # --index-strategy unsafe-best-match: the newest version any index has, as pip chooses (uv's
    # default takes every version from the first index that has the package, often an older one).
    # shellcheck disable=SC2046,SC2086  # options and values, none with a space
    .venv/bin/uv pip install --quiet --python .venv/bin/python --compile-bytecode \
        --index-strategy unsafe-best-match $(uv_options) \
        $wanted ${project:+-e "$project"}
}

if [ -n "$wanted$project" ]; then
    if ! install_with_uv; then
        if [ -x .venv/bin/uv ]; then
            echo "setup: uv did not install; installing with pip"
        fi
        if [ -n "$wanted" ]; then
            .venv/bin/python -m pip install --quiet "$wanted"
        fi
        if [ -n "$project" ]; then
            .venv/bin/python -m pip install --quiet -e "$project"
        fi
    fi
    if [ -n "$project" ]; then
        echo "$want $extras" > "$stamp"
    fi
fi
# The project's own modules compiled once, here: the installers compile what they install, but
# hat-ignite is installed editable, and where PYTHONDONTWRITEBYTECODE is set (as on CI machines)
# every process would otherwise compile each module it imports anew (about 70 ms of each command's
# start-up; the test suite starts hundreds). Files already compiled are skipped.
.venv/bin/python -m compileall -q hat_ignite tests configs >/dev/null
