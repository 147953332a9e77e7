"""Changing the target, the task or the features runs to completion through both drivers, with no deletion by hand;
the inferred task is said; a user model in the project root trains without PYTHONPATH, and editing it retrains."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.projects import make_project
from support.shapes import tips
from support.vcs import dvc

from trainflow import cli
from trainflow.core.io import read_json
from trainflow.core.paths import Paths
from trainflow.params import load_params
from trainflow.stages import run_stage

# register.model_name auto: each target and task is registered under its own name (one name holds one kind of model)
FAST = {"train.epochs": 3, "train.progress": "false", "train.batch_size": 32, "register.model_name": "auto"}
CHANGES = [
    (["data.target=day"], "classification"),
    (["data.target=size"], "classification"),  # 6 distinct integers over 244 rows: classes
    (["data.task=regression"], "regression"),  # the user says otherwise
    (["data.exclude=[sex, smoker]"], "regression"),
]


def tips_project(tmp: Path) -> Path:
    root = make_project(tmp / "tips", {"data.source": "data/raw/tips.csv", "data.target": "tip", **FAST})
    tips().to_csv(root / "data" / "raw" / "tips.csv", index=False)
    return root


def dvc_status(root: Path) -> str:
    return dvc(root, "status")


@pytest.mark.slow  # three full `trainflow run`s: ~25 s (README line 2 stays under 10 minutes)
def test_changes_run_to_completion_with_trainflow_run(
    tmp_path: Path, prefect_server: None, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    root = tips_project(tmp_path)
    monkeypatch.chdir(root)
    assert cli.main(["run"]) == 0
    out = capfd.readouterr().out
    assert "task:     regression (target 'tip' holds numbers with fractions (e.g." in out  # said, and why
    for overrides, task in CHANGES:
        assert cli.main(["run", *(a for o in overrides for a in ("-S", o))]) == 0, overrides
        assert f"task:     {task}" in capfd.readouterr().out, overrides
        assert "up to date" in dvc_status(root)


@pytest.mark.slow  # two full `dvc repro`s: ~1.5 minutes
def test_changes_run_to_completion_with_dvc_repro(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new target whose integers are classes, then the task set by hand: both drivers ask DVC what changed
    (tasks/dvc.py), so the other two changes, which `trainflow run` makes above, would add two more `dvc repro`s and
    nothing else. The regression run they change is made as `trainflow run` makes it (stages in this process, each
    committed to dvc.lock): five `trainflow stage` processes fewer, the same outputs and record."""
    from tasks.dvc import changed_stages, commit
    from trainflow.params import write_overrides
    from trainflow.stages import STAGES

    root = tips_project(tmp_path)
    monkeypatch.chdir(root)
    paths = Paths(root)
    for stage in STAGES:
        run_stage(stage, load_params(paths.params), paths)
        commit(root, stage)
    assert changed_stages(root) == []
    for overrides, task in CHANGES[1:3]:  # each change stays: the second is made on the first
        write_overrides(root / "params.yaml", overrides)
        out = dvc(root, "repro")  # fails the test (with DVC's output) if any stage fails
        assert "Running stage 'train'" in out and read_json(Paths(root).split_schema)["task"] == task, overrides
    assert "up to date" in dvc_status(root)


TINY = """import torch


class TinyNet(torch.nn.Module):
    def __init__(self, in_features, out_features, width={width}):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(in_features, width), torch.nn.ReLU(),
                                       torch.nn.Linear(width, out_features))

    def forward(self, x):
        return self.net(x)
"""


@pytest.mark.slow  # two pipeline runs through the CLI: ~22 s
def test_a_user_model_in_the_project_root_trains_and_editing_it_retrains(
    tmp_path: Path, prefect_server: None, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    root = tips_project(tmp_path)
    (root / "mymodels.py").write_text(TINY.format(width=8))
    paths = Paths(root)
    monkeypatch.chdir(root)
    # Without model.code: a params error that says what to set.
    assert cli.main(["params", "check", "-S", "model.name=mymodels:TinyNet"]) == 2
    assert "-S model.code=mymodels.py" in capfd.readouterr().err
    for stage in ("ingest", "split"):  # what train needs; the user's model plays no part in them
        run_stage(stage, load_params(paths.params), paths)
    # As DVC runs it: a fresh process, started in the project, with no PYTHONPATH.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    trainflow = str(Path(sys.executable).parent / "trainflow")
    trained = subprocess.run(
        [trainflow, "stage", "train", "-S", "model.name=mymodels:TinyNet", "-S", "model.code=mymodels.py"],
        cwd=root, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert cli.main(["run"]) == 0  # evaluate and register the user's model through the flow
    first = read_json(paths.final / "training.json")["model_source"]
    assert first["module"] == "mymodels" and "up to date" in dvc_status(root)

    (root / "mymodels.py").write_text(TINY.format(width=12))  # the user edits the model
    assert "changed deps" in dvc_status(root) and "mymodels.py" in dvc_status(root)
    capfd.readouterr()
    assert cli.main(["stage", "evaluate"]) == 2  # the old weights do not fit the edited network: refused
    assert "trained with another version of mymodels" in capfd.readouterr().err
    assert cli.main(["run"]) == 0
    again = read_json(paths.final / "training.json")
    assert again["model_source"]["sha256"] != first["sha256"]
    assert read_json(paths.train_run)["resumed_from_update"] is None  # trained afresh (how the run went)
    assert "up to date" in dvc_status(root)
