"""`trainflow data add` and `trainflow data watch`: the files, inbox and options handed to trainflow.data.arrival and
a line for each file, Ctrl-C stopping a watch with 130; the Prefect event each new file sends (none without a server,
a service error when the server refuses it), and a failed `dvc add`."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest
from support.cli import recorder

from trainflow import cli
from trainflow.core.errors import ServiceError, UserError
from trainflow.core.paths import Paths
from trainflow.data import arrival


def test_data_add_passes_the_files_and_says_what_each_became(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[Any] = []
    result = [
        arrival.Added("data/raw/s/feb.csv", "0123456789abcdef" + "f" * 48, 30, new=True, event=True),
        arrival.Added("data/raw/s/mar.csv", "fedcba9876543210" + "0" * 48, 5, new=True, event=False),
        arrival.Added("data/raw/s/jan.csv", "1" * 64, 0, new=False),
    ]
    monkeypatch.setattr(arrival, "add", recorder(calls, result))
    assert cli.main(["data", "add", "feb.csv", "mar.csv", "jan2.csv"]) == 0
    assert cli.main(["data", "add", "--no-event", "x.csv"]) == 0
    assert calls == [
        ((Paths(project.root), [Path("feb.csv"), Path("mar.csv"), Path("jan2.csv")]), {"emit": True}),
        ((Paths(project.root), [Path("x.csv")]), {"emit": False}),
    ]
    lines = (
        "data add: added data/raw/s/feb.csv (30 rows, sha256 0123456789abcdef); event trainflow.data.added sent\n"
        "data add: added data/raw/s/mar.csv (5 rows, sha256 fedcba9876543210)\n"
        "data add: byte-identical to data/raw/s/jan.csv, already in data.source: nothing added, no retrain\n"
    )
    assert capsys.readouterr() == (lines * 2, "")


def test_data_watch_passes_the_inbox_interval_and_once_and_a_ctrl_c_stops_it_with_130(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(arrival, "watch", recorder(calls, 2))
    assert cli.main(["data", "watch", "inbox"]) == 0
    assert cli.main(["data", "watch", "in2", "--interval", "0.5", "--once"]) == 0
    assert calls == [
        ((Paths(project.root), Path("inbox"), 5.0, False), {}),
        ((Paths(project.root), Path("in2"), 0.5, True), {}),
    ]
    assert capsys.readouterr() == ("", "")
    monkeypatch.setattr(arrival, "watch", recorder([], KeyboardInterrupt()))
    assert cli.main(["data", "watch", "inbox"]) == 130
    assert capsys.readouterr() == ("", "trainflow data watch: stopped\n")


def test_each_new_file_sends_one_event_about_the_deployment_with_what_was_added(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import prefect.settings

    sent: list[Any] = []

    async def send(events: list[Any]) -> None:
        sent.extend(events)

    monkeypatch.setattr(prefect.settings, "get_current_settings", lambda: types.SimpleNamespace(
        api=types.SimpleNamespace(url="http://prefect:4200/api")))  # fmt: skip
    monkeypatch.setattr(arrival, "_send", send)
    added = [arrival.Added("data/raw/s/a.csv", "a" * 64, 3, new=True), arrival.Added("data/raw/s/b.csv", "b", 1, True)]
    assert arrival.emit_events("nightly", Paths(tmp_path), added) is True
    assert [(e.event, dict(e.resource.root), e.payload) for e in sent] == [
        (
            "trainflow.data.added",
            {"prefect.resource.id": "trainflow.project.nightly", "prefect.resource.name": str(tmp_path)},
            {"file": "data/raw/s/a.csv", "sha256": "a" * 64, "rows": 3},
        ),
        (
            "trainflow.data.added",
            {"prefect.resource.id": "trainflow.project.nightly", "prefect.resource.name": str(tmp_path)},
            {"file": "data/raw/s/b.csv", "sha256": "b", "rows": 1},
        ),
    ]


def test_without_a_prefect_server_no_event_is_sent_and_the_line_says_how_to_retrain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import prefect.settings

    monkeypatch.setattr(prefect.settings, "get_current_settings", lambda: types.SimpleNamespace(
        api=types.SimpleNamespace(url=None)))  # fmt: skip
    assert arrival.emit_events("n", Paths(tmp_path), [arrival.Added("f", "s", 1, True)]) is False
    assert capsys.readouterr() == (
        "",
        "trainflow data add: PREFECT_API_URL is not set, so no deployment hears of it; run `trainflow run` to "
        "retrain now\n",
    )


def test_a_server_that_refuses_the_event_is_a_service_error_saying_the_files_are_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import prefect.settings

    async def refuse(events: list[Any]) -> None:
        raise ConnectionError("refused")

    monkeypatch.setattr(prefect.settings, "get_current_settings", lambda: types.SimpleNamespace(
        api=types.SimpleNamespace(url="http://p/api")))  # fmt: skip
    monkeypatch.setattr(arrival, "_send", refuse)
    with pytest.raises(ServiceError) as err:
        arrival.emit_events("n", Paths(tmp_path), [arrival.Added("f", "s", 1, True)])
    assert str(err.value) == (
        "the files are in place, but the Prefect server at http://p/api did not take the trainflow.data.added event "
        "(refused); run `trainflow run` to retrain, or rerun nothing and let the cron pick the files up"
    )


@pytest.mark.parametrize(
    ("stdout", "stderr", "said"),
    [
        ("", "  ERROR: not a git repo \n", "ERROR: not a git repo"),
        ("output only\n", "", "output only"),
        ("", "", "exit code 3, no output"),
    ],
)
def test_a_failed_dvc_add_shows_its_stderr_else_its_stdout_else_its_exit_code(
    stdout: str, stderr: str, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    ran: list[Any] = []

    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        ran.append((cmd, kwargs))
        return subprocess.CompletedProcess(cmd, 3, stdout, stderr)

    monkeypatch.setattr(arrival.subprocess, "run", run)
    (tmp_path / ".dvc").mkdir()
    with pytest.raises(UserError) as err:
        arrival._dvc_add(Paths(tmp_path), tmp_path / "data/raw/s/new.csv")
    assert str(err.value) == (
        "trainflow data add: data/raw/s/new.csv is in place but `dvc add data/raw/s/new.csv` failed: "
        f"{said}; fix that and run it yourself"
    )
    assert ran == [
        (
            [sys.executable, "-m", "dvc", "add", "--quiet", "data/raw/s/new.csv"],
            {"cwd": tmp_path, "capture_output": True, "text": True},
        )
    ]
