"""Soak: N rounds (default 50) of a random param change and a random kill of `trainflow run`, each followed by a rerun
to completion and a check of every invariant (tests/reliability/chaos.py): DVC's record true (`dvc status` clean,
`dvc repro` a no-op), every output loadable and in agreement with the reports, checkpoints loadable, nothing
half-written left behind, the registry consistent (aliases, one version per run, the champion the best by the gate),
no run left "running" in Prefect or MLflow, and the DVC cache whole (`dvc push`, then a fresh clone's `dvc pull`
gives every output byte for byte).

    .venv/bin/python bench/soak.py [--rounds 50] [--seed 0]      # ~1 min a round on 2 cores

Prints one line per round as it goes, then a table of the rounds and one of the kill points, and every violation
with the round that found it. Exit code 1 if any invariant was violated.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "reliability"))
import chaos  # noqa: E402  (tests/reliability/chaos.py: the rounds and the invariants)
from support.projects import make_project  # noqa: E402  (a project holding this checkout's pipeline)
from support.servers import prefect_server  # noqa: E402  (tests/support/servers.py: a real `prefect server start`)


def table(rows: list[dict[str, object]]) -> str:
    columns = list(rows[0])
    widths = {c: max(len(str(c)), *(len(str(r[c])) for r in rows)) for c in columns}
    lines = ["| " + " | ".join(str(c).ljust(widths[c]) for c in columns) + " |"]
    lines.append("|" + "|".join("-" * (widths[c] + 2) for c in columns) + "|")
    lines += ["| " + " | ".join(str(r[c]).ljust(widths[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="trainflow-soak-") as tmp:
        base = Path(tmp)
        home = base / "prefect-home"
        home.mkdir()
        with prefect_server(home) as server:
            env = server.env({**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1"})
            ws = chaos.workspace(base, make_project, env)
            rounds = []
            for n in range(1, args.rounds + 1):
                r = chaos.play(ws, chaos.plan(n, rng, ws))
                rounds.append(r)
                row = r.row()
                print(f"round {n}/{args.rounds}: {row['change']}; kill {row['kill']}: "
                      f"{'killed in ' + str(row['killed in']) if r.killed else 'not killed (ended first)'}; "
                      f"rerun {row['rerun s']} s; {len(r.violations)} violation(s)", flush=True)  # fmt: skip
                for v in r.violations:
                    print(f"  VIOLATION: {v}", flush=True)
    minutes = (time.monotonic() - start) / 60
    print(f"\n## Soak: {len(rounds)} rounds, seed {args.seed}, {minutes:.1f} min\n")
    print(table([r.row() for r in rounds]))
    by_point: dict[str, list[chaos.Round]] = collections.defaultdict(list)
    for r in rounds:
        by_point[r.point].append(r)
    print("\n### Kill points\n")
    points = [
        {"kill point": p, "rounds": len(rs), "killed": sum(r.killed for r in rs),
         "violations": sum(len(r.violations) for r in rs)}
        for p, rs in sorted(by_point.items())
    ]  # fmt: skip
    print(table(points))
    stages = collections.Counter(r.killed_in for r in rounds if r.killed)
    print("\nKilled in: " + ", ".join(f"{s} {n}" for s, n in sorted(stages.items())))
    checks = len(chaos.INVARIANTS)
    violations = [(r.number, v) for r in rounds for v in r.violations]
    print(f"\nInvariants checked per round: {checks} ({', '.join(chaos.INVARIANTS)}); "
          f"{checks * len(rounds)} checks, {len(violations)} violation(s).")  # fmt: skip
    for number, v in violations:
        print(f"- round {number}: {v}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
