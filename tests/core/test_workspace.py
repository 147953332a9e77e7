"""The workspace lock (trainflow.core.workspace): a second run waits and says for whom; a stage under `dvc repro` does
not
wait but says what holds the workspace; a killed holder never leaves it locked; the holder's own calls go through."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trainflow.core import workspace
from trainflow.core.errors import UserError

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from trainflow.core import workspace
    with workspace.hold(Path(sys.argv[1]), "trainflow run"):
        print("held", flush=True)
        time.sleep(float(sys.argv[2]))
        print(f"releasing {time.time()!r}", flush=True)
    """
)


def start_holder(root: Path, seconds: float) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in (workspace.HELD, "DVC_STAGE")}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root), str(seconds)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / ".dvc").mkdir()
    monkeypatch.delenv(workspace.HELD, raising=False)
    monkeypatch.delenv("DVC_STAGE", raising=False)
    return tmp_path


def test_a_second_run_waits_for_the_first_and_says_for_whom(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    holder = start_holder(root, 2.0)
    start = time.monotonic()
    with workspace.hold(root, "trainflow run"):
        waited, got = time.monotonic() - start, time.time()
    assert holder.stdout is not None
    released = float(holder.stdout.readline().split()[1])
    assert got >= released  # the second got the workspace only once the first let it go (whenever its process ends)
    assert waited > 1.0
    holder.wait(timeout=30)
    err = capsys.readouterr().err
    assert f"waiting for the workspace {root}: it is in use by `trainflow run` (pid {holder.pid}, since " in err


def test_a_stage_under_dvc_repro_does_not_wait_but_says_what_holds_the_workspace(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = start_holder(root, 5.0)
    monkeypatch.setenv("DVC_STAGE", "train")
    start = time.monotonic()
    with pytest.raises(UserError) as err, workspace.hold(root, "trainflow stage train"):
        pass
    assert time.monotonic() - start < 2.0
    message = str(err.value)
    assert f"in use by `trainflow run` (pid {holder.pid}" in message and "then rerun `dvc repro`" in message
    holder.kill()
    holder.wait()


def test_a_killed_holder_leaves_the_workspace_free(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    holder = start_holder(root, 60.0)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    start = time.monotonic()
    with workspace.hold(root, "trainflow run"):
        assert time.monotonic() - start < 1.0
    assert "waiting" not in capsys.readouterr().err


def test_the_holder_and_its_children_go_through(root: Path) -> None:
    with workspace.hold(root, "trainflow run"):
        assert os.environ[workspace.HELD] == str(root.resolve())
        with workspace.hold(root, "the training_pipeline flow"):  # the flow inside `trainflow run`
            pass
        child = subprocess.run(
            [sys.executable, "-c", HOLDER, str(root), "0"], capture_output=True, text=True, timeout=60
        )  # e.g. a distributed rank or a stage the run starts: inherits the lock through the environment
        assert child.returncode == 0 and child.stdout.splitlines()[0] == "held"
    assert workspace.HELD not in os.environ
