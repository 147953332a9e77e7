"""The DVC remote: a run's outputs pushed, then a fresh clone pulls them and `dvc repro` recomputes nothing. (First,
`dvc repro` of the whole pipeline, then again with nothing to do: the slow tier's check of the plain DVC driver.)

This is what lets a teammate, or a CI job, start from the last run instead of from scratch: every output in dvc.lock
(the `persist: true` ones too: data/processed, models/checkpoints) is in the remote, and the pulled files are the
ones the run wrote, byte for byte.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.projects import FAST, REPO, make_project
from support.vcs import dvc, git, locked_outs, mtimes, snapshot

pytestmark = pytest.mark.slow

STAGES = ("ingest", "split", "train", "evaluate", "register")


def test_fresh_clone_pulls_every_output_and_reproduces_nothing(tmp_path: Path) -> None:
    project = make_project(tmp_path / "proj", {"data.source": "builtin:iris", "register.model_name": "iris", **FAST})
    shutil.copy2(REPO / ".gitignore", project / ".gitignore")
    ran = dvc(project, "repro")
    assert all(f"Running stage '{s}'" in ran for s in STAGES)
    # `dvc repro` again in the same workspace: nothing to do, and still one registry version.
    from dvc.repo import Repo

    with Repo(str(project)) as repo:
        assert repo.status() == {}
    assert "Running stage" not in dvc(project, "repro")
    assert json.loads((project / "reports/registration.json").read_text())["version"] == 1

    # The committed default remote is <project>/dvc-remote (a URL relative to .dvc/, resolved against it).
    assert dvc(project, "remote", "list").split() == ["local", str(project / "dvc-remote"), "(default)"]
    dvc(project, "push")
    remote = project / "dvc-remote"
    outs = locked_outs(project)
    assert {"data/processed", "models/checkpoints", "data/splits", "models/final"} <= outs.keys()
    for path, md5 in outs.items():  # each output's object (a directory's .dir manifest) is in the remote
        assert (remote / "files/md5" / md5[:2] / md5[2:]).is_file(), f"{path} was not pushed"
    assert json.loads(dvc(project, "status", "--cloud", "--json")) == {}  # cache and remote in sync

    # What a teammate gets: dvc.lock in git; outputs, the cache and the remote's content not.
    git(project, "add", "-A")
    git(project, "commit", "-qm", "run")
    assert git(project, "status", "--porcelain", "--ignored=no") == ""
    assert not [f for f in git(project, "ls-files").split() if f.startswith(("dvc-remote/", "models/", "reports/"))]
    originals = snapshot(project, list(outs))
    assert any(f.startswith("models/checkpoints/step-") for f in originals)
    assert any(f.startswith("data/processed/") for f in originals)

    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(project), str(clone))
    assert not any((clone / path).exists() for path in outs)
    assert not (clone / ".dvc/cache").exists()
    # The clone's own default remote would be clone/dvc-remote: point it at the pushed one, outside git.
    dvc(clone, "remote", "modify", "--local", "local", "url", str(remote))
    dvc(clone, "pull")

    assert snapshot(clone, list(outs)) == originals
    assert json.loads(dvc(clone, "status", "--json")) == {}
    before = mtimes(clone, list(outs))
    again = dvc(clone, "repro")
    assert "Running stage" not in again
    assert all(f"Stage '{s}' didn't change, skipping" in again for s in STAGES)
    # Nothing rewritten, so register did not make a second registry version (registration.json is unchanged).
    assert mtimes(clone, list(outs)) == before
    assert snapshot(clone, list(outs)) == originals
