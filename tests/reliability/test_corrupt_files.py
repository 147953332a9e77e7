"""Damaged files (issue 16, "corrupt files"): a truncated Parquet in data/splits, a corrupt model.safetensors in
models/final, a checkpoint with a tensor missing, a dvc.lock edited into invalid YAML. Each is a clear error (exit 2,
no traceback) naming the file and the command that repairs it, and following that advice repairs it: the test runs
the command the message gives and checks the file is back (or the stage then runs).

Slow tier: one pipeline run through `dvc repro` (~30 s) shared by the four cases."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from support.projects import FAST, make_project

pytestmark = pytest.mark.slow


def sh(root: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)


def trainflow(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return sh(root, sys.executable, "-m", "trainflow", *args)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    settings = {"data.source": "builtin:iris", "register.model_name": "iris", **FAST}
    root = make_project(tmp_path_factory.mktemp("corrupt") / "proj", settings)
    done = sh(root, "dvc", "repro")
    assert done.returncode == 0, done.stderr[-3000:]
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    assert sh(root, *git, "add", "dvc.lock").returncode == 0
    assert sh(root, *git, "commit", "-qm", "pipeline ran").returncode == 0
    return root


def clear_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stderr


def test_a_truncated_split_names_the_file_and_dvc_checkout_restores_it(project: Path) -> None:
    split = project / "data/splits/train.parquet"
    whole = split.read_bytes()
    split.write_bytes(whole[: len(whole) // 3])
    err = clear_error(trainflow(project, "stage", "train"))
    assert f"{split} cannot be read, it is corrupt or truncated" in err
    assert "`dvc checkout --force data/splits`" in err and "`trainflow stage split`" in err
    assert sh(project, "dvc", "checkout", "--force", "data/splits").returncode == 0
    assert split.read_bytes() == whole
    assert "up to date" in sh(project, "dvc", "status").stdout


def test_a_corrupt_exported_model_names_the_file_and_dvc_checkout_restores_it(project: Path) -> None:
    weights = project / "models/final/model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[:200])
    err = clear_error(trainflow(project, "stage", "evaluate"))
    assert f"model {weights.parent}: model.safetensors is corrupt or truncated" in err
    assert "`dvc checkout --force models/final`" in err
    assert sh(project, "dvc", "checkout", "--force", "models/final").returncode == 0
    assert weights.read_bytes() == whole
    assert trainflow(project, "stage", "evaluate").returncode == 0


def test_a_checkpoint_missing_a_tensor_names_it_and_deleting_it_resumes_from_the_one_before(project: Path) -> None:
    store = project / "models/checkpoints"
    steps = sorted(p for p in store.iterdir() if p.name.startswith("step-"))
    assert len(steps) >= 2
    latest = steps[-1]
    backup = project.parent / "checkpoint-backup"
    shutil.copytree(latest, backup)
    model = load_file(str(latest / "model.safetensors"))
    dropped = sorted(model)[0]
    del model[dropped]
    save_file(model, str(latest / "model.safetensors"))
    err = clear_error(trainflow(project, "stage", "train"))
    assert f"checkpoint {latest} does not fit this model and trainer" in err and dropped in err
    assert f"`rm -r {latest}`" in err
    shutil.rmtree(latest)  # the advice
    done = trainflow(project, "stage", "train")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"train: resumed from {steps[-2]} at update {int(steps[-2].name[5:])}" in done.stderr
    # Back to what DVC committed, for the next test.
    assert sh(project, "dvc", "checkout", "--force").returncode == 0
    assert "up to date" in sh(project, "dvc", "status").stdout


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('schema: "2.0"\nstages: [\n  train: {', "line 3"),  # not YAML
        ('schema: "2.0"\nstages: 5\n', "expected a dictionary"),  # YAML, not a lock file
    ],
    ids=["syntax", "structure"],
)
def test_a_hand_edited_dvc_lock_names_it_and_git_checkout_restores_it(project: Path, text: str, problem: str) -> None:
    lock = project / "dvc.lock"
    whole = lock.read_text()
    lock.write_text(text)
    err = clear_error(trainflow(project, "run"))
    assert f"{lock}: DVC cannot read it" in err and problem in err
    assert "`git checkout -- dvc.lock`" in err
    assert sh(project, "git", "checkout", "--", "dvc.lock").returncode == 0
    assert lock.read_text() == whole
    again = trainflow(project, "run")
    assert again.returncode == 0, again.stderr[-3000:]
