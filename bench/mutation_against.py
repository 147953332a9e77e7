#!/usr/bin/env python
"""Run mutants of trainflow against test files you name, one mutant at a time: the quick loop for writing tests that
kill them (bench/mutation.sh measures the package's kill rate; this helps raise it).

Needs the mutants that `mutmut run` makes under mutants/ (bench/mutation.sh makes them; `mutmut run "no-such-*"`
makes them and stops). Then, from the checkout whose tests you are writing:

  .venv/bin/python bench/mutation_against.py --sample 30 --seed 1 'trainflow.core.io.*' -- tests/core/test_io.py
  .venv/bin/python bench/mutation_against.py --names names.txt -- tests/registry/test_gate.py tests/core/test_io.py

Globs name mutants (module.function: 'trainflow.registry.card.x_markdown__mutmut_*'; methods
'trainflow.m.xǁClassǁname__*').
Each test file named is first copied from this checkout into the mutants' tests, so your edits are what runs. The
tests run once on the unmutated code (they must pass); then a mutant whose tests still pass has SURVIVED and its
diff is printed. --exclude FILE leaves out the mutants named there (a sample held out to measure on, blind).
--mutants DIR: the mutants of another worktree (made once, shared by several people writing tests).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

MAIN = Path(__file__).resolve().parents[1]
MUT = MAIN / "mutants"
PY = sys.executable


def names() -> list[str]:
    return sorted(
        n for meta in (MUT / "trainflow").rglob("*.py.meta") for n in json.loads(meta.read_text())["exit_code_by_key"]
    )


def run(name: str, tests: list[str], timeout: int) -> tuple[int, str]:
    env = dict(os.environ, MUTANT_UNDER_TEST=name, OMP_NUM_THREADS="1", HYPOTHESIS_PROFILE="mutation", PYTHONPATH="")
    try:
        p = subprocess.run(
            [PY, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
            cwd=MUT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return 124, "timeout"
    return p.returncode, (p.stdout + p.stderr).strip().splitlines()[-1] if (p.stdout + p.stderr).strip() else ""


def show(name: str) -> str:
    mutmut = str(Path(PY).with_name("mutmut"))
    p = subprocess.run([mutmut, "show", name], cwd=MUT.parent, capture_output=True, text=True)
    lines = p.stdout.splitlines()
    return "\n".join(x for x in lines if x.startswith(("-", "+")) and not x.startswith(("---", "+++")))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "patterns",
        nargs="*",
        help="mutant name globs, e.g. 'trainflow.registry.card.*' or 'trainflow.registry.card.x_markdown__*'",
    )
    ap.add_argument("--names", help="a file of mutant names, one a line")
    ap.add_argument("--sample", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--exclude", help="a file of mutant names to leave out")
    ap.add_argument("--mutants", help="the mutants/ folder to use (default: this checkout's)")
    a, rest = ap.parse_known_args()
    global MUT
    MUT = Path(a.mutants).resolve() if a.mutants else MUT
    if not (MUT / "trainflow").is_dir():
        sys.exit(f"no mutants in {MUT}: make them with `mutmut run 'no-such-mutant-*'` (or bench/mutation.sh)")
    argv = sys.argv[1:]
    if "--" not in argv:
        sys.exit("give the tests after --")
    tests = argv[argv.index("--") + 1 :]
    pats = [x for x in a.patterns if x not in tests]
    for t in tests:
        src = MAIN / t.split("::")[0]
        if src.is_file():
            dst = MUT / t.split("::")[0]
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    chosen = (
        Path(a.names).read_text().split()
        if a.names
        else [n for n in names() if any(fnmatch.fnmatch(n, p) for p in pats)]
    )
    held_out = set(Path(a.exclude).read_text().split()) if a.exclude else set()  # a blind sample: never shown
    chosen = [n for n in chosen if n not in held_out]
    if a.sample and len(chosen) > a.sample:
        chosen = sorted(random.Random(a.seed).sample(chosen, a.sample))
    rc, last = run("", tests, a.timeout)
    if rc != 0:
        sys.exit(f"the tests fail on the unmutated code: {last}")
    print(f"{len(chosen)} mutants; tests pass unmutated ({last})", flush=True)
    survived = []
    for i, n in enumerate(chosen, 1):
        rc, last = run(n, tests, a.timeout)
        verdict = "SURVIVED" if rc == 0 else ("timeout" if rc == 124 else "killed")
        print(f"[{i}/{len(chosen)}] {verdict:8} {n}", flush=True)
        if rc == 0:
            survived.append(n)
            print(show(n), flush=True)
    killed = len(chosen) - len(survived)
    print(f"\nkilled {killed} of {len(chosen)}; survived: {len(survived)}")
    for n in survived:
        print("  " + n)


if __name__ == "__main__":
    main()
