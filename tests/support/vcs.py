"""Helpers for tests that drive git and the DVC command line in a temp project, as a person or CI would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

# The dvc of the interpreter running the tests, not whatever else is on PATH.
DVC = str(Path(sys.executable).parent / "dvc")

# Commits need an identity; set through the environment so no git config (global or repo) is touched.
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "trainflow-tests",
    "GIT_AUTHOR_EMAIL": "tests@trainflow.invalid",
    "GIT_COMMITTER_NAME": "trainflow-tests",
    "GIT_COMMITTER_EMAIL": "tests@trainflow.invalid",
}


def dvc(root: Path, *args: str) -> str:
    """Run `dvc ARGS` in `root`; fail the test with DVC's own output if it fails. Returns stdout + stderr."""
    # DVC cuts its tables to the terminal's width (80 columns without one): a long tmp path (pytest-xdist adds
    # popen-gw0/) came out cut in two. Wide enough for any path here.
    env = {**os.environ, "COLUMNS": "4096"}
    proc = subprocess.run([DVC, *args], cwd=root, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, f"dvc {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}"
    return proc.stdout + proc.stderr


def git(root: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, env={**os.environ, **GIT_IDENTITY})
    assert proc.returncode == 0, f"git {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}"
    return proc.stdout


def locked_outs(root: Path) -> dict[str, str]:
    """Every output dvc.lock records, path → md5 (a directory's ends in .dir)."""
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    return {out["path"]: out["md5"] for stage in lock["stages"].values() for out in stage.get("outs", [])}


def snapshot(root: Path, rels: list[str]) -> dict[str, bytes]:
    """The bytes of every file at or under each of `rels`, keyed by path relative to `root`."""
    files: dict[str, bytes] = {}
    for rel in rels:
        top = root / rel
        for path in [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file()):
            files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files


def mtimes(root: Path, rels: list[str]) -> dict[str, int]:
    return {rel: (root / rel).stat().st_mtime_ns for rel in snapshot(root, rels)}


def git_stdout(root: Path, *args: str) -> str:
    """`git ARGS` in `root` as it is configured (no identity set here): its stdout, stripped; raises if it fails."""
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()
