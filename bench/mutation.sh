#!/usr/bin/env bash
# Mutation testing of the core (trainflow/engine/, data/split.py, stages/evaluate.py, registry.py) with mutmut: every
# small change to the code (a flipped sign, a dropped argument, an off-by-one) is applied one at a time and the tests
# that reach it are run; a mutant the tests still pass on is a guarantee nothing checks. Prints the kill rate per file
# and the survivors not judged equivalent (bench/mutation_equivalent.txt lists those, with the reason).
# Hours on 2 cores; not part of the test run. Usage: bash bench/mutation.sh [mutmut run arguments]
set -euo pipefail
VENV="${VENV:-.venv}"  # a worktree can use another checkout's: VENV=../main/.venv
cd "$(dirname "$0")/.."
[ -x "$VENV/bin/mutmut" ] || "$VENV/bin/python" -m pip install -q "mutmut>=3.8,<4"
export OMP_NUM_THREADS=1        # torch's thread pool is not fork-safe; mutmut forks a worker per mutant
export HYPOTHESIS_PROFILE=mutation  # the same property-test examples every run (tests/conftest.py)
rm -rf mutants
log="${TMPDIR:-/tmp}/trainflow-mutmut.log"
if ! "$VENV/bin/mutmut" run --max-children "${MUTMUT_CHILDREN:-2}" "$@" >"$log" 2>&1; then
  echo "mutmut failed (a selected test fails on the unmutated code?); the end of $log:"
  tr '\r' '\n' <"$log" | grep -v '^[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏]' | tail -20
  exit 1
fi
"$VENV/bin/python" bench/mutation_report.py
