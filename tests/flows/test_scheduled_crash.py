"""Scheduled runs when the Prefect server goes away (issue 16, "scheduled runs"): `trainflow deploy` serves the
pipeline on a `* * * * *` cron against a real server, and a scheduled run is training when

1. the server alone is killed, then restarted on the same database: the run never needed it to train, keeps going
   and ends Completed once the server answers again (Prefect's client retries meanwhile);
2. the server and the process serving the deployment die together (a machine or pod that goes down), then both are
   started again: the interrupted run, which no process can report on any more, ends Crashed, saying why, and the
   next scheduled run completes, resuming training from the interrupted run's newest checkpoint.

Slow tier: about 4 minutes, most of it waiting for the cron's minutes.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from support.projects import make_project
from support.servers import BIN, PrefectServer, kill, spawn, stop, tail

from trainflow.core.io import read_json
from trainflow.params import write_overrides

pytestmark = pytest.mark.slow

# Long enough (~20-40 s of training) to be killed in the middle; a checkpoint every 14 updates.
TRAINING = {"data.source": "builtin:iris", "register.model_name": "iris", "train.epochs": 150, "train.patience": 1000,
            "train.batch_size": 8, "train.progress": "false"}  # fmt: skip


def runs(server: PrefectServer) -> list[Any]:
    from prefect.client.orchestration import SyncPrefectClient

    with SyncPrefectClient(server.url) as client:
        return [r for r in client.read_flow_runs(limit=200) if r.state is not None and r.state_name != "Scheduled"]


def wait_until(what: str, check: Any, timeout_s: float, log: Path) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = check()
        except Exception:  # noqa: BLE001 - the server may be starting
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"no {what} after {timeout_s:g} s; log:\n{tail(log)}"
        time.sleep(1)


def checkpoints(root: Path) -> set[str]:
    return {p.name for p in (root / "models/checkpoints").glob("step-*")}


def training(server: PrefectServer, root: Path, before: set[str], log: Path) -> Any:
    """The flow run that is Running and has written a checkpoint not in `before`: it is in the middle of training."""

    def check() -> Any:
        running = [r for r in runs(server) if r.state_name == "Running"]
        return running[0] if running and checkpoints(root) - before else None

    return wait_until("run in the middle of training", check, 150, log)


def test_a_scheduled_run_survives_a_server_restart_and_one_that_dies_with_it_is_crashed_then_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "prefect-home"
    home.mkdir()
    # The server's scheduler makes a deployment's cron runs when it wakes, every 60 s by default: the first run would
    # start a minute or two after `trainflow deploy`, instead of at the next minute's start. (The server reads it from
    # this process's environment.)
    monkeypatch.setenv("PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS", "5")
    server = PrefectServer(home).start()
    root = make_project(tmp_path / "proj", TRAINING)
    env = server.env() | {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    log = tmp_path / "serve.log"
    serve_cmd = [str(BIN / "trainflow"), "deploy", "--cron", "* * * * *"]
    serve = spawn(serve_cmd, root, env, log)
    try:
        # 1. The server alone goes away for 20 s while a scheduled run trains.
        first = training(server, root, set(), log)
        server.kill()
        time.sleep(20)
        server.start()

        def ended(run_id: Any) -> Any:
            return next((r for r in runs(server) if r.id == run_id and r.state.is_final()), None)

        done = wait_until("end of the first run", lambda: ended(first.id), 240, log)
        assert done.state_name == "Completed", f"{done.state_name}: {done.state.message}\n{tail(log)}"
        registered = read_json(root / "reports/registration.json")["version"]

        # 2. Another change to train on; the server and the serving process die together in the middle of it.
        before = checkpoints(root)
        write_overrides(root / "params.yaml", ["train.lr=0.001"])
        second = training(server, root, before, log)
        written = sorted(int(name[5:]) for name in checkpoints(root) - before)
        kill(serve)  # with its flow-run subprocess
        server.kill()
        server.start()
        serve = spawn(serve_cmd, root, env, log)

        def next_completed() -> Any:
            later = [r for r in runs(server) if r.start_time and r.start_time > second.start_time]
            return next((r for r in later if r.state_name == "Completed"), None)

        resumed = wait_until("completed run after the restart", next_completed, 300, log)
        crashed = next(r for r in runs(server) if r.id == second.id)
        assert crashed.state_name == "Crashed", f"{crashed.state_name}: {crashed.state.message}"
        assert "ended while the run was Running, without reporting" in crashed.state.message
        assert f"Found by flow run {resumed.name!r}" in crashed.state.message
        train_run = read_json(root / "reports/train_run.json")  # how the run went (not part of the model)
        assert train_run["resumed_from_update"] >= written[-1] > 0, train_run  # not from scratch
        assert read_json(root / "reports/registration.json")["version"] == registered + 1
        assert "resumed from" in tail(log, 200_000)
        status = subprocess.run([str(BIN / "dvc"), "status"], cwd=root, capture_output=True, text=True)
        assert "up to date" in status.stdout, status.stdout + status.stderr
    finally:
        stop(serve)
        server.stop()
