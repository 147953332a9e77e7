"""train.profile (issue 29, item 3): the train stage writes a torch.profiler trace of exactly the asked updates into
reports/profile/ as Chrome trace JSON (what Perfetto and TensorBoard's profile plugin open), logs it with the MLflow
run, and writes nothing when it is off."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from trainflow.core.io import read_json
from trainflow.core.paths import Paths
from trainflow.params import load_params, with_values
from trainflow.stages import run_stage


@pytest.fixture
def split(iris_project: Path) -> Paths:
    paths = Paths(iris_project)
    for stage in ("ingest", "split"):
        run_stage(stage, load_params(paths.params), paths)
    return paths


def test_a_profiled_run_traces_the_asked_updates_and_trains_the_same_weights(split: Paths, tmp_path: Path) -> None:
    plain = Path(shutil.copytree(split.root, tmp_path / "plain"))
    run_stage("train", load_params(Paths(plain).params), Paths(plain))
    assert not Paths(plain).profile.exists()  # off: nothing written

    params = with_values(load_params(split.params), {"train.profile": {"start": 3, "updates": 2}}, "test")
    run_stage("train", params, split)
    [trace] = split.profile.glob("rank0.*.pt.trace.json")
    events = json.loads(trace.read_text())["traceEvents"]
    steps = sorted({e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")})
    assert steps == ["ProfilerStep#2", "ProfilerStep#3"]  # updates 3 and 4 (steps count from 0): 2 updates
    ops = {e["name"] for e in events if e.get("cat") == "cpu_op"}
    assert {"aten::addmm", "Optimizer.step#AdamW.step"} & ops, sorted(ops)[:40]  # the forward's and step's ops
    final = (split.final / "model.safetensors").read_bytes()
    assert (
        hashlib.sha256(final).digest()
        == hashlib.sha256((Paths(plain).final / "model.safetensors").read_bytes()).digest()
    )

    from mlflow.tracking import MlflowClient

    run_id = read_json(split.train_run)["run_id"]
    logged = [a.path for a in MlflowClient().list_artifacts(run_id, "profile")]
    assert logged == [f"profile/{trace.name}"]
