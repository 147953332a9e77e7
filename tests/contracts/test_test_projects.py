"""Tests build their projects from the committed defaults, never from the working copy that a user's own-data runs
change (issue 30: after a few runs from the README's "Your data", 39 tests failed and 25 errored, because every test
project copied the user's params.yaml and data/raw)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from support.projects import REPO, committed, make_project


def git(root: Path, *args: str) -> None:
    identity = ["-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", *identity, *args], cwd=root, check=True, capture_output=True)


def test_committed_gives_the_last_commits_files_not_the_working_copys(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "data/raw").mkdir(parents=True)
    (root / "params.yaml").write_text("seed: 1\n")
    (root / "data/raw/README.md").write_text("put data here\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "defaults")
    # What following "Your data" does to a checkout: -S overrides written, a data file added, the README edited.
    (root / "params.yaml").write_text("seed: 99\ndata:\n  source: data/raw/mine.csv\n")
    (root / "data/raw/mine.csv").write_text("a,b\n1,2\n")
    (root / "data/raw/README.md").write_text("my notes\n")
    assert committed("params.yaml", root) == {"params.yaml": b"seed: 1\n"}
    assert committed("data/raw", root) == {"data/raw/README.md": b"put data here\n"}
    # Not a git checkout of its own (mutmut's copy lives inside this repo): the files on disk.
    copy = root / "mutants"
    (copy / "data/raw").mkdir(parents=True)
    (copy / "params.yaml").write_text("seed: 5\n")
    (copy / "data/raw/x.csv").write_text("x\n")
    assert committed("params.yaml", copy) == {"params.yaml": b"seed: 5\n"}
    assert committed("data/raw", copy) == {"data/raw/x.csv": b"x\n"}


def test_a_test_project_holds_the_committed_params_and_no_data(tmp_path: Path) -> None:
    head = subprocess.run(["git", "show", "HEAD:params.yaml"], cwd=REPO, capture_output=True, check=True).stdout
    root = make_project(tmp_path / "p")
    assert (root / "params.yaml").read_bytes() == head
    tracked = subprocess.run(["git", "ls-files", "data/raw"], cwd=REPO, capture_output=True, text=True).stdout.split()
    assert sorted(p.relative_to(root).as_posix() for p in (root / "data/raw").iterdir()) == sorted(tracked)
    config = subprocess.run(["git", "show", "HEAD:.dvc/config"], cwd=REPO, capture_output=True, check=True).stdout
    assert (root / ".dvc/config").read_bytes() == config  # not a remote the user added
