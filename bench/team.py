"""What real team servers cost: a `trainflow run` with the embedded defaults vs the team's servers, and the registry's
champion decisions per second with one writer and with four at once.

Starts what the slow tier's team tests start (tests/support/team.py): PostgreSQL, an S3-compatible server (moto), an
MLflow server on Postgres with proxied S3 artifacts, and the DVC remote on the same bucket. Then, in one sitting:

- `trainflow run` of one project (iris, 4 epochs), each repeat with a new top-level seed (so every stage reruns),
  alternating: embedded defaults (SQLite MLflow in the project, local DVC remote) vs the servers (MLFLOW_TRACKING_URI
  on the server, `dvc push` to S3). Medians of --repeats.
- registry decisions: --decisions registrations through trainflow.registry.register (a stand-in model, the point
  rule) by one process, then by four at once (spawned processes), against the server; decisions per second of wall
  time. The four take turns under the registry's lock, so they are not four times faster: the ratio says what the
  lock and the server cost when a team registers at once.

    .venv/bin/python bench/team.py [--repeats 3] [--decisions 24] [--record]

Needs the `team` extra (`.venv/bin/pip install -e '.[team]'`) and PostgreSQL's server binaries (Debian: postgresql).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "tests"))

from support import promoter  # noqa: E402  (tests/support/promoter.py: one registration, in a process of its own)
from support.projects import FAST, make_project  # noqa: E402
from support.team import mlflow_server, postgres, s3_server  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from noop_run import timed  # noqa: E402  (a command's wall time; its output when it fails)


def decisions_per_s(server: str, writers: int, n: int) -> float:
    """`n` registrations of one model by `writers` processes at once (no injected delays); decisions per second."""
    from mlflow.tracking import MlflowClient

    os.environ["MLFLOW_TRACKING_URI"] = server
    if MlflowClient(server).get_experiment_by_name(promoter.EXPERIMENT) is None:
        MlflowClient(server).create_experiment(promoter.EXPERIMENT)
    context = multiprocessing.get_context("spawn")
    name = f"bench-{writers}-writers"
    with context.Pool(writers, initializer=promoter.start, initargs=(0, False, 0.0)) as pool:
        pool.starmap(promoter.register, [(f"warm-{writers}-{w}", 0.5) for w in range(writers)])  # imports, experiment
        start = time.perf_counter()
        pool.starmap(promoter.register, [(name, 0.5 + i / (2 * n)) for i in range(n)], chunksize=1)
        return n / (time.perf_counter() - start)


def run_times(tmp: Path, s3: Any, server: str, repeats: int) -> dict[str, list[float]]:
    """`trainflow run` times in two projects, alternating: embedded defaults, and the team's servers."""
    params = {"data.source": "builtin:iris", "register.model_name": "iris", **FAST}
    local, team = make_project(tmp / "local", params), make_project(tmp / "team", params)
    base = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    base |= {"PATH": f"{BIN}{os.pathsep}{base.get('PATH', '')}", "PREFECT_HOME": str(tmp / "prefect")}
    dvc = str(BIN / "dvc")
    remote = ["remote", "add", "-f", "-d", "team", f"s3://{s3.bucket}/dvc"]
    subprocess.run([dvc, *remote], cwd=team, check=True, capture_output=True)
    subprocess.run([dvc, "remote", "modify", "team", "endpointurl", s3.endpoint], cwd=team, check=True)
    envs = {
        "embedded defaults": (local, base),
        "team servers": (team, {**base, **s3.env, "MLFLOW_TRACKING_URI": server}),
    }
    runs: dict[str, list[float]] = {k: [] for k in envs}
    for r in range(repeats + 1):  # the first of each is a warm-up (first imports, the server's first queries)
        for what, (root, env) in envs.items():
            elapsed = timed([str(BIN / "trainflow"), "run", "-S", f"seed={r + 1}"], root, env)
            if r:
                runs[what].append(elapsed)
            print(f"{what}: run {r} {elapsed:.1f} s", file=sys.stderr)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--decisions", type=int, default=24)
    parser.add_argument("--record", action="store_true", help="write the headline to bench/results/ (bench/record.py)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainflow-bench-team-") as name:
        tmp = Path(name)
        with postgres(tmp / "pg") as pg, s3_server(tmp / "s3") as s3:
            artifacts = f"s3://{s3.bucket}/mlartifacts"
            with mlflow_server(tmp / "mlflow", pg.create_database("mlflow"), artifacts, env=s3.env) as server:
                runs = run_times(tmp, s3, server.url, args.repeats)
                rates = {w: decisions_per_s(server.url, w, args.decisions) for w in (1, 4)}
    embedded, served = (statistics.median(times) for times in runs.values())
    print("| `trainflow run` (iris, 4 epochs, every stage) | median (s) | min (s) | max (s) | runs |")
    print("|---|---:|---:|---:|---:|")
    for what, times in runs.items():
        print(f"| {what} | {statistics.median(times):.1f} | {min(times):.1f} | {max(times):.1f} | {len(times)} |")
    print(f"\nteam servers / embedded defaults (medians): {served / embedded:.2f}\n")
    print("| registry decisions (one model, point rule) | decisions/s |")
    print("|---|---:|")
    for writers, rate in rates.items():
        print(f"| {writers} writer{'s' if writers > 1 else ''} at once | {rate:.2f} |")
    print(f"\nfour writers / one writer: {rates[4] / rates[1]:.2f}")
    if args.record:
        from record import command_line, record

        record(
            "team",
            what="A team's servers (Postgres MLflow, S3 artifacts and DVC remote) vs the embedded defaults",
            command=command_line(),
            headline=f"`trainflow run` {served:.1f} s vs {embedded:.1f} s ({served / embedded:.2f}x); "
            f"{rates[4]:.2f} decisions/s with 4 writers ({rates[1]:.2f} with 1)",
            target="reported",
            met="n/a",
        )


if __name__ == "__main__":
    main()
