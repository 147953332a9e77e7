"""Scheduled retraining config: params.yaml's `deploy` section, prefect.yaml and `trainflow deploy` agree and fail
clearly. prefect.yaml cannot read params.yaml, so the defaults are written twice; these tests catch drift."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from support.projects import committed

from trainflow import cli
from trainflow.core.errors import ParamsError
from trainflow.params import DEFAULT_CRON, DeployParams, load_params

REPO = Path(__file__).resolve().parents[2]


def test_prefect_yaml_deploys_what_params_yaml_says() -> None:
    defaults = DeployParams()
    assert yaml.safe_load(committed("params.yaml")["params.yaml"])["deploy"] == defaults.model_dump()

    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    [deployment] = spec["deployments"]
    assert deployment["name"] == defaults.name
    assert deployment["work_pool"]["name"] == defaults.work_pool
    assert deployment["schedules"] == [{"cron": defaults.cron, "timezone": defaults.timezone}]
    path, _, function = deployment["entrypoint"].partition(":")
    assert (REPO / path).is_file() and f"def {function}(" in (REPO / path).read_text()
    [pull] = spec["pull"]
    assert list(pull) == ["prefect.deployments.steps.set_working_directory"]
    from trainflow.data import arrival

    [trigger] = deployment["triggers"]  # what `trainflow deploy` makes of deploy.on_new_data, in YAML
    assert (trigger["type"], trigger["enabled"]) == ("event", defaults.on_new_data)
    assert trigger["expect"] == [arrival.EVENT]
    assert trigger["match"] == {"prefect.resource.id": arrival.resource_id(defaults.name)}
    assert trigger["parameters"] == deployment["parameters"]


def test_the_default_cron_is_one_prefect_accepts() -> None:
    from prefect.client.schemas.schedules import CronSchedule

    # trainflow/params/deploy.py skips importing Prefect for the default expression; this is the check it relies on.
    assert CronSchedule(cron=DEFAULT_CRON, timezone="UTC").cron == DEFAULT_CRON


@pytest.mark.parametrize("cron", ["0 3 * *", "61 3 * * *", "H 3 * * *", "every night"])
def test_an_invalid_cron_is_a_params_error_naming_deploy_cron(params_file: Path, cron: str) -> None:
    with pytest.raises(ParamsError) as err:
        load_params(params_file, [f"deploy.cron='{cron}'"])
    assert [p for p, _ in err.value.problems] == ["deploy.cron"]


def test_deploy_params_accept_other_schedules_and_reject_unknown_keys(params_file: Path) -> None:
    p = load_params(params_file, ["deploy.cron='*/15 8-18 * * 1-5'", "deploy.timezone=Europe/Paris"])
    assert p.deploy.cron == "*/15 8-18 * * 1-5" and p.deploy.timezone == "Europe/Paris"
    with pytest.raises(ParamsError) as err:
        load_params(params_file, ["deploy.timezone=Mars/Olympus", "deploy.crontab=x", "deploy.name=a b"])
    assert sorted(p for p, _ in err.value.problems) == ["deploy.crontab", "deploy.name", "deploy.timezone"]


def test_deploy_without_a_server_says_how_to_start_one(
    params_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.chdir(params_file.parent)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):  # even inside another test's prefect_test_harness
        assert cli.main(["deploy"]) == 2
    err = capsys.readouterr().err
    assert "prefect server start" in err and "prefect config set PREFECT_API_URL=" in err
    assert cli.main(["deploy", "--cron", "0 3 * *"]) == 2  # the flag is checked like params.yaml
    assert "deploy.cron:" in capsys.readouterr().err


def test_deploy_to_a_server_that_does_not_answer_exits_2_naming_it(
    params_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    from prefect.settings import PREFECT_API_URL, temporary_settings

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/api"
    monkeypatch.chdir(params_file.parent)
    with temporary_settings(updates={PREFECT_API_URL: url}):
        assert cli.main(["deploy"]) == 2
    err = capsys.readouterr().err
    assert f"the Prefect server at PREFECT_API_URL={url} does not answer" in err and "prefect server start" in err
    assert "Traceback" not in err


def test_serve_registers_the_params_schedule_for_this_project(params_file: Path) -> None:
    from flows.deploy import deploy_params, serve_kwargs
    from trainflow.core.paths import Paths

    paths = Paths(params_file.parent)
    deploy = deploy_params(paths, cron="30 2 * * 6", name=None, timezone="Europe/Paris")
    kwargs = serve_kwargs(paths.root, deploy)
    assert kwargs["name"] == "nightly"
    [schedule] = kwargs["schedules"]
    assert (schedule.cron, schedule.timezone) == ("30 2 * * 6", "Europe/Paris")
    assert kwargs["parameters"] == {"root": str(paths.root.resolve())}
    [trigger] = kwargs["triggers"]  # a new data file retrains this project's deployment
    assert (trigger.expect, trigger.match.model_dump()) == (
        {"trainflow.data.added"},
        {"prefect.resource.id": "trainflow.project.nightly"},
    )
    assert trigger.parameters == kwargs["parameters"]
    assert serve_kwargs(paths.root, deploy.model_copy(update={"on_new_data": False}))["triggers"] == []


def test_default_remote(tmp_path: Path) -> None:
    from tasks import dvc

    subprocess.run(["dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    assert dvc.default_remote(tmp_path) is None
    subprocess.run(["dvc", "remote", "add", "-d", "store", str(tmp_path / "store")], cwd=tmp_path, check=True)
    assert dvc.default_remote(tmp_path) == "store"
