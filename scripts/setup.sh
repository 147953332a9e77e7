#!/usr/bin/env bash
# Create .venv (if missing) and install trainflow into it. Usage: bash scripts/setup.sh [--dev]
#
# PyTorch is chosen here, before the package, so that pip never pulls a build you did not want:
#   - TORCH_SPEC set (e.g. "torch==2.5.1"): install exactly that, with TORCH_INDEX_URL as the index if set;
#   - an NVIDIA GPU visible (nvidia-smi): the default CUDA build from the package index;
#   - otherwise a CPU build: torch==2.13.0 from a local wheel directory if pip has one (find-links, seconds),
#     else from TORCH_INDEX_URL (default: PyTorch's CPU wheel index), else the default build.
# An already installed torch is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[ "${1:-}" = "--dev" ] && extras="[dev]"
python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
# pip install, minus warnings about file:// index locations in a machine's pip config (noise); keeps pip's exit code.
pip_install() { .venv/bin/python -m pip install --disable-pip-version-check -q "$@" 2> >(grep -v "^WARNING: Location" >&2); }
index=()
[ -n "${TORCH_INDEX_URL:-}" ] && index=(--index-url "$TORCH_INDEX_URL")

# torch and its dependencies go in without bytecode, compiled next on every core (pip compiles one file at a time,
# most of torch's install).
torch_install() { pip_install --no-compile "$@"; }
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if [ -n "${TORCH_SPEC:-}" ]; then
    torch_install "${index[@]}" "$TORCH_SPEC"
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "setup: NVIDIA GPU found, installing the CUDA build of torch"
    torch_install torch
  else
    echo "setup: no GPU found, installing a CPU build of torch"
    # A local CPU wheel first (--no-deps: its dependencies come from the package index next), then the index given,
    # then PyTorch's own CPU index; plain `torch` from PyPI would be the multi-GB CUDA build.
    if torch_install --no-index --no-deps torch==2.13.0 2>/dev/null; then
      torch_install torch==2.13.0
    else
      torch_install --index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}" torch \
        || torch_install torch
    fi
  fi
  .venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    >/dev/null 2>&1 || true  # a file that does not compile stays as it was, as pip leaves it
fi
# Editable, so dvc.yaml's `trainflow stage ...` runs the code in this checkout. The torch just chosen stays: the
# installer may not swap it for another build to satisfy a dependency (a newer torch from PyPI would be the CUDA one).
torch_version=$(.venv/bin/python -W ignore -c "import torch; print(torch.__version__.split('+')[0])")
# With uv, when it installs: pip spends minutes on trainflow's ~240 packages (its resolver over the index pages, then
# bytecode one file at a time), uv a fraction of that, bytecode compiled too (every process would compile what it
# imports otherwise). uv reads no pip.conf: where it cannot install (a mirror only pip is told of), pip does.
if pip_install uv && .venv/bin/python -m uv pip install --python .venv/bin/python --quiet --compile-bytecode \
  -e ".${extras}" -c <(echo "torch==${torch_version}"); then
  :
else
  echo "setup: installing with pip"
  pip_install -e ".${extras}" -c <(echo "torch==${torch_version}")
fi
.venv/bin/python -c "import trainflow, torch; print(f'setup: trainflow {trainflow.__version__}, torch {torch.__version__} ready in .venv')"
