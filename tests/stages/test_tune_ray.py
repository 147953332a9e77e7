"""tune.backend: ray — the same trials under Ray Tune with ASHA (slow tier: Ray starts a local cluster, ~10 s; the tier
installs the `ray` extra, scripts/test.sh --slow). Every trial's process is killed at its 3rd checkpoint write; the
rerun restores Ray's experiment and each trial resumes from its own last checkpoint; the results, the MLflow runs and
--apply are those of the Optuna backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from support.projects import make_project

from trainflow.params import load_params

pytestmark = pytest.mark.slow

SWEEP = {"tune.backend": "ray", "tune.trials": 2, "tune.workers": 2, "tune.pruner": "none", "train.epochs": 4,
         "train.batch_size": 128, "train.progress": "false"}  # fmt: skip


def tune(root: Path, home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    trainflow = Path(sys.executable).parent / "trainflow"
    return subprocess.run(
        [str(trainflow), "tune", *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HOME": str(home), **env},  # Ray keeps a token in ~/.ray: not the user's home
    )


def test_ray_trials_killed_mid_training_resume_from_their_checkpoints(tmp_path: Path) -> None:
    import mlflow

    root = make_project(tmp_path / "proj", SWEEP)
    home = tmp_path / "home"
    home.mkdir()
    killed = tune(root, home, TRAINFLOW_FAILPOINT="checkpoint_write:3")  # each trial's process, at update 30
    assert killed.returncode != 0, killed.stderr[-3000:]
    assert "rerun `trainflow tune` to resume them" in killed.stderr, killed.stderr[-3000:]
    first = pd.read_csv(root / "reports/tune/trials.csv")
    assert len(first) == 2 and set(first["state"]) == {"running"}  # every trial died; none is counted as ended

    rerun = tune(root, home)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "restoring" in rerun.stderr
    got = pd.read_csv(root / "reports/tune/trials.csv")
    assert list(got["trial"]) == [0, 1] and set(got["state"]) == {"complete"}
    # 10 updates per epoch (1,258 train rows / 128), one checkpoint per epoch: the 2nd (update 20) was whole.
    assert list(got["resumed_from_update"]) == [20] * 2
    assert list(got["last_update"]) == [40] * 2
    params = load_params(root / "params.yaml")
    assert got.loc[0, "train.lr"] == params.train.lr  # Ray's first trial: the current params
    best = yaml.safe_load((root / "reports/tune/best_params.yaml").read_text())
    assert best["value"] == got["val_loss"].min()

    mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    parents = [r for r in runs if r.data.tags.get("trainflow.tune.role") == "study"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 2  # a resumed trial carries on its run
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    assert {r.data.tags["trainflow.tune.state"] for r in children} == {"complete"}
    assert sorted(r.info.run_id for r in children) == sorted(got["mlflow_run_id"])

    applied = tune(root, home, "--apply")
    assert applied.returncode == 0, applied.stderr[-3000:]
    assert load_params(root / "params.yaml").train.lr == pytest.approx(
        json.loads(json.dumps(best["params"]))["train.lr"]
    )

    # The study refuses to continue under other params, and its advice works.
    other = tune(root, home, "-S", "train.epochs=5")
    assert other.returncode != 0 and "was run with other params" in other.stderr, other.stderr[-2000:]
    fresh = tune(root, home, "-S", "train.epochs=5", "-S", "tune.study=fresh", "-S", "tune.trials=1")
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    assert len(pd.read_csv(root / "reports/tune/trials.csv")) == 1
