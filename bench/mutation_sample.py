#!/usr/bin/env python
"""Run a sample of mutmut's mutants in a random order, so that a run stopped early leaves a random part unrun.

`mutmut run` runs the mutants whose tests are fastest first: a sample it cannot finish leaves out exactly the mutants
with the slowest tests (the trainer's, the stages'), and the rate it reports is biased towards quick helpers. This runs
the same mutants with the same tests (those mutmut's stats name for the mutant's function, fastest first, stopping at
the first failure) but in an order shuffled by a seed, N at a time, and writes each result into mutmut's own
mutants/**/*.py.meta as it finishes, so `bench/mutation_report.py` prints the table, and a rerun resumes where the
last stopped.

  # once: make the mutants and the stats (a name that matches nothing stops mutmut right after them)
  .venv/bin/mutmut run "no-such-mutant-*"
  .venv/bin/python bench/mutation_sample.py --names sample.txt --jobs 2 --seed 0
  .venv/bin/python bench/mutation_report.py

--also TEST ...: tests run for every mutant after the ones mutmut's stats name (test files newer than the stats,
when mutmut cannot time them): a test that never calls the mutated function passes, so more tests change no verdict,
they only cost time.

A mutant no test reaches is recorded as mutmut records it (33, unreached); a timeout as mutmut's 36 (killed: the
tests noticed something never ends).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from threading import Lock

ROOT = Path(__file__).resolve().parents[1]
UNREACHED, TIMEOUT = 33, 36
lock = Lock()


def meta_of(mutants: Path, name: str) -> Path:
    """trainflow.data.split.x_row_keys__mutmut_1 -> mutants/trainflow/data/split.py.meta (or .../__init__.py.meta)."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        base = mutants.joinpath(*parts[:cut])
        for candidate in (base.with_suffix(".py.meta"), base / "__init__.py.meta"):
            if candidate.is_file():
                return candidate
    raise SystemExit(f"no mutmut results file for {name} under {mutants}")


def record(mutants: Path, name: str, code: int) -> None:
    with lock:
        meta = meta_of(mutants, name)
        data = json.loads(meta.read_text())
        data["exit_code_by_key"][name] = code
        tmp = meta.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=4))
        tmp.replace(meta)


def recorded(mutants: Path, name: str) -> int | None:
    codes = json.loads(meta_of(mutants, name).read_text())["exit_code_by_key"]
    if name not in codes:
        raise SystemExit(f"{name} is not one of mutmut's mutants in {mutants}")
    return codes[name]


def run_one(mutants: Path, name: str, tests: list[str], timeout: int) -> tuple[int, float]:
    if not tests:
        return UNREACHED, 0.0
    scratch = Path(tempfile.mkdtemp(prefix="mutant-"))  # each mutant's pytest temp dirs, removed after it
    env = dict(
        os.environ,
        MUTANT_UNDER_TEST=name,
        OMP_NUM_THREADS="1",
        HYPOTHESIS_PROFILE="mutation",
        PYTHONPATH="",
        TMPDIR=str(scratch),
    )
    start = time.monotonic()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
            cwd=mutants,
            env=env,
            capture_output=True,
            timeout=timeout,
        )
        code = p.returncode
    except subprocess.TimeoutExpired:
        code = TIMEOUT
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return code, time.monotonic() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--names", required=True, help="the sample: mutant names, one a line")
    ap.add_argument("--mutants", default=str(ROOT / "mutants"), help="mutmut's mutants/ folder")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="the order the mutants run in")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds one mutant's tests may take")
    ap.add_argument("--also", nargs="*", default=[], help="tests to run for every mutant, after mutmut's choice")
    a = ap.parse_args()
    mutants = Path(a.mutants).resolve()
    stats = json.loads((mutants / "mutmut-stats.json").read_text())
    by_function, duration = stats["tests_by_mangled_function_name"], stats["duration_by_test"]
    names = Path(a.names).read_text().split()
    random.Random(a.seed).shuffle(names)
    todo = [n for n in names if recorded(mutants, n) is None]
    print(f"{len(names)} mutants, {len(names) - len(todo)} already run; running {len(todo)}", flush=True)

    def tests_for(name: str) -> list[str]:
        chosen = sorted(by_function.get(name.rsplit("__mutmut_", 1)[0], []), key=lambda t: duration.get(t, 0.0))
        return chosen + [t for t in a.also if t not in chosen]

    counts = {"killed": 0, "survived": 0, "unreached": 0}
    with ThreadPoolExecutor(a.jobs) as pool:
        jobs = {pool.submit(run_one, mutants, n, tests_for(n), a.timeout): n for n in todo}
        for i, done in enumerate(as_completed(jobs), 1):
            name = jobs[done]
            code, seconds = done.result()
            record(mutants, name, code)
            verdict = "survived" if code == 0 else "unreached" if code == UNREACHED else "killed"
            counts[verdict] += 1
            print(f"[{i}/{len(todo)}] {verdict:9} {seconds:6.0f} s  {name}", flush=True)
    print(", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
