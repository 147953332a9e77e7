"""`trainflow run`: the flow gets the project's root and the summary of its results is printed; a preempted flow
exits 75; a run with nothing to do answers without starting Prefect and pushes what is there to the DVC remote, unless
a Prefect server is set (PREFECT_API_URL, from the environment or the active Prefect profile)."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest
from support.cli import fake_module, recorder

from trainflow import cli
from trainflow.cli import run as run_cmd
from trainflow.core.errors import ServiceError, UserError
from trainflow.core.paths import Paths
from trainflow.params import write_overrides


class FlowState:
    def __init__(self, name: str, message: str | None = None, results: dict[str, Any] | None = None) -> None:
        self.name, self.message, self.results = name, message, results

    def result(self) -> dict[str, Any] | None:
        return self.results


def run_setup(monkeypatch: pytest.MonkeyPatch, state: FlowState) -> tuple[list[Any], list[Any]]:
    from trainflow.stages import report

    flows: list[Any] = []
    summaries: list[Any] = []
    fake_module(monkeypatch, "flows.training_pipeline", training_pipeline=recorder(flows, state))
    monkeypatch.setattr(report, "summary", recorder(summaries, "the summary"))
    monkeypatch.setenv("PREFECT_API_URL", "http://prefect:4200/api")  # a server: no local one, no DVC check first
    return flows, summaries


def test_run_hands_the_root_to_the_flow_and_prints_the_summary_of_its_results(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    flows, summaries = run_setup(monkeypatch, FlowState("Completed", results={"train": {"epochs": 2}}))
    assert cli.main(["run"]) == 0
    assert flows == [((), {"root": str(project.root), "caller_reports_errors": True, "return_state": True})]
    assert summaries == [((Paths(project.root), {"train": {"epochs": 2}}), {})]
    assert capsys.readouterr() == ("the summary\n", "")


@pytest.mark.parametrize(("message", "said"), [("SIGTERM at step 3", "SIGTERM at step 3"), (None, "train: preempted")])
def test_a_preempted_flow_exits_75_saying_so(
    message: str | None,
    said: str,
    project: Paths,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, summaries = run_setup(monkeypatch, FlowState("Preempted", message))
    assert cli.main(["run"]) == 75
    assert summaries == [] and capsys.readouterr() == ("", f"preempted: {said}\n")


def test_a_run_with_nothing_to_do_pushes_and_summarises_every_stage_as_skipped(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tasks import dvc

    flows, summaries = run_setup(monkeypatch, FlowState("Completed"))
    monkeypatch.delenv("PREFECT_API_URL")
    monkeypatch.setenv("PREFECT_HOME", str(project.root / "no-prefect"))
    monkeypatch.setattr(dvc, "changed_stages", lambda root: [])
    pushed = push_setup(monkeypatch, "store", 0)
    assert cli.main(["run"]) == 0
    skipped = {"skipped": True}
    assert summaries == [
        (
            (Paths(project.root), {"ingest": skipped, "split": skipped, "train": skipped, "evaluate": skipped,
                                   "register": skipped}),
            {},
        )
    ]  # fmt: skip
    assert flows == [] and pushed == [((project.root, "store"), {})]
    assert capsys.readouterr() == ("[trainflow] push: 0 file(s) sent to DVC remote 'store'\nthe summary\n", "")


def test_run_with_nothing_to_do_does_not_start_prefect(
    params_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """DVC says nothing changed: the summary comes at once. The flow module is replaced by one that fails if used,
    and DVC's answer is set by the test."""
    from tasks import dvc

    flow = types.ModuleType("flows.training_pipeline")

    def no_flow(**_: object) -> None:
        raise AssertionError("the Prefect flow started")

    flow.training_pipeline = no_flow  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flows.training_pipeline", flow)
    server = types.ModuleType("flows.local_server")  # no temporary Prefect server for a flow that never runs
    server.start_temporary_server = lambda: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flows.local_server", server)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(params_file.parent / "prefect"))
    monkeypatch.setattr(dvc, "changed_stages", lambda root: [])
    monkeypatch.setattr(dvc, "default_remote", lambda root: None)
    monkeypatch.chdir(params_file.parent)
    run = cli.build_parser().parse_args(["run"])
    assert cli.main(["run"]) == 0
    assert "stages run: none (everything up to date)" in capsys.readouterr().out
    # Something changed: the flow runs.
    monkeypatch.setattr(dvc, "changed_stages", lambda root: ["train"])
    with pytest.raises(AssertionError, match="the Prefect flow started"):
        run_cmd.command(run, Paths(params_file.parent))
    # On a Prefect server (here, from the active profile) the flow runs even with nothing to do: it is recorded.
    monkeypatch.setattr(dvc, "changed_stages", lambda root: [])
    home = params_file.parent / "prefect"
    home.mkdir()
    (home / "profiles.toml").write_text(
        'active = "team"\n[profiles.team]\nPREFECT_API_URL = "http://prefect:4200/api"\n'
    )
    assert run_cmd.prefect_api_url() == "http://prefect:4200/api"
    with pytest.raises(AssertionError, match="the Prefect flow started"):
        run_cmd.command(run, Paths(params_file.parent))


def test_prefect_api_url_defaults_to_the_local_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A profiles.toml that names no active profile: Prefect's default, "local", is the one read."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_PROFILE", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    (tmp_path / "profiles.toml").write_text(
        '[profiles.local]\nPREFECT_API_URL = "http://localhost:4200/api"\n'
        '[profiles.LOCAL]\nPREFECT_API_URL = "http://elsewhere:4200/api"\n'
    )
    assert run_cmd.prefect_api_url() == "http://localhost:4200/api"
    monkeypatch.setenv("PREFECT_PROFILE", "LOCAL")  # the environment's choice wins over the default
    assert run_cmd.prefect_api_url() == "http://elsewhere:4200/api"


def test_prefect_api_url_comes_from_the_environment_first_and_none_without_a_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREFECT_API_URL", "http://env:4200/api")
    assert run_cmd.prefect_api_url() == "http://env:4200/api"
    monkeypatch.delenv("PREFECT_API_URL")
    monkeypatch.delenv("PREFECT_PROFILE", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    assert run_cmd.prefect_api_url() is None  # no profiles.toml
    (tmp_path / "profiles.toml").write_text("not = [toml")
    assert run_cmd.prefect_api_url() is None
    (tmp_path / "profiles.toml").write_text('active = "local"\n[profiles.local]\nPREFECT_LOGGING_LEVEL = "INFO"\n')
    assert run_cmd.prefect_api_url() is None  # a profile without a server


def push_setup(monkeypatch: pytest.MonkeyPatch, remote: str | None, pushed: Any) -> list[Any]:
    from tasks import dvc

    calls: list[Any] = []
    monkeypatch.setattr(dvc, "default_remote", lambda root: remote)
    monkeypatch.setattr(dvc, "push", recorder(calls, pushed))
    return calls


def test_push_unchanged_pushes_to_the_default_remote_and_says_how_many_files_went(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = push_setup(monkeypatch, "store", 4)
    run_cmd.push_unchanged(project)
    assert calls == [((project.root, "store"), {})]
    assert capsys.readouterr() == ("[trainflow] push: 4 file(s) sent to DVC remote 'store'\n", "")
    calls = push_setup(monkeypatch, None, 4)
    run_cmd.push_unchanged(project)  # no remote: nothing to push
    write_overrides(project.params, ["deploy.push=false"])
    calls += push_setup(monkeypatch, "store", 4)
    run_cmd.push_unchanged(project)  # deploy.push off
    assert calls == [] and capsys.readouterr() == ("", "")


def test_a_failed_push_names_the_remote_and_the_failure_and_a_full_remote_speaks_for_itself(
    project: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    push_setup(monkeypatch, "store", OSError("connection refused"))
    with pytest.raises(ServiceError) as err:
        run_cmd.push_unchanged(project)
    assert str(err.value) == (
        "push to DVC remote 'store' failed (OSError: connection refused); the outputs are intact here: rerun "
        "`trainflow run` (or `dvc push`) once the remote answers"
    )
    full = UserError("the remote is full")
    push_setup(monkeypatch, "store", full)
    with pytest.raises(UserError) as raised:
        run_cmd.push_unchanged(project)
    assert raised.value is full
