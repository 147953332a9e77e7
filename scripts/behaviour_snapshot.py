"""What a restructuring must leave exactly as it was, in one folder so that two snapshots compare with `diff -r`:
the collected test ids, every `trainflow` command's --help, `trainflow params schema`, and what `dvc repro` makes in
a copy of the working tree (reports/*.json, plots excepted, and the bytes of models/final). A move that changes none
of these changed no behaviour a user or a registered model can see; the test ids say no test was lost on the way.

Usage: .venv/bin/python scripts/behaviour_snapshot.py OUT_DIR [--no-repro]
Then: diff -r BEFORE AFTER (run both on one machine: training is bit for bit the same on one machine and build).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path of the parser (`models list`, `stage`, ...), itself first."""
    found = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += commands(sub, (*prefix, name))
    return found


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"snapshot: {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return done.stdout


def helps(out: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from trainflow.cli import build_parser

    text = []
    for path in commands(build_parser()):
        shown = run([PYTHON, "-m", "trainflow", *path, "--help"], ROOT, {**os.environ, "COLUMNS": "120"})
        text.append(f"$ trainflow {' '.join(path)} --help\n{shown}")
    (out / "help.txt").write_text("\n".join(text))
    (out / "params-schema.json").write_text(run([PYTHON, "-m", "trainflow", "params", "schema"], ROOT))


def test_ids(out: Path) -> None:
    listed = run([PYTHON, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly"], ROOT)
    ids = sorted(line for line in listed.splitlines() if "::" in line)
    (out / "test-ids.txt").write_text("\n".join(ids) + "\n")


def repro(out: Path) -> None:
    """`dvc repro` of the working tree's pipeline in a copy (git's tracked and untracked files, no outputs), with its
    own MLflow store and Prefect home."""
    with tempfile.TemporaryDirectory(prefix="snapshot-") as tmp:
        copy = Path(tmp) / "repo"
        listed = run(["git", "ls-files", "-co", "--exclude-standard"], ROOT).splitlines()
        for name in listed:
            if (ROOT / name).is_file():
                (copy / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, copy / name)
        run(["git", "init", "-q"], copy)
        run(["git", "add", "-A"], copy)
        run(["git", "-c", "user.name=s", "-c", "user.email=s@s", "commit", "-qm", "snapshot"], copy)
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{copy / 'mlflow.db'}", "PREFECT_HOME": f"{tmp}/prefect"}
        env["PATH"] = f"{Path(PYTHON).parent}{os.pathsep}{env['PATH']}"
        run([str(Path(PYTHON).parent / "dvc"), "repro", "-q"], copy, env)
        for report in sorted((copy / "reports").glob("*.json")):
            if report.name not in ("registration.json", "train_run.json"):  # run ids, paths, times: new each run
                shutil.copyfile(report, out / f"reports-{report.name}")
        digests = [
            f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.relative_to(copy)}"
            for f in sorted((copy / "models" / "final").rglob("*"))
            if f.is_file()
        ]
        (out / "models-final.sha256").write_text("\n".join(digests) + "\n")


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("out", type=Path)
    cli.add_argument("--no-repro", action="store_true", help="skip the pipeline run (minutes)")
    args = cli.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    helps(args.out)
    test_ids(args.out)
    if not args.no_repro:
        repro(args.out)
    print(f"snapshot: {args.out}")


if __name__ == "__main__":
    main()
