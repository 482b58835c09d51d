#!/usr/bin/env bash
# Set up .venv (scripts/setup.sh) and run the main job: train the shipped digits config.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
exec .venv/bin/python bin/hat-train configs/classification/digits_mlp.py "$@"
