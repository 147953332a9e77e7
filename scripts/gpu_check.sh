#!/usr/bin/env bash
# The GPU tier and the GPU figures (issue 25) in one command, on a machine with an NVIDIA GPU:
#
#   bash scripts/gpu_check.sh          # everything goes into reports/gpu/figures.md (OUT=<dir> to change the folder)
#
# Each step runs under `timeout` (6-10 minutes), so none runs over 10 minutes; the durations below are estimates for an
# H100, not yet measured (about 20 minutes in all, setup aside):
#   1. setup: scripts/setup.sh --dev, timed (it installs the CUDA build of torch when nvidia-smi sees a GPU). Skipped
#      when .venv already imports trainflow and pytest and its torch sees the GPU, because a machine without a
#      package index could not rerun it; GPU_CHECK_SETUP=1 runs it anyway;
#   2. pytest -q tests/gpu: the GPU tier, what the CPU tests simulate, on the GPU (~5 min);
#   3. bench/gpu_check.py --part precisions at BERT-base size (12 layers, d_model 768, 128-512 tokens): fp32, bf16 and
#      fp16 val accuracy, tokens/s, MFU and peak memory; 20 train_step calls under set_sync_debug_mode("error"); the
#      forced non-finite updates (~3 min);
#   4. bench/gpu_check.py --part raw at the same size: ours against a plain PyTorch loop in bf16, without and with
#      torch.compile: tokens/s, MFU, peak memory, the ratio ours/raw (~4 min);
#   5. bench/engine_overhead.py --device cuda: fit() against a plain loop and Lightning on a small MLP (~3 min; Lightning
#      from the bench extra, installed here when the package index answers, else ours and the loop alone);
#   6. bench/gpu_check.py --part speed --record at BERT-base size (issue 47): the MLP again with train.compile:
#      reduce-overhead (CUDA graphs) at batch 32/128/512, padded against packed text in bf16 compiled (tokens/s vs
#      the raw loop, MFU), fp8 against bf16 (needs the fp8 extra, torchao, installed here like the bench extra); it
#      writes benchmarks/gpu-speed.md and bench/results/gpu-speed.json (~8 min, one 10-minute call).
# A step that fails or runs out of time is recorded with its exit code, and the next one runs; the script exits 1 if
# any step failed. Without a GPU it stops at once: nothing to measure.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no CUDA GPU found (nvidia-smi sees none); nothing to measure. Run it on a machine with an NVIDIA GPU." >&2
  exit 1
fi

OUT="${OUT:-reports/gpu}"
mkdir -p "$OUT"
FIGURES="$OUT/figures.md"
PY=.venv/bin/python
export PYTHONUNBUFFERED=1
failed=()

# section TITLE FILE [LINES]: FILE (its last LINES lines, if given) in a fenced block under a heading of figures.md.
section() {
  {
    printf '\n## %s\n\n```\n' "$1"
    if [ -n "${3:-}" ]; then tail -n "$3" "$2"; else cat "$2"; fi
    printf '```\n'
  } >>"$FIGURES"
}

# step NAME SECONDS COMMAND...: run COMMAND under a time limit, stdout to $OUT/NAME.txt, stderr to $OUT/NAME.err;
# records NAME's exit code and seconds in STEP_RC and STEP_SECONDS.
step() {
  local name=$1 limit=$2 start
  shift 2
  echo "gpu_check: $name (at most ${limit} s) ..." >&2
  start=$(date +%s)
  timeout --kill-after=30 "$limit" "$@" >"$OUT/$name.txt" 2>"$OUT/$name.err"
  STEP_RC=$?
  STEP_SECONDS=$(($(date +%s) - start))
  if [ "$STEP_RC" -ne 0 ]; then
    failed+=("$name (exit $STEP_RC$([ "$STEP_RC" -eq 124 ] && echo ", timed out after ${limit} s"))")
  fi
  echo "gpu_check: $name: exit $STEP_RC in ${STEP_SECONDS} s" >&2
}

# report TITLE NAME [LINES]: the last step's output (NAME.txt, its last LINES lines if given) under TITLE, with the
# exit code and the seconds; after a failure, the last lines of its stderr too.
report() {
  section "$1: exit $STEP_RC in $STEP_SECONDS s" "$OUT/$2.txt" "${3:-}"
  if [ "$STEP_RC" -ne 0 ]; then section "$1: stderr (last lines)" "$OUT/$2.err" 30; fi
}

venv_ready() {
  "$PY" -c "import sys, pytest, torch, trainflow; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null
}

commit=$(git rev-parse --short HEAD 2>/dev/null || echo "?")
[ "$commit" != "?" ] && ! git diff --quiet HEAD 2>/dev/null && commit="$commit (with uncommitted changes)"
{
  echo "# GPU figures"
  echo
  echo "Written by \`bash scripts/gpu_check.sh\` on $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $commit."
} >"$FIGURES"
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
section "nvidia-smi" "$OUT/nvidia-smi.txt"

# 1. The environment.
if [ "${GPU_CHECK_SETUP:-0}" != 1 ] && venv_ready; then
  setup_note="skipped: .venv already imports trainflow and its torch sees the GPU (GPU_CHECK_SETUP=1 rebuilds it)"
  echo "gpu_check: $setup_note" >&2
else
  step setup 600 bash scripts/setup.sh --dev
  setup_note="bash scripts/setup.sh --dev: exit $STEP_RC in $STEP_SECONDS s"
  cat "$OUT/setup.err" >>"$OUT/setup.txt"
  section "Setup: exit $STEP_RC in $STEP_SECONDS s (last lines of its output)" "$OUT/setup.txt" 30
fi
if ! venv_ready; then
  why=$("$PY" -c 'import torch; print(f"torch {torch.__version__}, cuda available: {torch.cuda.is_available()}")' 2>&1 |
    tail -n 1)
  {
    printf '\n## Stopped\n\n- setup: %s\n- .venv cannot train on the GPU: %s\n' "$setup_note" "$why"
    echo "- setup.sh keeps a torch already in .venv, a CPU build too: remove .venv (or set TORCH_SPEC) and rerun."
  } >>"$FIGURES"
  echo "gpu_check: .venv cannot train on the GPU ($why); see $FIGURES" >&2
  exit 1
fi
"$PY" - >"$OUT/versions.txt" 2>&1 <<'EOF'
import platform, torch, trainflow
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN "
      f"{torch.backends.cudnn.version()}), trainflow {trainflow.__version__}")
print(f"GPU: {torch.cuda.get_device_name()}, {torch.cuda.get_device_properties(0).total_memory / 2**30:.1f} GiB, "
      f"compute capability {'.'.join(map(str, torch.cuda.get_device_capability()))}, {torch.cuda.device_count()} visible")
EOF
{
  printf '\n## Environment\n\n- setup: %s\n' "$setup_note"
  sed 's/^/- /' "$OUT/versions.txt"
} >>"$FIGURES"

# 2. The GPU tier.
step pytest 600 "$PY" -m pytest -q tests/gpu -p no:cacheprovider --durations=15
report "pytest -q tests/gpu (last lines)" pytest 80

# 3-4. The engine on a BERT-base-sized text transformer.
bert=(--layers 12 --d-model 768 --min-len 128 --max-len 512 --batch-size 64)
step gpu_check_precisions 420 "$PY" bench/gpu_check.py --part precisions "${bert[@]}" --n-train 10000 --epochs 1
report "bench/gpu_check.py --part precisions ${bert[*]} --n-train 10000 --epochs 1" gpu_check_precisions
step gpu_check_raw 540 "$PY" bench/gpu_check.py --part raw "${bert[@]}" --raw-steps 200
report "bench/gpu_check.py --part raw ${bert[*]} --raw-steps 200" gpu_check_raw

# 5. Engine overhead against a plain loop and Lightning (the bench extra).
if ! "$PY" -c "import lightning" 2>/dev/null; then
  torch_version=$("$PY" -W ignore -c "import torch; print(torch.__version__.split('+')[0])")
  step install_bench 300 "$PY" -m pip install --disable-pip-version-check -q -e ".[bench]" -c <(echo "torch==$torch_version")
fi
# Without Lightning (its install failed: $OUT/install_bench.err) ours and the plain loop still run; its columns say so.
step engine_overhead 360 "$PY" bench/engine_overhead.py --device cuda --repeats 5
report "bench/engine_overhead.py --device cuda --repeats 5" engine_overhead

# 6. Issue 47's figures: the captured step, packed text, fp8 (torchao: the fp8 extra).
if ! "$PY" -c "import torchao" 2>/dev/null; then
  torch_version=$("$PY" -W ignore -c "import torch; print(torch.__version__.split('+')[0])")
  step install_fp8 300 "$PY" -m pip install --disable-pip-version-check -q -e ".[fp8]" -c <(echo "torch==$torch_version")
fi
step gpu_check_speed 600 "$PY" bench/gpu_check.py --part speed --record "${bert[@]}" --raw-steps 120 --n-train 10000
report "bench/gpu_check.py --part speed --record ${bert[*]} --raw-steps 120 --n-train 10000" gpu_check_speed

{
  printf '\n## Result\n\n'
  if [ ${#failed[@]} -eq 0 ]; then echo "Every step passed."; else printf -- '- failed: %s\n' "${failed[@]}"; fi
} >>"$FIGURES"
echo "gpu_check: figures in $FIGURES" >&2
[ ${#failed[@]} -eq 0 ]
