"""How every command ends: each kind of failure with its one line and exit code (75 preempted, 2 invalid params or
data, 1 a service failing, 130 interrupted), an error's notes after it, anything unexpected with its traceback, exit
1; and a reader that stops early (`trainflow ... | head -1`) ends the command quietly, exit 141."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import recorder, registry_version

from trainflow import cli
from trainflow.core.errors import Preempted, ServiceError, UserError


@pytest.mark.parametrize(
    ("raised", "code", "err"),
    [
        (Preempted("train: SIGTERM at step 7"), 75, "preempted: train: SIGTERM at step 7\n"),
        (UserError("data.source: no such file"), 2, "error: data.source: no such file\n"),
        (ServiceError("MLflow did not answer"), 1, "error: MLflow did not answer\n"),
        (KeyboardInterrupt(), 130, "interrupted; finished outputs are intact, rerun to continue\n"),
    ],
)
def test_each_kind_of_failure_has_its_line_and_exit_code(
    raised: BaseException, code: int, err: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_dispatch", recorder([], raised))
    assert cli.main(["run"]) == code
    assert capsys.readouterr() == ("", err)


def test_an_error_s_notes_follow_it_and_anything_unexpected_shows_its_traceback_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    error = UserError("first")
    error.add_note("then this")
    error.add_note("and this")
    monkeypatch.setattr(cli, "_dispatch", recorder([], error))
    assert cli.main(["run"]) == 2
    assert capsys.readouterr() == ("", "error: first\nthen this\nand this\n")
    monkeypatch.setattr(cli, "_dispatch", recorder([], RuntimeError("kaboom")))
    assert cli.main(["run"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("Traceback (most recent call last):\n")
    assert err.endswith("RuntimeError: kaboom\n")


# --- a closed pipe ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["params", "schema"], ["params", "check"]])
def test_a_reader_that_stops_early_ends_the_command_quietly(params_file: Path, command: list[str]) -> None:
    """`trainflow ... | head -1`: head exits after its line and the pipe closes. Here the pipe is closed before the
    command writes anything, so every write fails, as the writes after head's first line do."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainflow", *command],
        cwd=params_file.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err  # 128 + SIGPIPE, as a shell reports a writer stopped by the pipe
    assert "BrokenPipeError" not in err and "Traceback" not in err, err  # was a traceback, exit 1


class ClosedPipe(io.StringIO):
    """stdout once its reader has gone: every write and flush fails as a write to a closed pipe does."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def test_models_list_into_a_closed_pipe_ends_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainflow import tracking
    from trainflow.registry import registry

    monkeypatch.setattr(tracking, "configure", lambda root: None)
    monkeypatch.setattr(registry, "list_versions", lambda name: [registry_version(2), registry_version(1)])
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert cli.main(["models", "list", "--name", "m"]) == 141  # was 1
    assert capsys.readouterr().err == ""  # was the BrokenPipeError traceback


class ClosedPipeOnFd(ClosedPipe):
    """A closed pipe with a descriptor, as the real sys.stdout has: here a pipe of the test's own, so that pytest's
    capture is never touched."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd

    def fileno(self) -> int:
        return self.fd


def test_a_closed_pipe_s_descriptor_is_pointed_at_dev_null_so_the_exit_flush_is_quiet(
    params_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What is still buffered is flushed again when the interpreter exits: into the closed pipe it would print
    "Exception ignored ... BrokenPipeError", so main() points the descriptor at /dev/null."""
    import os

    read_end, write_end = os.pipe()
    try:
        monkeypatch.chdir(params_file.parent)
        monkeypatch.setattr(sys, "stdout", ClosedPipeOnFd(write_end))
        assert cli.main(["params", "schema"]) == 141
        assert os.path.samestat(os.fstat(write_end), os.stat(os.devnull))  # no longer the pipe
        assert capsys.readouterr().err == ""
    finally:
        os.close(read_end)
        os.close(write_end)
