"""What users and scripts rely on of params.yaml: every problem named by its dotted path, -S overrides taken as YAML
values and written keeping the file's comments, `trainflow params check` exiting 2 and changing nothing, a
description for every field, and a key given twice refused naming its lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainflow import cli
from trainflow.core.errors import ParamsError
from trainflow.params import load_params, write_overrides


def test_every_problem_is_reported_with_its_dotted_path(params_file: Path) -> None:
    with pytest.raises(ParamsError) as err:
        load_params(params_file, ["train.lr=-1", "train.lrr=3", "split.val_fraction=0.5", "split.test_fraction=0.45"])
    paths = [p for p, _ in err.value.problems]
    assert "train.lr" in paths and "train.lrr" in paths and "split" in paths


def test_overrides_take_yaml_values_and_are_written_keeping_comments(params_file: Path) -> None:
    p = load_params(params_file, ["data.exclude=[a,b]", "train.max_grad_norm=null", "train.lr=3e-4"])
    assert p.data.exclude == ["a", "b"] and p.train.max_grad_norm is None and p.train.lr == 3e-4
    write_overrides(params_file, ["train.lr=0.0003"])
    text = params_file.read_text()
    assert "lr: 0.0003" in text and "# micro-batch size" in text
    before = params_file.read_bytes()
    with pytest.raises(ParamsError):
        write_overrides(params_file, ["train.lr=-1"])
    assert params_file.read_bytes() == before


def test_params_check_exits_2_naming_both_fields_and_changes_nothing(
    params_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = params_file.parent
    monkeypatch.chdir(root)
    before = params_file.read_bytes()
    assert cli.main(["params", "check", "-S", "train.lr=-1", "-S", "train.lrr=3"]) == 2
    err = capsys.readouterr().err
    assert "train.lr:" in err and "train.lrr:" in err
    assert params_file.read_bytes() == before
    assert sorted(p.name for p in root.iterdir()) == ["params.yaml"]
    assert cli.main(["params", "check"]) == 0
    assert json.loads(capsys.readouterr().out)["train"]["lr"] > 0  # stdout is the resolved params, as JSON
    assert cli.main(["params", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert set(schema["properties"]) == {
        "seed",
        "data",
        "split",
        "features",
        "model",
        "train",
        "evaluate",
        "register",
        "tracking",
        "deploy",
        "tune",
    }


def test_every_field_has_a_description() -> None:
    from trainflow.params import schema

    s = schema()
    for name, definition in s["$defs"].items():
        for field, spec in definition["properties"].items():
            assert spec.get("description"), f"{name}.{field} has no description"


def test_a_key_given_twice_is_refused_naming_it_and_its_lines(
    params_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """PyYAML keeps the last of two equal keys silently: `params check` said 0, then `trainflow run` ended in DVC's
    130-line traceback (issue 30). Every repeated key is a problem naming its dotted path and both lines; exit 2."""
    text = params_file.read_text()
    lines = text.splitlines()
    train = next(i for i, line in enumerate(lines) if line.startswith("train:"))
    lines.insert(train + 1, "  lr: 0.5")  # a second train.lr
    lines.append("seed: 3")  # a second top-level seed
    params_file.write_text("\n".join(lines) + "\n")
    first_lr = next(i for i, line in enumerate(lines) if line.startswith("  lr:") and i != train + 1) + 1
    first_seed = next(i for i, line in enumerate(lines) if line.startswith("seed:")) + 1
    monkeypatch.chdir(params_file.parent)
    for command in (["params", "check"], ["run"], ["stage", "ingest"]):
        assert cli.main(command) == 2
        err = capsys.readouterr().err
        assert f"train.lr: given twice (lines {train + 2} and {first_lr})" in err, err
        assert f"seed: given twice (lines {first_seed} and {len(lines)})" in err
    assert not (params_file.parent / "data").exists()  # nothing ran
