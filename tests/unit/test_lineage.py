"""Lineage: a run is dirty when tracked files differ from the commit, but not because `dvc repro` rewrote dvc.lock."""

from __future__ import annotations

import subprocess
from pathlib import Path

from trainflow.lineage import git_commit


def test_dirty_ignores_dvc_lock_but_not_code(tmp_path: Path) -> None:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for name in ("dvc.lock", "params.yaml"):
        (tmp_path / name).write_text("a\n")
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", "-A"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=tmp_path, check=True)
    commit, dirty = git_commit(tmp_path)
    assert len(commit) == 40 and not dirty
    (tmp_path / "dvc.lock").write_text("rewritten by dvc repro\n")
    assert git_commit(tmp_path) == (commit, False)
    (tmp_path / "params.yaml").write_text("b\n")
    assert git_commit(tmp_path) == (commit, True)


def test_outside_git(tmp_path: Path) -> None:
    assert git_commit(tmp_path) == ("unknown", False)
