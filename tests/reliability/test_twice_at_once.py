"""Twice at once (issue 16): two `trainflow run` started together in one workspace, each with its own -S change, run
one after the other (the second says what it waits for), and a `dvc repro` started while a run holds the workspace
stops with a clear error instead of interleaving. Afterwards DVC's record is true, the registry holds one version per
run and the params file is the second run's. Slow tier (~1.5 min)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.projects import FAST, make_project

pytestmark = pytest.mark.slow


def start(root: Path, *cmd: str) -> subprocess.Popen[str]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}
    env.pop("TRAINFLOW_WORKSPACE", None)
    return subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def trainflow_run(root: Path, *overrides: str) -> subprocess.Popen[str]:
    return start(root, sys.executable, "-m", "trainflow", "run", *[a for o in overrides for a in ("-S", o)])


def test_two_runs_and_a_dvc_repro_at_once_never_interleave(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from trainflow.params import load_params

    root = make_project(tmp_path / "proj", {"data.source": "builtin:iris", "register.model_name": "iris", **FAST})
    first = trainflow_run(root, "train.epochs=3")
    time.sleep(0.5)
    second = trainflow_run(root, "train.epochs=5")
    out = [p.communicate(timeout=600) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], [e[-2000:] for _, e in out]
    assert "waiting for the workspace" in out[1][1] and "in use by `trainflow run`" in out[1][1]
    assert load_params(root / "params.yaml").train.epochs == 5  # the second's -S, written after the first ended
    status = subprocess.run(["dvc", "status"], cwd=root, capture_output=True, text=True)
    assert "up to date" in status.stdout, status.stdout
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    versions = client.search_model_versions("name='iris'")
    assert len(versions) == 2  # one per run: the second trained on its own params, not on a mix
    assert sorted(int(client.get_run(v.run_id).data.params["train.epochs"]) for v in versions) == [3, 5]

    # A run holds the workspace; `dvc repro` started meanwhile stops at its first stage, saying why.
    run = trainflow_run(root, "train.epochs=4")
    deadline = time.monotonic() + 60
    lock = root / ".dvc/tmp/trainflow-workspace.json"
    while time.monotonic() < deadline and not (lock.is_file() and str(run.pid) in lock.read_text()):
        time.sleep(0.1)
    repro = start(root, "dvc", "repro")
    _, repro_err = repro.communicate(timeout=600)
    _, run_err = run.communicate(timeout=600)
    assert run.returncode == 0, run_err[-2000:]
    assert repro.returncode != 0
    assert "Traceback" not in repro_err
    assert (
        f"in use by `trainflow run` (pid {run.pid}" in repro_err and "then rerun `dvc repro`" in repro_err
    ) or "Unable to acquire lock" in repro_err, repro_err[-2000:]  # or DVC's own lock, if the run held it then
    status = subprocess.run(["dvc", "status"], cwd=root, capture_output=True, text=True)
    assert "up to date" in status.stdout, status.stdout

    # The other way round: `dvc repro` first (with work to do), then a run. The run waits (for the stage holding the
    # workspace, then for DVC's locks); `dvc repro` either finishes first or stops at its next stage, saying why.
    from trainflow.params import write_overrides

    write_overrides(root / "params.yaml", ["train.epochs=6"])
    repro = start(root, "dvc", "repro")
    holder = root / ".dvc/tmp/trainflow-workspace.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (holder.is_file() and "trainflow stage" in holder.read_text()):
        time.sleep(0.1)  # its first stage has started
    run = trainflow_run(root)
    _, repro_err = repro.communicate(timeout=600)
    _, run_err = run.communicate(timeout=600)
    assert run.returncode == 0, run_err[-2000:]
    assert "waiting for the workspace" in run_err or "waiting for DVC" in run_err, run_err[-2000:]
    assert "Traceback" not in repro_err
    assert repro.returncode == 0 or f"in use by `trainflow run` (pid {run.pid}" in repro_err, repro_err[-2000:]
    status = subprocess.run(["dvc", "status"], cwd=root, capture_output=True, text=True)
    assert "up to date" in status.stdout, status.stdout
