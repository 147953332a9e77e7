"""`trainflow stage NAME`: the stage run with the params and options given, its result printed as JSON under its
name (by rank 0 alone under torchrun), --accept-schema for ingest only, and a stage's error as one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.cli import recorder

from trainflow import cli, stages
from trainflow.core.errors import UserError
from trainflow.core.paths import Paths


def test_stage_runs_the_named_stage_and_prints_its_result_under_its_name(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--accept-schema reaches ingest as accept_schema=True; without it no option is passed. Under torchrun only
    rank 0 prints."""
    calls: list[Any] = []
    monkeypatch.setattr(stages, "run_stage", recorder(calls, {"rows": 5, "at": Path("x")}))
    monkeypatch.delenv("RANK", raising=False)
    assert cli.main(["stage", "split"]) == 0
    assert cli.main(["stage", "ingest", "--accept-schema"]) == 0
    monkeypatch.setenv("RANK", "1")
    assert cli.main(["stage", "train"]) == 0
    assert [(args[0], args[2], kwargs) for args, kwargs in calls] == [
        ("split", Paths(project.root), {}),
        ("ingest", Paths(project.root), {"accept_schema": True}),
        ("train", Paths(project.root), {}),
    ]
    assert calls[0][0][1].register.model_name == "penguins"
    body = '  "rows": 5,\n    "at": "x"\n  }\n}\n'
    assert capsys.readouterr() == ('{\n  "split": {\n  ' + body + '{\n  "ingest": {\n  ' + body, "")


def test_accept_schema_on_another_stage_is_refused(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(stages, "run_stage", recorder([], AssertionError("ran")))
    assert cli.main(["stage", "train", "--accept-schema"]) == 2
    assert capsys.readouterr() == ("", "error: --accept-schema applies to `trainflow stage ingest` only\n")


def test_a_stage_that_fails_without_s_params_leaves_params_yaml_and_prints_only_the_error(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(stages, "run_stage", recorder([], UserError("split: no rows")))
    assert cli.main(["stage", "split"]) == 2
    assert capsys.readouterr() == ("", "error: split: no rows\n")
