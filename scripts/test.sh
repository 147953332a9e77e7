#!/usr/bin/env bash
# Lint, type-check and run the test suite from .venv (created by scripts/setup.sh --dev).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
ruff check .
ruff format --check .
mypy
python -m pytest -q "$@"
