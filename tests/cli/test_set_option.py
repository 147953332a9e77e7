"""-S on `trainflow stage` and `trainflow run`: it writes only the lines it sets into params.yaml; a command that
fails on it puts params.yaml back, and when stages had already run and been recorded in dvc.lock with the -S params,
the advice names them, what came of them and what to run (a `trainflow run -S` that fails that way: tests/flows)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainflow import cli, stages
from trainflow.cli import overrides
from trainflow.core.errors import UserError
from trainflow.core.paths import Paths
from trainflow.params import write_overrides


def test_overrides_change_only_their_lines(params_file: Path) -> None:
    before = params_file.read_text().splitlines()
    write_overrides(params_file, ["train.lr=0.001", "split.key=[id, day]", "train.max_steps=null"])
    after = params_file.read_text().splitlines()
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert len(before) == len(after) and len(changed) == 2  # max_steps was null already: untouched
    assert changed[0][1].startswith("  key: [id, day]") and "#" in changed[0][1]  # flow style, comment kept
    assert changed[1][1].strip() == "lr: 0.001"  # and every null set nowhere stays written as null


def test_a_command_that_fails_on_its_overrides_leaves_params_yaml_as_it_was(
    params_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(params_file.parent)
    before = params_file.read_bytes()
    assert cli.main(["stage", "ingest", "-S", "data.source=data/raw/nope.csv"]) == 2
    err = capsys.readouterr().err
    assert "data/raw/nope.csv" in err and "put back as it was before -S" in err
    assert params_file.read_bytes() == before


def test_a_stage_that_fails_on_the_s_params_puts_params_yaml_back_and_says_what_ran_with_them(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The stage records itself in dvc.lock (as `dvc repro` would) and then fails: params.yaml is restored, the
    error comes after the line saying so, then the advice naming the stage that ran with the -S params."""
    before = project.params.read_bytes()

    def fails(stage: str, params: Any, paths: Paths) -> None:
        assert params.train.lr == 0.25  # the stage ran with the override
        (paths.root / "dvc.lock").write_text("stages:\n  train:\n    outs:\n    - path: models/final\n")
        raise UserError("train: bad data")

    monkeypatch.setattr(stages, "run_stage", fails)
    assert cli.main(["stage", "train", "-S", "train.lr=0.25"]) == 2
    assert project.params.read_bytes() == before
    assert capsys.readouterr() == (
        "",
        f"{project.params}: put back as it was before -S (the command failed on them)\n"
        "error: train: bad data\n"
        "Before the failure, train ran with the -S params and DVC recorded them: models/final now come from those "
        "params, while those of evaluate and register are still from the params before: they do not fit together "
        "(e.g. new splits beside the old model, which `trainflow stage evaluate` can fail on). To rebuild every "
        "output from params.yaml as it is now, run `trainflow run` (or `dvc repro`): it reruns train and whatever "
        "depends on them. To keep the -S params instead, fix what failed, then run `trainflow run -S train.lr=0.25`.\n",
    )


def lock(**stages: str) -> dict[str, object]:
    """dvc.lock's stages, each with one output and the given md5."""
    return {name: {"cmd": f"trainflow stage {name}", "outs": [{"path": f"out/{name}", "md5": md5}]} for name, md5 in
            stages.items()}  # fmt: skip


def test_the_advice_names_what_ran_with_the_s_params_and_what_to_run() -> None:
    before = lock(ingest="a", split="b", train="c", evaluate="d", register="e")
    assert overrides.rebuild_advice(["train.lr=1"], before, before) is None  # nothing recorded anew: nothing mixed
    after = {**before, **lock(ingest="A", split="B")}
    advice = overrides.rebuild_advice(["data.exclude=[a, b]"], before, after)
    assert advice is not None
    assert "ingest and split ran with the -S params and DVC recorded them: out/ingest, out/split now come" in advice
    assert "those of train, evaluate and register are still from the params before" in advice
    assert "run `trainflow run` (or `dvc repro`)" in advice and "trainflow run -S 'data.exclude=[a, b]'" in advice
    everything = lock(ingest="A", split="B", train="C", evaluate="D", register="E")
    advice = overrides.rebuild_advice(["seed=1"], {}, everything)  # the first run: no dvc.lock before it
    assert advice is not None and "now come from those params, not from params.yaml as it is now" in advice


def test_advice_names_each_stage_that_ran_and_what_came_of_it() -> None:
    before = {"ingest": {"outs": [{"path": "a"}]}, "split": {"outs": [{"path": "b"}]}}
    after = {
        "ingest": {"outs": [{"path": "a2"}, {"md5": "no path"}]},
        "split": {"outs": [{"path": "b2"}, {"path": "c2"}]},
        "train": "not a record",
        "evaluate": {"outs": [{"path": "r/m.json"}]},
        "register": {"outs": [{"path": "r/reg.json"}]},
        "elsewhere": {"outs": [{"path": "z"}]},
    }
    assert overrides.rebuild_advice(["seed=1", "data.exclude=[a, b]"], before, after) == (
        "Before the failure, ingest, split, train, evaluate and register ran with the -S params and DVC recorded "
        "them: a2, b2, c2, r/m.json, r/reg.json now come from those params, not from params.yaml as it is now. To "
        "rebuild every output from params.yaml as it is now, run `trainflow run` (or `dvc repro`): it reruns ingest, "
        "split, train, evaluate and register and whatever depends on them. To keep the -S params instead, fix what "
        "failed, then run `trainflow run -S seed=1 -S 'data.exclude=[a, b]'`."
    )
    assert overrides.rebuild_advice([], {"train": "x"}, {"train": "y"}) == (
        "Before the failure, train ran with the -S params and DVC recorded them: their outputs now come from those "
        "params, while those of evaluate and register are still from the params before: they do not fit together "
        "(e.g. new splits beside the old model, which `trainflow stage evaluate` can fail on). To rebuild every "
        "output from params.yaml as it is now, run `trainflow run` (or `dvc repro`): it reruns train and whatever "
        "depends on them. To keep the -S params instead, fix what failed, then run `trainflow run `."
    )
    assert overrides.rebuild_advice(["x=1"], {"elsewhere": 1}, {"elsewhere": 2}) is None


@pytest.mark.parametrize(
    ("text", "stages_"),
    [
        (None, {}),
        ("stages: [1, 2]\n", {}),
        ("[1, 2]\n", {}),
        ("stages: {a: [", {}),
        ("schema: '2.0'\nstages:\n  train:\n    cmd: t\n", {"train": {"cmd": "t"}}),
    ],
)
def test_locked_stages_is_dvc_lock_s_stages_or_nothing(
    text: str | None, stages_: dict[str, Any], tmp_path: Path
) -> None:
    if text is not None:
        (tmp_path / "dvc.lock").write_text(text)
    assert overrides.locked_stages(tmp_path) == stages_
