"""Acceptance: the pipeline as a scheduled deployment on a real Prefect server.

`trainflow deploy` serves training_pipeline/nightly with a cron schedule; a run triggered through the API completes,
publishes its artifacts, pushes to the DVC remote and leaves the pipeline's outputs; Ctrl-C stops serving with exit
code 130. Then prefect.yaml deploys the same flow to a process work pool and a worker runs it. Every process started
here runs in its own session and is killed with its children at teardown (tests/support/servers.py).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from support.projects import FAST, REPO, make_project
from support.servers import BIN, PrefectServer, prefect_server, spawn, stop, tail

from trainflow.core.io import read_json
from trainflow.core.paths import Paths

pytestmark = pytest.mark.slow

ARTIFACT_KEYS = {"training-metrics", "mlflow-run", "registry-decision", "model-card"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    with prefect_server(tmp_path_factory.mktemp("prefect-home")) as running:
        yield running


@dataclass
class Project:
    root: Path
    remote: Path
    env: dict[str, str]  # the server's, plus this project's MLflow store


@pytest.fixture(scope="module")
def project(server: PrefectServer, tmp_path_factory: pytest.TempPathFactory) -> Project:
    base = tmp_path_factory.mktemp("deployed")
    root = make_project(base / "proj", {"data.source": "builtin:iris", "register.model_name": "iris", **FAST})
    remote = base / "dvc-remote"
    subprocess.run(["dvc", "remote", "add", "-d", "store", str(remote)], cwd=root, check=True)
    return Project(root, remote, {**server.env(), "MLFLOW_TRACKING_URI": f"sqlite:///{base / 'mlflow.db'}"})


def client(server: PrefectServer) -> Any:
    from prefect.client.orchestration import SyncPrefectClient

    return SyncPrefectClient(server.url)  # this server, whatever Prefect settings this test process has


def wait_for(what: str, check: Any, timeout_s: float, log: Path) -> Any:
    deadline = time.monotonic() + timeout_s
    while (value := check()) is None:
        assert time.monotonic() < deadline, f"no {what} after {timeout_s} s; log:\n{tail(log)}"
        time.sleep(0.5)
    return value


def run_to_the_end(server: PrefectServer, deployment_id: UUID, log: Path, start_worker: Any = None) -> Any:
    """Start a run of the deployment as `prefect deployment run` does; wait until it is final."""
    with client(server) as c:
        run = c.create_flow_run_from_deployment(deployment_id)
        if start_worker:
            start_worker()

        def final() -> Any:
            state = c.read_flow_run(run.id).state
            return state if state and state.is_final() else None

        state = wait_for("final state of the flow run", final, 300, log)
        assert state.is_completed(), f"flow run ended {state.name}: {state.message}\n{tail(log)}"
        artifacts = c.read_artifacts(artifact_filter=artifact_filter(run.id))
    return {a.key: a for a in artifacts}


def artifact_filter(flow_run_id: UUID) -> Any:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    return ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))


def test_trainflow_deploy_serves_a_scheduled_deployment_that_runs_the_pipeline(
    server: PrefectServer, project: Project
) -> None:
    log = project.root.parent / "serve.log"
    cmd = [str(BIN / "trainflow"), "deploy", "--cron", "15 4 * * 1-5"]
    # Prefect's runner asks for runs to start every 10 s by default: the one made below would wait up to that long.
    serve = spawn(cmd, project.root, {**project.env, "PREFECT_RUNNER_POLL_FREQUENCY": "1"}, log)
    try:

        def deployment() -> Any:
            assert serve.poll() is None, f"trainflow deploy exited {serve.returncode}:\n{tail(log)}"
            with client(server) as c, contextlib.suppress(Exception):
                return c.read_deployment_by_name("training_pipeline/nightly")
            return None

        dep = wait_for("deployment training_pipeline/nightly", deployment, 90, log)
        [schedule] = dep.schedules
        assert (schedule.schedule.cron, schedule.schedule.timezone, schedule.active) == ("15 4 * * 1-5", "UTC", True)
        assert dep.parameters == {"root": str(project.root)}

        artifacts = run_to_the_end(server, dep.id, log)
        assert set(artifacts) == ARTIFACT_KEYS
        assert "| **accuracy** (gate, higher is better) |" in artifacts["training-metrics"].data
        paths = Paths(project.root)
        assert read_json(paths.registration)["decision"] in artifacts["registry-decision"].data
        assert artifacts["model-card"].data == (paths.reports / "card.md").read_text()
        assert read_json(paths.metrics)["n_test"] > 0
        assert read_json(paths.registration)["version"] == 1
        assert any(p.is_file() for p in project.remote.rglob("*")), "DVC outputs were not pushed to the remote"
        from dvc.repo import Repo

        with Repo(str(project.root)) as repo:
            assert repo.status() == {}

        serve.send_signal(signal.SIGINT)  # Ctrl-C
        assert serve.wait(60) == 130, tail(log)
        assert "stopped serving training_pipeline/nightly" in tail(log)
        with client(server) as c:
            assert c.read_deployment(dep.id).paused  # no runs pile up as Late while nothing serves them
    finally:
        stop(serve)


def test_prefect_yaml_deploys_to_a_process_pool_that_a_worker_runs(server: PrefectServer, project: Project) -> None:
    """The README's team setup: work pool, `prefect deploy --all`, a worker. The worker starts elsewhere; the pull
    step takes the flow run to the repo. The pipeline is up to date by now (or runs here), and the artifacts are
    published from the existing reports either way."""
    for rel in ("flows", "tasks", "prefect.yaml"):  # what a checkout of the repo has beside the pipeline
        src, dest = REPO / rel, project.root / rel
        if src.is_dir():
            shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
        else:
            shutil.copy2(src, dest)
    log = project.root.parent / "worker.log"

    def prefect(*args: str) -> None:
        proc = subprocess.run([str(BIN / "prefect"), *args], cwd=project.root, env=project.env, capture_output=True)
        assert proc.returncode == 0, (proc.stdout + proc.stderr).decode(errors="replace")

    prefect("work-pool", "create", "trainflow-pool", "--type", "process", "--overwrite")
    prefect("--no-prompt", "deploy", "--all")
    with client(server) as c:
        dep = c.read_deployment_by_name("training_pipeline/nightly")
    assert dep.work_pool_name == "trainflow-pool"
    assert dep.pull_steps == [{"prefect.deployments.steps.set_working_directory": {"directory": str(project.root)}}]
    assert [(s.schedule.cron, s.schedule.timezone) for s in dep.schedules] == [("0 3 * * *", "UTC")]

    workers: list[subprocess.Popen[bytes]] = []
    worker_cmd = [str(BIN / "prefect"), "worker", "start", "--pool", "trainflow-pool", "--run-once"]
    try:
        start = lambda: workers.append(spawn(worker_cmd, server.home, project.env, log))  # noqa: E731
        artifacts = run_to_the_end(server, dep.id, log, start_worker=start)
        assert set(artifacts) == ARTIFACT_KEYS
        assert workers[0].wait(60) == 0, tail(log)
    finally:
        for w in workers:
            stop(w)
