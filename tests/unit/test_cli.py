"""The command line: -S writes only what it sets and is not kept when the command fails on it; a `trainflow run`
with nothing to do answers without starting Prefect; the help says what -S does and what comes out."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from trainflow import cli
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
        cli._run(run, Paths(params_file.parent))
    # On a Prefect server (here, from the active profile) the flow runs even with nothing to do: it is recorded.
    monkeypatch.setattr(dvc, "changed_stages", lambda root: [])
    home = params_file.parent / "prefect"
    home.mkdir()
    (home / "profiles.toml").write_text(
        'active = "team"\n[profiles.team]\nPREFECT_API_URL = "http://prefect:4200/api"\n'
    )
    assert cli.prefect_api_url() == "http://prefect:4200/api"
    with pytest.raises(AssertionError, match="the Prefect flow started"):
        cli._run(run, Paths(params_file.parent))


@pytest.mark.parametrize("command", ["run", "stage"])
def test_help_says_what_s_does_and_what_comes_out(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "written into params.yaml" in text and "params.yaml is put back as it was" in text
    assert "models/final/" in text and "reports/metrics.json" in text


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """`trainflow` alone: argparse's usage error (exit 2) naming the missing command, not a run of nothing."""
    with pytest.raises(SystemExit) as exit_:
        cli.main([])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "usage: trainflow" in err and "the following arguments are required: command" in err


def test_models_help_lists_each_action_with_what_it_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["models", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for line in (
        "list every version, newest first",
        "promote make VERSION the champion",
        "rollback champion back to the previous champion",
        "show print the model card of a version (NAME@ALIAS or NAME/VERSION)",
    ):
        assert line in text


def test_prefect_api_url_defaults_to_the_local_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A profiles.toml that names no active profile: Prefect's default, "local", is the one read."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_PROFILE", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    (tmp_path / "profiles.toml").write_text(
        '[profiles.local]\nPREFECT_API_URL = "http://localhost:4200/api"\n'
        '[profiles.LOCAL]\nPREFECT_API_URL = "http://elsewhere:4200/api"\n'
    )
    assert cli.prefect_api_url() == "http://localhost:4200/api"
    monkeypatch.setenv("PREFECT_PROFILE", "LOCAL")  # the environment's choice wins over the default
    assert cli.prefect_api_url() == "http://elsewhere:4200/api"
