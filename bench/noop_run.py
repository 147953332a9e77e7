"""How long a `trainflow run` takes when nothing changed, against `dvc repro` (target: under 5 s, median of 5).

Builds a project from this checkout in a temp directory (digits, 2 epochs), runs the pipeline once, then times 5
no-op `trainflow run` and 5 no-op `dvc repro`, each as a fresh process as a user would type it, in local mode (no
Prefect server). Prints a table of the medians.

    .venv/bin/python bench/noop_run.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FILES = ("dvc.yaml", "params.yaml", ".dvcignore", ".dvc/config", ".dvc/.gitignore", "data/raw", "trainflow")
TARGET_S = 5.0


def project(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for rel in FILES:
        src = ROOT / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@trainflow.invalid"]
    subprocess.run([*git, "init", "-q"], cwd=dest, check=True)
    subprocess.run([*git, "add", "-A"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-qm", "bench"], cwd=dest, check=True)
    return dest


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--record", action="store_true", help="write the headline to bench/results/ (bench/record.py)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = project(Path(tmp) / "proj")
        env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
        env |= {"PREFECT_HOME": str(Path(tmp) / "prefect"), "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}"}
        trainflow = [str(BIN / "trainflow"), "run"]
        first = timed([*trainflow, "-S", "train.epochs=2", "-S", "train.progress=false"], root, env)
        print(f"first run (everything, digits, 2 epochs): {first:.1f} s", file=sys.stderr)
        runs = {
            "trainflow run": [timed(trainflow, root, env) for _ in range(args.repeats)],
            "dvc repro": [timed([str(BIN / "dvc"), "repro"], root, env) for _ in range(args.repeats)],
        }
    print("| no-op command | median (s) | min (s) | max (s) | runs | target |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, times in runs.items():
        target = f"< {TARGET_S:g} s" if name == "trainflow run" else ""
        cells = [f"{statistics.median(times):.2f}", f"{min(times):.2f}", f"{max(times):.2f}", str(len(times)), target]
        print(f"| `{name}` | " + " | ".join(cells) + " |")
    ratio = statistics.median(runs["trainflow run"]) / statistics.median(runs["dvc repro"])
    print(f"\ntrainflow run / dvc repro (medians): {ratio:.2f}")
    if args.record:
        from record import command_line, record

        ours, dvc = statistics.median(runs["trainflow run"]), statistics.median(runs["dvc repro"])
        record(
            "noop-run",
            what="A `trainflow run` with nothing to do",
            command=command_line(),
            headline=f"median {ours:.2f} s (`dvc repro` {dvc:.2f} s), {args.repeats} runs each",
            target=f"< {TARGET_S:g} s",
            met="yes" if ours < TARGET_S else "no",
        )


if __name__ == "__main__":
    main()
