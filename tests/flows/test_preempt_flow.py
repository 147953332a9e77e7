"""Preemption in the slow tier (issue 28): `trainflow run` on a Prefect server, and a 2-process training.

- `trainflow run` sent SIGTERM in training exits 75; its flow run ends in state Preempted (type Crashed, no
  traceback), not Failed; the next `trainflow run` resumes from the checkpoint taken at the signal, registers one
  version, and leaves `dvc status` clean.
- Two ranks, SIGTERM sent to rank 1 alone: both stop after the same update, exit 75, and the rerun ends with the
  weights of an uninterrupted 2-process run, bit for bit.
- train.max_time 10s on a real clock: each run stops 10 s (and one update) in, the reruns end bitwise equal.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.projects import make_project
from support.servers import BIN, prefect_server
from support.signals import digest

from trainflow.core.errors import PREEMPTED
from trainflow.core.io import read_json
from trainflow.core.paths import Paths
from trainflow.params import load_params
from trainflow.stages import run_stage

pytestmark = pytest.mark.slow

PARAMS = {"data.source": "builtin:iris", "register.model_name": "iris", "train.epochs": 3, "train.batch_size": 16,
          "train.progress": "false"}  # fmt: skip


def post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def test_trainflow_run_preempted_ends_preempted_not_failed_and_the_next_run_resumes(tmp_path: Path) -> None:
    (tmp_path / "prefect-home").mkdir()
    with prefect_server(tmp_path / "prefect-home") as server:
        root = make_project(tmp_path / "proj", PARAMS)
        env = {**server.env(), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}

        def trainflow_run(extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
            return subprocess.run([str(BIN / "trainflow"), "run"], cwd=root, env={**env, **extra}, capture_output=True,
                                  text=True, timeout=900)  # fmt: skip

        first = trainflow_run({"TRAINFLOW_FAILPOINT": "update:9", "TRAINFLOW_FAILPOINT_SIGNAL": "SIGTERM"})
        assert first.returncode == PREEMPTED, first.stdout[-3000:] + first.stderr[-3000:]
        assert "preempted: train: SIGTERM received: stopped after update 9 of 21" in first.stderr
        assert "Traceback" not in first.stdout + first.stderr
        [run] = post(f"{server.url}/flow_runs/filter", {})
        assert (run["state_type"], run["state_name"]) == ("CRASHED", "Preempted"), run
        assert "rerun to resume" in run["state"]["message"]
        tasks = {t["name"].split("-")[0]: t for t in post(f"{server.url}/task_runs/filter", {})}
        assert tasks["train"]["state_name"] == "Preempted"
        assert "evaluate" not in tasks and "register" not in tasks

        second = trainflow_run({})
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        paths = Paths(root)
        assert read_json(paths.train_run)["resumed_from_update"] == 9
        assert read_json(paths.registration)["version"] == 1  # one version, from the resumed training
        runs = sorted(post(f"{server.url}/flow_runs/filter", {}), key=lambda r: r["created"])
        assert [r["state_name"] for r in runs] == ["Preempted", "Completed"]
        status = subprocess.run([str(BIN / "dvc"), "status"], cwd=root, capture_output=True, text=True, check=True)
        assert "up to date" in status.stdout, status.stdout


def test_two_ranks_stop_after_the_same_update_when_one_is_signalled_and_resume_bitwise(tmp_path: Path) -> None:
    root = make_project(tmp_path / "proj", {**PARAMS, "train.world_size": 2, "train.batch_size": 8})
    paths = Paths(root)
    for stage in ("ingest", "split"):
        run_stage(stage, load_params(paths.params), paths)
    whole = Path(shutil.copytree(root, tmp_path / "whole"))

    def train(where: Path, extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "trainflow"), "stage", "train"], cwd=where, capture_output=True, text=True,
                              env={**os.environ, **extra}, timeout=900)  # fmt: skip

    assert train(whole, {}).returncode == 0
    signal_rank1 = {"TRAINFLOW_FAILPOINT": "update:11", "TRAINFLOW_FAILPOINT_RANK": "1",
                    "TRAINFLOW_FAILPOINT_SIGNAL": "SIGTERM"}  # fmt: skip
    first = train(root, signal_rank1)
    assert first.returncode == PREEMPTED, first.stderr[-3000:]
    assert "another rank was told to stop: stopped after update 11 of 21" in first.stderr  # rank 0's words
    assert [p.name for p in sorted(paths.checkpoints.glob("step-*"))][-1] == "step-000000011"
    again = train(root, {})
    assert again.returncode == 0, again.stderr[-3000:]
    assert read_json(paths.train_run)["resumed_from_update"] == 11
    assert digest(root) == digest(whole)


def test_max_time_10s_on_a_real_clock_stops_each_run_in_time_and_the_reruns_end_bitwise_equal(tmp_path: Path) -> None:
    """train.max_time 10s on a training of about 30 s (the acceptance, 20 s on about a minute, at half the scale: the
    slow tier's longest test); each run trains 10 s and one update more, and the reruns end with one uninterrupted
    run's weights."""
    from support.projects import blobs

    params = {"data.source": "data/raw/blobs.csv", "data.target": "label", "train.epochs": 12, "train.batch_size": 8,
              "train.patience": 1000, "train.progress": "false"}  # fmt: skip
    root = make_project(tmp_path / "proj", params)
    blobs(n=12000, separation=1.0).to_csv(root / "data/raw/blobs.csv", index=False)
    paths = Paths(root)
    for stage in ("ingest", "split"):
        run_stage(stage, load_params(paths.params), paths)
    from trainflow.params import write_overrides

    def timed_train(where: Path) -> float:
        started = time.monotonic()
        done = subprocess.run([str(BIN / "trainflow"), "stage", "train"], cwd=where, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        return time.monotonic() - started

    # "About 30 s" on this machine: CI's cores ran 12 epochs in 19 s, this workplace's in about 60, so the epochs
    # are sized here. An epoch's seconds are those between the checkpoints of a 3-epoch run's last two epoch ends (its
    # weights file: written once, where meta.json is rewritten at the end), start-up left out, in one run; early
    # stopping is off (patience 1000) so that the epochs asked for are the epochs run.
    short = Path(shutil.copytree(root, tmp_path / "epochs-3"))
    write_overrides(short / "params.yaml", ["train.epochs=3"])
    took_short = timed_train(short)
    ends = sorted((step / "model.safetensors").stat().st_mtime for step in Paths(short).checkpoints.glob("step-*"))
    per_epoch = ends[-1] - ends[-2]
    startup = max(0.0, took_short - 3 * per_epoch)  # imports, ingest of the splits, MLflow: not training time
    epochs = max(6, math.ceil(32 / max(per_epoch, 0.05)))
    # The estimate is noisy on shared cores (CI once measured 1.49 s an epoch, and 44 epochs then took 49 s in all, too
    # few for two stops), so the uninterrupted run itself is the yardstick: below 26 s of training (two stops at 10
    # and 20 s, and a margin), its time less the start-up, it is resized and rerun.
    for attempt in range(4):
        write_overrides(paths.params, [f"train.epochs={epochs}"])
        whole = Path(shutil.copytree(root, tmp_path / f"whole-{attempt}"))
        took = timed_train(whole)
        if took - startup >= 26:
            break
        epochs = math.ceil(epochs * 32 / max(took - startup, 1.0))
    write_overrides(paths.params, ["train.max_time=10s"])
    elapsed = []
    for _ in range(30):
        run = subprocess.run([str(BIN / "trainflow"), "stage", "train"], cwd=root, capture_output=True, text=True)
        if run.returncode == 0:
            break
        assert run.returncode == PREEMPTED, run.stderr[-3000:]
        elapsed.append(float(run.stderr.split("train.max_time (10 s) reached after ")[1].split()[0]))
    assert len(elapsed) >= 2, f"{epochs} epochs ({per_epoch:.2f} s each) took {took:.0f} s; stopped after {elapsed} s"
    assert all(10 <= e < 11 for e in elapsed), elapsed  # 10 s and one update (milliseconds here)
    assert digest(root) == digest(whole)
