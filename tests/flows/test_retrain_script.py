"""scripts/retrain.sh as the retrain workflow runs it: each job a fresh checkout of a shared origin, one DVC remote.

Job 1 starts from an empty remote, trains everything, pushes and commits dvc.lock back. A developer then changes a
param; job 2 pulls job 1's outputs, reruns only what the param affects and reports the change against the commit
before it. Job 3 has nothing to do: it recomputes nothing and still reports against a base whose metrics it never
pulled (DVC reads them from the remote). A remote that is broken (not merely empty) fails the job.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.projects import FAST, REPO, make_project
from support.vcs import GIT_IDENTITY, git, locked_outs

from trainflow.params import write_overrides

pytestmark = pytest.mark.slow

VENV = Path(sys.executable).parent.parent


def checkout(origin: Path, dest: Path) -> Path:
    """What a CI job starts from: a clone of origin, and the venv at .venv as scripts/setup.sh leaves it."""
    git(dest.parent, "clone", "-q", str(origin), str(dest))
    (dest / ".venv").symlink_to(VENV)
    return dest


def retrain(job: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the job's scripts/retrain.sh from `cwd` (not the project) with the venv only reachable as .venv."""
    venv_bin = (VENV / "bin").resolve()
    path = [p for p in os.environ["PATH"].split(os.pathsep) if p and Path(p).resolve() != venv_bin]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RETRAIN_", "DVC_", "GITHUB_"))}
    full = {**base, **GIT_IDENTITY, "PATH": os.pathsep.join(path), "RETRAIN_SKIP_SETUP": "1", **env}
    return subprocess.run(
        ["bash", str(job / "scripts/retrain.sh")], cwd=cwd, env=full, capture_output=True, text=True, timeout=300
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def table_rows(markdown: str) -> dict[tuple[str, str], list[str]]:
    """The body rows of the markdown tables in a summary: (path, name) → the other cells."""
    rows = {}
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] not in ("Path", "") and not set(cells[0]) <= {"-"}:
            rows[(cells[0], cells[1])] = cells[2:]
    return rows


def test_retrain_jobs_restore_rerun_what_changed_and_report_it(tmp_path: Path) -> None:
    dev = make_project(tmp_path / "dev", {"data.source": "builtin:iris", "register.model_name": "iris", **FAST})
    (dev / "scripts").mkdir()
    shutil.copy2(REPO / "scripts/retrain.sh", dev / "scripts/retrain.sh")
    shutil.copy2(REPO / ".gitignore", dev / ".gitignore")
    git(dev, "add", "-A")
    git(dev, "commit", "-qm", "the retrain script")
    git(dev, "branch", "-m", "main")
    origin = tmp_path / "origin.git"
    git(tmp_path, "clone", "-q", "--bare", str(dev), str(origin))
    remote = tmp_path / "remote"  # does not exist yet: the first job's pull finds an empty remote

    # Job 1: nothing in the remote, so everything runs; outputs pushed, dvc.lock committed back.
    job1 = checkout(origin, tmp_path / "job1")
    out = ok(
        retrain(
            job1, tmp_path, DVC_REMOTE_URL=str(remote), GITHUB_STEP_SUMMARY=str(tmp_path / "s1.md"), RETRAIN_COMMIT="1"
        )
    )
    assert "Running stage 'ingest'" in out and "Running stage 'register'" in out
    for path, md5 in locked_outs(job1).items():
        assert (remote / "files/md5" / md5[:2] / md5[2:]).is_file(), f"{path} was not pushed"
    assert git(job1, "status", "--porcelain", ".dvc/config") == ""  # DVC_REMOTE_URL went to config.local
    assert git(origin, "log", "-1", "--format=", "--name-only", "main").split() == ["dvc.lock"]
    s1 = (tmp_path / "s1.md").read_text()
    assert "Stages run: ingest, split, train, evaluate, register." in s1
    assert "No params changed." in s1
    assert table_rows(s1)[("reports/metrics.json", "accuracy")][0] == "-"  # origin/main had no run yet

    # A developer changes a param.
    work = tmp_path / "work"
    git(tmp_path, "clone", "-q", str(origin), str(work))
    before = git(work, "rev-parse", "HEAD").strip()
    write_overrides(work / "params.yaml", ["train.epochs=3"])
    git(work, "commit", "-qam", "fewer epochs")
    git(work, "push", "-q", "origin", "main")

    # Job 2: job 1's outputs pulled, so only train and what follows it rerun; the change is reported.
    job2 = checkout(origin, tmp_path / "job2")
    env2 = {"DVC_REMOTE_URL": str(remote), "GITHUB_STEP_SUMMARY": str(tmp_path / "s2.md"), "RETRAIN_BASE": before}
    out = ok(retrain(job2, tmp_path, RETRAIN_COMMIT="1", **env2))
    assert "Stage 'ingest' didn't change" in out and "Stage 'split' didn't change" in out
    assert "Running stage 'train'" in out
    s2 = (tmp_path / "s2.md").read_text()
    short = git(work, "rev-parse", "--short", before).strip()
    assert f"against {short}" in s2
    rows2 = table_rows(s2)
    assert rows2[("params.yaml", "train.epochs")] == ["4", "3"]
    assert rows2[("reports/metrics.json", "log_loss")][0] != "-"

    # Job 3: a remote that exists but is not a directory is an error, not "missing files".
    job3 = checkout(origin, tmp_path / "job3")
    (tmp_path / "not-a-dir").write_text("x")
    broken = retrain(job3, tmp_path, DVC_REMOTE_URL=str(tmp_path / "not-a-dir"), GITHUB_STEP_SUMMARY=os.devnull)
    assert broken.returncode != 0
    assert "FAILED while: pulling" in broken.stderr
    # With the real remote: nothing to recompute; the base's metrics (job 1's, not pulled) come from the remote.
    out = ok(retrain(job3, tmp_path, **{**env2, "GITHUB_STEP_SUMMARY": str(tmp_path / "s3.md")}))
    assert "Running stage" not in out
    rows3 = table_rows((tmp_path / "s3.md").read_text())
    assert rows3[("params.yaml", "train.epochs")] == ["4", "3"]
    assert rows3[("reports/metrics.json", "log_loss")] == rows2[("reports/metrics.json", "log_loss")]
