"""`trainflow params check` and `trainflow params schema`: the resolved params (or the schema) as JSON alone on stdout
and what was checked on stderr; invalid params or -S overrides: every problem on stderr, exit 2, nothing on stdout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trainflow import cli
from trainflow.core.paths import Paths


def test_params_check_prints_the_resolved_params_as_json_on_stdout(
    params_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    written = yaml.safe_load(params_file.read_text())
    monkeypatch.chdir(params_file.parent)
    assert cli.main(["params", "check"]) == 0
    out, err = capsys.readouterr()
    resolved = json.loads(out)  # stdout is JSON alone: was "params.yaml: ok" then (with -S only) the JSON
    assert resolved["train"]["lr"] == written["train"]["lr"] and resolved["seed"] == written["seed"]
    assert set(written) <= set(resolved)
    assert "params.yaml: ok" in err  # the human line goes to stderr
    assert cli.main(["params", "check", "-S", "train.lr=0.5", "-S", "data.exclude=[a, b]"]) == 0
    resolved = json.loads(capsys.readouterr().out)
    assert resolved["train"]["lr"] == 0.5 and resolved["data"]["exclude"] == ["a", "b"]
    assert cli.main(["params", "check", "-S", "train.lr=-1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "train.lr" in err  # invalid: nothing on stdout for a script to mistake for params


def test_params_check_and_schema_say_what_they_checked(project: Paths, capsys: pytest.CaptureFixture[str]) -> None:
    from trainflow.params import schema

    assert cli.main(["params", "check"]) == 0
    out, err = capsys.readouterr()
    assert err == f"{project.params}: ok\n" and json.loads(out)["register"]["model_name"] == "penguins"
    assert cli.main(["params", "check", "-S", "seed=5"]) == 0
    out, err = capsys.readouterr()
    assert err == f"{project.params}: ok with the -S overrides\n" and json.loads(out)["seed"] == 5
    assert cli.main(["params", "schema"]) == 0
    assert capsys.readouterr() == (json.dumps(schema(), indent=2) + "\n", "")
    assert cli.main(["params", "schema", "-S", "seed=-x"]) == 2  # the overrides are validated even here
    assert capsys.readouterr().out == ""
