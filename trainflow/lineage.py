"""Lineage facts for a run: git commit, DVC's hash of the data, a hash of the params."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from trainflow.io import sha256_json


def git_commit(root: Path) -> tuple[str, bool]:
    """(commit, dirty): dirty if a tracked file differs from the commit. dvc.lock does not count: `dvc repro` rewrites
    it during the very run being registered. ("unknown", False) outside a git repository."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)dvc.lock"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return commit, bool(status.strip())
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False


def dvc_out_hash(root: Path, stage: str, out: str) -> str:
    """The md5 DVC recorded in dvc.lock for output `out` of `stage` ("unknown" if not recorded yet)."""
    lock = root / "dvc.lock"
    if not lock.is_file():
        return "unknown"
    data = yaml.safe_load(lock.read_text())
    stages = data.get("stages") if isinstance(data, dict) else None  # a lock being written, or hand-edited
    entry = stages.get(stage) if isinstance(stages, dict) else None
    for output in (entry.get("outs") if isinstance(entry, dict) else None) or []:
        if isinstance(output, dict) and output.get("path") == out:
            return str(output.get("md5", "unknown"))
    return "unknown"


def params_hash(params: dict[str, Any]) -> str:
    return sha256_json(params)[:16]
