"""Faults that killing `trainflow run` found (issue 16, "kill anywhere"), each with its regression test:

- Prefect's temporary server (local mode) outlived a SIGKILLed run, one orphan per kill, forever;
- DVC rewrites dvc.lock in place, so a run killed while DVC committed a stage left it truncated, and every later run
  failed on it;
- DVC rewrites .dvc/tmp/rwlock in place too, and after a kill there every DVC command failed on it;
- a killed train stage left its MLflow run RUNNING forever (its Prefect flow run too: tests/flows/
  test_scheduled_crash.py and the "nothing left running" invariant of tests/reliability/chaos.py).

(A killed write's temp copy left beside its output: tests/core/test_io.py.)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
import yaml
from support.projects import FAST, make_project
from support.vcs import DVC, dvc


@pytest.mark.slow  # 18 s: README line 2 stays under 10 minutes (CI runs the slow tier after it)
def test_a_killed_run_takes_prefects_temporary_server_with_it(tmp_path: Path) -> None:
    root = make_project(tmp_path / "proj", {"data.source": "builtin:iris", "register.model_name": "iris", **FAST})
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    env.pop("PREFECT_API_URL", None)  # local mode: the run starts its own temporary server
    run = subprocess.Popen(
        [sys.executable, "-m", "trainflow", "run"], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert run.stdout is not None
        for line in run.stdout:  # the flow has started its first stage: the server is up
            if "[trainflow] ingest: running" in line:
                break
        servers = [
            p for p in psutil.Process(run.pid).children() if "prefect.server.api.server" in " ".join(p.cmdline())
        ]
        assert len(servers) == 1, "no temporary Prefect server among the run's children"
        run.kill()  # SIGKILL, as the OOM killer or `kill -9` would: no atexit handler runs
        run.wait()
        gone, alive = psutil.wait_procs(servers, timeout=15)
        assert not alive, f"the temporary Prefect server (pid {servers[0].pid}) outlived its killed run"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)  # the run's session: whatever of it is left
        run.wait()


# A process that commits a stage the way the training flow does (tasks.dvc.commit), but dies halfway through DVC's
# serialisation of dvc.lock: the first half of the YAML is written, then SIGKILL.
KILLED_COMMIT = textwrap.dedent(
    """
    import io, os, signal, sys
    from pathlib import Path
    from dvc.utils.serialize import _yaml
    from tasks import dvc

    real = _yaml._dump

    def half_then_die(data, stream):
        text = io.StringIO()
        real(data, text)
        stream.write(text.getvalue()[: len(text.getvalue()) // 2])
        stream.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    _yaml._dump = half_then_die
    dvc.commit(Path(sys.argv[1]), "make")
    """
)


@pytest.mark.parametrize("first", [True, False], ids=["no-lock-yet", "lock-exists"])
def test_a_commit_killed_while_dvc_writes_its_lock_file_leaves_the_lock_file_whole(
    one_stage: Path, tmp_path: Path, first: bool
) -> None:
    from tasks import dvc as tasks_dvc

    root = _one_stage_project(one_stage, tmp_path)
    if not first:
        tasks_dvc.commit(root, "make")
    before = (root / "dvc.lock").read_text() if not first else None
    (root / "out.txt").write_text("two\n")

    _run_until_killed(KILLED_COMMIT, root)

    lock = root / "dvc.lock"
    if first:
        assert not lock.exists()  # never written: not an empty or half file
    else:
        assert lock.read_text() == before  # the old lock file, whole
        assert yaml.safe_load(lock.read_text())["stages"]["make"]["outs"][0]["path"] == "out.txt"
    # DVC still reads its record (the stage shows as changed), and committing again records the new out.txt.
    status = subprocess.run([DVC, "status", "make"], cwd=root, capture_output=True, text=True)
    assert status.returncode == 0 and "make:" in status.stdout, status.stdout + status.stderr
    tasks_dvc.commit(root, "make")
    assert "up to date" in dvc(root, "status")
    assert (root / "dvc.lock").stat().st_mode & 0o777 == 0o666 & ~_umask()  # not mkstemp's 0o600


@pytest.fixture(scope="module")
def one_stage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git + DVC project with one stage, `make`, whose output out.txt exists but was never committed: made once
    (`git init`, `dvc init`), copied by each test (`_one_stage_project`)."""
    root = tmp_path_factory.mktemp("one-stage") / "proj"
    root.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    dvc(root, "init", "-q")
    (root / "dvc.yaml").write_text("stages:\n  make:\n    cmd: echo made > out.txt\n    outs:\n      - out.txt\n")
    (root / "out.txt").write_text("one\n")
    return root


def _one_stage_project(one_stage: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(one_stage, tmp_path / "proj"))


def _run_until_killed(script: str, root: Path) -> None:
    """Run `script` (which SIGKILLs itself) in a fresh interpreter that imports this repo's code."""
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    killed = subprocess.run([sys.executable, "-c", script, str(root)], cwd=root, env=env, capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# A process that commits a stage as the training flow does, killed halfway through DVC's rewrite of its rwlock file
# (.dvc/tmp/rwlock, rewritten in place at the start and end of every stage operation).
KILLED_RWLOCK = textwrap.dedent(
    """
    import json, os, signal, sys
    from pathlib import Path
    from tasks import dvc

    def half_then_die(obj, fp, **kwargs):
        text = json.dumps(obj)
        fp.write(text[: len(text) // 2])
        fp.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    json.dump = half_then_die
    dvc.commit(Path(sys.argv[1]), "make")
    """
)


def test_a_dvc_call_killed_while_dvc_rewrites_its_rwlock_does_not_break_the_next_run(
    one_stage: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, every DVC command after such a kill failed ("Unable to read RWLock-file ... JSON structure is
    corrupted"), `trainflow run` and `dvc repro` alike; now the next trainflow call removes the stale file (under DVC's
    repo lock: no DVC command is running) and goes on."""
    from tasks import dvc as tasks_dvc

    root = _one_stage_project(one_stage, tmp_path)
    _run_until_killed(KILLED_RWLOCK, root)
    rwlock = root / ".dvc/tmp/rwlock"
    with pytest.raises(ValueError):
        json.loads(rwlock.read_text())  # what DVC itself then fails on:
    status = subprocess.run([DVC, "status"], cwd=root, capture_output=True, text=True)
    assert "Unable to read RWLock-file" in status.stderr

    assert tasks_dvc.changed(root, "make")
    tasks_dvc.commit(root, "make")
    assert f"{rwlock} was corrupt (a dvc command was killed while writing it): removed" in capsys.readouterr().out
    assert "up to date" in dvc(root, "status")
    json.loads(rwlock.read_text())


def test_the_next_train_stage_ends_the_mlflow_run_a_killed_one_left_running(tmp_path: Path) -> None:
    """A train stage SIGKILLed mid-run leaves its MLflow run RUNNING forever; the next train stage of the workspace
    ends it as KILLED, saying why, and leaves alone the runs of live processes and of other workspaces or machines."""
    from mlflow.tracking import MlflowClient

    from trainflow import tracking
    from trainflow.core import processes

    uri = os.environ["MLFLOW_TRACKING_URI"]  # conftest's store
    root = tmp_path / "proj"
    root.mkdir()
    assert tracking.configure(root) == uri
    client = MlflowClient(uri)
    experiment = tracking.ensure_experiment("trainflow", root)
    here = processes.workspace_tag(root)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host, _, started = processes.process_tag().split(":")
    left = {
        "killed": {tracking.WORKSPACE_TAG: here, tracking.PROCESS_TAG: f"{host}:{dead.pid}:{started}"},
        "reused pid": {tracking.WORKSPACE_TAG: here, tracking.PROCESS_TAG: f"{host}:{os.getppid()}:12.00"},
        "alive": {tracking.WORKSPACE_TAG: here, tracking.PROCESS_TAG: processes.process_tag()},
        "other machine": {tracking.WORKSPACE_TAG: here, tracking.PROCESS_TAG: f"elsewhere:{dead.pid}:1.00"},
        "other workspace": {tracking.WORKSPACE_TAG: f"{host}:/else", tracking.PROCESS_TAG: f"{host}:{dead.pid}:1.0"},
        "a sweep trial": {tracking.PROCESS_TAG: f"{host}:{dead.pid}:{started}"},
    }
    ids = {name: client.create_run(experiment, tags=tags).info.run_id for name, tags in left.items()}

    run = tracking.TrainingRun(root, "trainflow", tmp_path / "fallback.json")
    run.start({"lr": 0.1}, tags={}, pipeline=True)
    assert run.error is None and run.run_id is not None
    status = {name: client.get_run(i).info.status for name, i in ids.items()}
    assert status == {"killed": "KILLED", "reused pid": "KILLED", "alive": "RUNNING", "other machine": "RUNNING",
                      "other workspace": "RUNNING", "a sweep trial": "RUNNING"}  # fmt: skip
    assert "ended while the run was RUNNING" in client.get_run(ids["killed"]).data.tags["trainflow.ended"]
    own = client.get_run(run.run_id).data.tags
    assert own[tracking.WORKSPACE_TAG] == here and processes.process_alive(own[tracking.PROCESS_TAG]) is True


def test_a_failure_while_ending_orphaned_runs_never_costs_the_new_run_its_tracking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ending older runs is bookkeeping: if it fails, the train stage's own run is still made and tracked."""
    from mlflow.tracking import MlflowClient

    from trainflow import tracking

    root = tmp_path / "proj"
    root.mkdir()
    uri = tracking.configure(root)

    def broken(*args: object) -> list[str]:
        raise RuntimeError("search_runs failed")

    monkeypatch.setattr(tracking, "end_orphans", broken)
    run = tracking.TrainingRun(root, "trainflow", tmp_path / "fallback.json")
    run.start({"lr": 0.1}, tags={}, pipeline=True)
    assert run.error is None and run.run_id is not None
    assert MlflowClient(uri).get_run(run.run_id).data.params == {"lr": "0.1"}
    assert "could not end the MLflow runs a dead process left RUNNING: RuntimeError('search_runs failed')" in (
        capsys.readouterr().err
    )
