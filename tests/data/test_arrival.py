"""`trainflow data add` and `trainflow data watch`: a new file lands where data.source reads it, DVC tracks it, and
only new bytes count; a malformed file, other columns or a source that takes no files are refused with the fix, and
nothing is added. (The event reaching a real Prefect server and starting exactly one retrain: tests/flows/
test_data_trigger.py, slow tier.)"""

from __future__ import annotations

import shutil
import subprocess
import types
from pathlib import Path
from typing import Any

import pytest
from support.projects import make_project

from trainflow import cli
from trainflow.core.errors import DataError, UserError
from trainflow.core.paths import Paths
from trainflow.data import arrival

HEADER = "x1,x2,label\n"


def table(path: Path, rows: range) -> Path:
    path.write_text(HEADER + "".join(f"{i},{i % 7 * 0.5},{'ab'[i % 2]}\n" for i in rows))
    return path


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project whose data.source is a folder holding one file, tracked with DVC as a whole (the README's way): made
    once (git init, `dvc add`: seconds), copied for each test."""
    root = make_project(
        tmp_path_factory.mktemp("arrival") / "proj", {"data.source": "data/raw/sales", "data.target": "label"}
    )
    (root / "data/raw/sales").mkdir()
    table(root / "data/raw/sales/jan.csv", range(40))
    subprocess.run(["dvc", "add", "--quiet", "data/raw/sales"], cwd=root, check=True)
    return root


@pytest.fixture
def project(template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Paths:
    """The template project, this test's own copy."""
    root = Path(shutil.copytree(template, tmp_path / "proj"))
    monkeypatch.chdir(root)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    return Paths(root)


def test_a_new_file_lands_in_the_source_folder_and_dvc_tracks_the_folder_again(project: Paths, tmp_path: Path) -> None:
    new = table(tmp_path / "feb.csv", range(40, 70))
    before = (project.root / "data/raw/sales.dvc").read_text()
    [added] = arrival.add(project, [new], emit=False)
    dest = project.root / "data/raw/sales/feb.csv"
    assert (added.file, added.rows, added.new) == ("data/raw/sales/feb.csv", 30, True)
    assert dest.read_bytes() == new.read_bytes() and added.sha256 == arrival.sha256_of(new)
    assert (project.root / "data/raw/sales.dvc").read_text() != before  # the folder's hash now covers feb.csv
    status = subprocess.run(["dvc", "status", "data/raw/sales.dvc"], cwd=project.root, capture_output=True, text=True)
    assert "changed" not in status.stdout, status.stdout  # tracked as it is now, not stale
    from trainflow.data.sources import resolve_files

    assert [p.name for p in resolve_files("data/raw/sales", project.root)] == ["feb.csv", "jan.csv"]


def test_a_byte_identical_file_adds_nothing_whatever_its_name(project: Paths, tmp_path: Path) -> None:
    copy = shutil.copy(project.root / "data/raw/sales/jan.csv", tmp_path / "january-again.csv")
    [result] = arrival.add(project, [Path(copy)], emit=True)  # emit: nothing would be sent for it anyway
    assert (result.new, result.file, result.event) == (False, "data/raw/sales/jan.csv", False)
    assert sorted(p.name for p in (project.root / "data/raw/sales").iterdir()) == ["jan.csv"]


def test_a_file_of_the_same_size_but_other_bytes_is_new_data(project: Paths, tmp_path: Path) -> None:
    """Only the bytes say "the same file": jan.csv's rows in another order have its size, not its content (sha256)."""
    jan = project.root / "data/raw/sales/jan.csv"
    lines = jan.read_text().splitlines(keepends=True)
    shuffled = tmp_path / "jan-again.csv"
    shuffled.write_text(lines[0] + "".join(reversed(lines[1:])))
    assert shuffled.stat().st_size == jan.stat().st_size and arrival.sha256_of(shuffled) != arrival.sha256_of(jan)
    [added] = arrival.add(project, [shuffled], emit=False)
    assert (added.file, added.rows, added.new) == ("data/raw/sales/jan-again.csv", 40, True)
    assert (project.root / added.file).read_bytes() == shuffled.read_bytes()
    clash = tmp_path / "jan.csv"  # the same name, size and other bytes: a clash, not "already there"
    clash.write_text(lines[0] + "".join(lines[2:]) + lines[1])
    assert clash.stat().st_size == jan.stat().st_size
    with pytest.raises(UserError, match="jan.csv already exists with other content"):
        arrival.add(project, [clash], emit=False)


def test_a_malformed_row_is_refused_naming_file_and_line_and_nothing_is_added(project: Paths, tmp_path: Path) -> None:
    bad = table(tmp_path / "mar.csv", range(10))
    bad.write_text(bad.read_text() + "3,4\n" + "5,6.0,a\n")  # line 12 has two fields of three
    good = table(tmp_path / "apr.csv", range(100, 110))
    with pytest.raises(DataError, match=r"not added: .*mar\.csv, line 12") as err:
        arrival.add(project, [good, bad], emit=False)  # one bad file: neither is added
    assert "a value missing with its delimiter" in str(err.value)
    assert sorted(p.name for p in (project.root / "data/raw/sales").iterdir()) == ["jan.csv"]


def test_a_file_with_other_columns_than_the_last_ingest_is_refused(project: Paths, tmp_path: Path) -> None:
    from trainflow.params import load_params
    from trainflow.stages import run_stage

    run_stage("ingest", load_params(project.params), project)
    other = tmp_path / "may.csv"
    other.write_text("x1,x3,label\n1,2,a\n3,4,b\n")
    with pytest.raises(DataError, match=r"lacks \['x2'\] and has extra \['x3'\]; files of one source must have"):
        arrival.add(project, [other], emit=False)
    assert not (project.root / "data/raw/sales/may.csv").exists()


def test_a_name_taken_by_other_bytes_is_refused_not_replaced(project: Paths, tmp_path: Path) -> None:
    clash = table(tmp_path / "jan.csv", range(200, 230))
    with pytest.raises(UserError, match="jan.csv already exists with other content; give the new file another name"):
        arrival.add(project, [clash], emit=False)
    assert (project.root / "data/raw/sales/jan.csv").read_text().count("\n") == 41


def test_a_builtin_source_is_refused_and_following_the_message_works(project: Paths, tmp_path: Path) -> None:
    from trainflow.params import write_overrides

    write_overrides(project.params, ["data.source=builtin:iris"])
    new = table(tmp_path / "feb.csv", range(40, 70))
    with pytest.raises(UserError) as err:
        arrival.add(project, [new], emit=False)
    message = str(err.value)
    assert "data.source: data/raw/<name>/ (a folder" in message and "the folder is made if missing" in message
    write_overrides(project.params, ["data.source=data/raw/incoming/", "data.target=label"])  # as it says
    [added] = arrival.add(project, [new], emit=False)
    assert added.file == "data/raw/incoming/feb.csv" and (project.root / "data/raw/incoming/feb.csv.dvc").is_file()


def test_a_one_file_source_is_refused_with_a_glob_that_then_takes_the_file(project: Paths, tmp_path: Path) -> None:
    from trainflow.params import write_overrides

    write_overrides(project.params, ["data.source=data/raw/sales/jan.csv"])
    new = table(tmp_path / "feb.csv", range(40, 70))
    with pytest.raises(UserError, match=r"Set data.source: data/raw/sales/\*\.csv in") as err:
        arrival.add(project, [new], emit=False)
    write_overrides(project.params, ["data.source=data/raw/sales/*.csv"])  # as the message says
    assert arrival.add(project, [new], emit=False)[0].file == "data/raw/sales/feb.csv"
    other = tmp_path / "feb.tsv"
    other.write_text("x1\tx2\tlabel\n1\t2\ta\n")
    with pytest.raises(UserError, match=r"feb.tsv would not match data.source data/raw/sales/\*\.csv"):
        arrival.add(project, [other], emit=False)
    assert "outside" not in str(err.value)


def test_dvc_files_beside_the_data_are_not_read_as_data(project: Paths, tmp_path: Path) -> None:
    """`dvc add data/raw/<folder>/<file>` leaves <file>.dvc in the folder data.source reads."""
    from trainflow.data.sources import read_source
    from trainflow.params import load_params

    (project.root / "data/raw/sales/jan.csv.dvc").write_text("outs:\n- md5: 0\n  path: jan.csv\n")
    raw = read_source(load_params(project.params).data, project.root)
    assert len(raw.frame) == 40 and [p.name for p in raw.files] == ["jan.csv"]


def test_watch_adds_new_files_skips_identical_ones_and_rejects_bad_ones_with_the_reason(
    project: Paths, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    table(inbox / "feb.csv", range(40, 70))
    shutil.copy(project.root / "data/raw/sales/jan.csv", inbox / "again.csv")
    (inbox / "broken.csv").write_text(HEADER + "1,2\n")
    assert cli.main(["data", "watch", str(inbox), "--once"]) == 0
    assert sorted(p.name for p in (project.root / "data/raw/sales").iterdir()) == ["feb.csv", "jan.csv"]
    assert sorted(p.name for p in (inbox / "added").iterdir()) == ["again.csv", "feb.csv"]
    assert sorted(p.name for p in (inbox / "rejected").iterdir()) == ["broken.csv", "broken.csv.why.txt"]
    assert "broken.csv, line 2" in (inbox / "rejected/broken.csv.why.txt").read_text()
    assert not [p for p in inbox.iterdir() if p.is_file()]
    out = capsys.readouterr().out
    assert "again.csv is byte-identical to data/raw/sales/jan.csv; nothing added" in out
    assert "added feb.csv as data/raw/sales/feb.csv (30 rows)" in out


def test_watch_refuses_a_folder_inside_data_raw(project: Paths, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["data", "watch", "data/raw/sales", "--once"]) == 2
    assert "watch a folder outside it" in capsys.readouterr().err


def test_cli_add_without_a_server_says_how_to_retrain(
    project: Paths, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    new = table(tmp_path / "feb.csv", range(40, 70))
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        assert cli.main(["data", "add", str(new)]) == 0
    captured = capsys.readouterr()
    assert "data add: added data/raw/sales/feb.csv (30 rows, sha256 " in captured.out
    assert "event" not in captured.out and "run `trainflow run` to retrain now" in captured.err
    assert cli.main(["data", "add", str(new)]) == 0  # again: already there
    assert "byte-identical to data/raw/sales/feb.csv, already in data.source: nothing added" in capsys.readouterr().out


def test_an_unreachable_server_is_a_service_error_after_the_file_is_in_place(
    project: Paths, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from support.servers import free_port

    new = table(tmp_path / "feb.csv", range(40, 70))
    with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{free_port()}/api"}):
        assert cli.main(["data", "add", str(new)]) == 1
    assert "did not take the trainflow.data.added event" in capsys.readouterr().err
    assert (project.root / "data/raw/sales/feb.csv").is_file()


# --- what `trainflow data add` says when `dvc add` fails, and the event it sends ---------------------------------


def _failing_dvc(stdout: str, stderr: str) -> types.SimpleNamespace:
    """Stands in for the subprocess module arrival runs `python -m dvc add` with: the command fails with this output."""

    def run(cmd: list[str], **kwargs: Any) -> types.SimpleNamespace:
        assert cmd[1:4] == ["-m", "dvc", "add"], cmd
        return types.SimpleNamespace(returncode=1, stdout=stdout, stderr=stderr)

    return types.SimpleNamespace(run=run)


@pytest.mark.parametrize(
    ("stdout", "stderr", "shown"),
    [
        ("", "ERROR: unexpected error - disk full\n", "ERROR: unexpected error - disk full"),
        ("progress line\n", "ERROR: output 'data/raw/new.csv' is ignored\n", "ERROR: output 'data/raw/new.csv' is"),
        ("ERROR: only on stdout\n", "", "ERROR: only on stdout"),
        ("", "", "exit code 1, no output"),
    ],
)
def test_a_failed_dvc_add_names_what_dvc_said_on_stderr_else_on_stdout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stdout: str, stderr: str, shown: str
) -> None:
    (tmp_path / ".dvc").mkdir()  # a DVC project: the file gets tracked
    dest = tmp_path / "data/raw/new.csv"
    monkeypatch.setattr(arrival, "subprocess", _failing_dvc(stdout, stderr))
    with pytest.raises(UserError) as caught:
        arrival._dvc_add(Paths(tmp_path), dest)
    message = str(caught.value)
    assert "`dvc add data/raw/new.csv` failed: " + shown in message
    assert message.endswith("; fix that and run it yourself")
    if stderr:
        assert "progress line" not in message  # stdout is only the fallback


def test_the_data_added_event_is_about_the_deployment_and_names_the_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    sent: list[Any] = []

    async def send(events: list[Any]) -> None:  # instead of the Prefect events client: nothing leaves the machine
        sent.extend(events)

    monkeypatch.setattr(arrival, "_send", send)
    added = [arrival.Added("data/raw/sales/feb.csv", "ab" * 32, 30, new=True)]
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        assert arrival.emit_events("nightly", Paths(tmp_path), added) is True
    [event] = sent
    assert event.event == "trainflow.data.added"
    assert dict(event.resource) == {"prefect.resource.id": "trainflow.project.nightly",
                                    "prefect.resource.name": str(tmp_path)}  # fmt: skip
    assert event.resource.name == str(tmp_path)
    assert event.payload == {"file": "data/raw/sales/feb.csv", "sha256": "ab" * 32, "rows": 30}
