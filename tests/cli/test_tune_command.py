"""`trainflow tune`: ingest and split first, each only if DVC sees it changed, then the study with the options given
(the -S overrides apply to the sweep only); on a deployment every option is handed to the sweep flow and no data is
prepared here; fewer than one trial or worker is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.cli import fake_module, recorder

from trainflow import cli, stages
from trainflow.cli import tune as tune_cmd
from trainflow.core.paths import Paths


def test_tune_prepares_the_data_then_runs_the_study_with_the_options_given(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainflow import tune

    checked: list[Any] = []
    prepared: list[Any] = []
    ran: list[Any] = []
    monkeypatch.setattr(tune, "check_overrides", recorder(checked))
    monkeypatch.setattr(tune_cmd, "prepare_data", recorder(prepared))
    monkeypatch.setattr(tune, "run", recorder(ran, {"best": Path("a/b"), "n": 2}))
    assert cli.main(["tune"]) == 0
    assert cli.main(["tune", "-S", "train.lr=0.5", "--trials", "3", "--workers", "2", "--apply"]) == 0
    assert checked == [(([],), {}), ((["train.lr=0.5"],), {})]
    assert prepared == [((Paths(project.root),), {})] * 2
    [(args0, kw0), (args1, kw1)] = ran
    assert kw0 == {"trials": None, "workers": None, "apply": False, "overrides": []} and args0[1] == Paths(project.root)
    assert kw1 == {"trials": 3, "workers": 2, "apply": True, "overrides": ["train.lr=0.5"]}
    assert args0[0].train.lr != 0.5 and args1[0].train.lr == 0.5  # the -S applies to the sweep
    assert args0[0].register.model_name == "penguins"
    assert capsys.readouterr() == ('{\n  "best": "a/b",\n  "n": 2\n}\n' * 2, "")


def test_tune_on_a_deployment_hands_every_option_to_the_sweep_flow(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainflow import tune

    swept: list[Any] = []
    monkeypatch.setattr(tune, "check_overrides", lambda overrides: None)
    monkeypatch.setattr(tune_cmd, "prepare_data", recorder([], AssertionError("prepared data for a deployment")))
    fake_module(monkeypatch, "flows.sweep", sweep=recorder(swept, {"study": "s"}))
    assert cli.main(["tune", "--deployment", "tune_worker/tw", "-S", "seed=3", "--trials", "4"]) == 0
    assert swept == [
        (
            (),
            {
                "root": str(project.root),
                "overrides": ["seed=3"],
                "trials": 4,
                "workers": None,
                "deployment": "tune_worker/tw",
                "apply": False,
            },
        ),  # fmt: skip
    ]
    assert capsys.readouterr() == ('{\n  "study": "s"\n}\n', "")


@pytest.mark.parametrize(("argv", "said"), [(["--trials", "0"], "--trials must be at least 1, not 0"),
                                            (["--workers", "-1"], "--workers must be at least 1, not -1")])  # fmt: skip
def test_tune_refuses_fewer_than_one_trial_or_worker(
    argv: list[str], said: str, project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainflow import tune

    monkeypatch.setattr(tune, "run", recorder([], AssertionError("ran")))
    assert cli.main(["tune", *argv]) == 2
    assert capsys.readouterr() == ("", f"error: {said}\n")


def test_prepare_data_runs_and_commits_only_the_changed_data_stages(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tasks import dvc

    ran: list[Any] = []
    committed: list[Any] = []
    tune_cmd.prepare_data(project)  # not a DVC project: nothing to do
    (project.root / ".dvc").mkdir()
    monkeypatch.setattr(dvc, "changed", lambda root, stage: stage == "split")
    monkeypatch.setattr(dvc, "commit", recorder(committed))
    monkeypatch.setattr(stages, "run_stage", lambda stage, params, paths: ran.append((stage, paths)))
    tune_cmd.prepare_data(project)
    assert ran == [("split", project)] and committed == [((project.root, "split"), {})]
    assert capsys.readouterr() == ("", "[trainflow] split: running\n")
