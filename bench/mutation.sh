#!/usr/bin/env bash
# Mutation testing of trainflow/ with mutmut: every small change to the code (a flipped sign, a dropped argument, an
# off-by-one) is applied one at a time and the tests that reach it are run; a mutant the tests still pass on is a
# guarantee nothing checks. Prints the kill rate per file and the survivors not judged equivalent
# (bench/mutation_equivalent.txt lists those, with the reason). Not part of the test run.
#
#   bash bench/mutation.sh                  # every mutant: many hours on 2 cores
#   SAMPLE=200 SEED=0 bash bench/mutation.sh  # a uniform random sample of 200 mutants (the kill rate of the package
#                                             # within a few points; mutmut_sample.txt keeps the names drawn)
#
# A sample is drawn after mutmut has made every mutant and timed the tests, so it is uniform over the whole package,
# not mutmut's fastest-first order (which a full run stopped early would give).
set -euo pipefail
VENV="${VENV:-.venv}"  # a worktree can use another checkout's: VENV=../main/.venv
cd "$(dirname "$0")/.."
[ -x "$VENV/bin/mutmut" ] || "$VENV/bin/python" -m pip install -q "mutmut>=3.8,<4"
export OMP_NUM_THREADS=1        # torch's thread pool is not fork-safe; mutmut forks a worker per mutant
export HYPOTHESIS_PROFILE=mutation  # the same property-test examples every run (tests/conftest.py)
rm -rf mutants
log="${TMPDIR:-/tmp}/trainflow-mutmut.log"
# Each mutant's tests run in a forked child that ends without pytest's exit hooks, so its temp directory keeps a lock
# that pytest trusts for 3 days and never removes: a sample once filled 28 GB of disk. The mutants' temp directories
# go into one folder of their own, a sweeper removes those untouched for an hour (no mutant's tests run that long),
# and the folder goes when the run ends.
export TMPDIR="$(mktemp -d "${TMPDIR:-/tmp}/trainflow-mutmut.XXXXXX")"
( while sleep 300; do find "$TMPDIR" -mindepth 2 -maxdepth 2 -path "*/pytest-of-*/pytest-*" -mmin +60 \
    -exec rm -rf {} + 2>/dev/null; done ) &
sweeper=$!
trap 'kill $sweeper 2>/dev/null; rm -rf "$TMPDIR"' EXIT
children="${MUTMUT_CHILDREN:-2}"
fail() {
  echo "mutmut failed (a selected test fails on the unmutated code?); the end of $log:"
  tr '\r' '\n' <"$log" | grep -v '^[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏]' | tail -20
  exit 1
}
if [ -n "${SAMPLE:-}" ]; then
  # Make the mutants and the test statistics only: a name that matches nothing stops mutmut right after them.
  "$VENV/bin/mutmut" run --max-children "$children" "no-such-mutant-*" >"$log" 2>&1 || true
  grep -q "nothing matches" "$log" || fail
  "$VENV/bin/python" - "$SAMPLE" "${SEED:-0}" >mutmut_sample.txt <<'EOF'
import json, random, sys
from pathlib import Path
names = sorted(n for meta in Path("mutants").rglob("*.py.meta") for n in json.loads(meta.read_text())["exit_code_by_key"])
print("\n".join(sorted(random.Random(int(sys.argv[2])).sample(names, min(int(sys.argv[1]), len(names))))))
EOF
  echo "sample: $(wc -l <mutmut_sample.txt) mutants drawn (seed ${SEED:-0}) into mutmut_sample.txt"
  # mutmut would run the sample fastest tests first, so a run stopped early would leave out exactly the mutants with the
  # slowest tests; this runs the same tests per mutant in a shuffled order (a stopped run resumes where it was).
  "$VENV/bin/python" bench/mutation_sample.py --names mutmut_sample.txt --jobs "$children" --seed "${SEED:-0}"
else
  "$VENV/bin/mutmut" run --max-children "$children" "$@" >"$log" 2>&1 || fail
fi
"$VENV/bin/python" bench/mutation_report.py
