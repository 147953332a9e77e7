"""A `trainflow run -S` that fails after some stages ran with the -S params puts params.yaml back, and its message says
what to run to make the outputs fit together again; following it works, and leaves `dvc status` clean (issue 30,
item 5)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from support.vcs import dvc

from trainflow import cli
from trainflow.core.io import read_json
from trainflow.core.paths import Paths


@pytest.mark.slow  # two full `trainflow run`s and one that fails at train: ~30 s
def test_the_advice_after_a_run_that_failed_at_train_rebuilds_consistent_outputs(
    csv_project: Path, prefect_server: None, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    root, paths = csv_project, Paths(csv_project)
    monkeypatch.chdir(root)
    assert cli.main(["run"]) == 0
    params = paths.params.read_bytes()
    first = read_json(paths.split_schema)["features"]
    capfd.readouterr()
    # data.exclude reruns ingest and split; the mlp cannot recompute its activations, which train alone finds out.
    failed = cli.main(["run", "-S", "data.exclude=[f3]", "-S", "train.activation_checkpointing=true"])
    err = capfd.readouterr().err
    assert failed == 2, err
    assert "train.activation_checkpointing" in err and paths.params.read_bytes() == params  # put back
    assert read_json(paths.split_schema)["features"] == [f for f in first if f != "f3"]  # new splits, old model
    status = dvc(root, "status")
    assert "ingest" in status and "train" in status  # outputs of two sets of params: DVC sees it too
    assert "ingest and split ran with the -S params and DVC recorded them: data/processed, data/splits now come" in err
    assert "those of train, evaluate and register are still from the params before" in err
    assert "trainflow run -S 'data.exclude=[f3]' -S train.activation_checkpointing=true" in err  # to keep them
    advice = re.search(r"To rebuild every output from params\.yaml as it is now, run `([^`]+)`", err)
    assert advice is not None, err
    command = shlex.split(advice.group(1))
    assert command[0] == "trainflow"
    assert cli.main(command[1:]) == 0  # following the advice
    assert "Data and pipelines are up to date" in dvc(root, "status")
    assert read_json(paths.split_schema)["features"] == first
    assert cli.main(["stage", "evaluate"]) == 0
