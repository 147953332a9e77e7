"""A team's Prefect (issue 46): a Prefect server on PostgreSQL, one process work pool, and a worker in each of two
workspaces (as on two teammates' machines: B a git clone of A), both serving the pool.

prefect.yaml's deployment, deployed from A and again from B, stays one deployment with one schedule and one trigger,
and its cron's runs are not doubled. Its scheduled runs (two of the cron's, made due now) run on a worker of either
workspace: the first on whichever polls first, the second, once that worker is stopped, on the other. Each completes,
each is submitted once, and the server records which worker submitted it (its `prefect.worker.submitted-flow-run`
event) and the pool and queue it came from. Wherever its worker started, a run runs in the workspace whose `prefect
deploy` came last: the pull step records that directory (prefect.yaml), and on one machine it exists for both.

Needs PostgreSQL's server binaries, psycopg2 and asyncpg (Prefect's driver for PostgreSQL); skipped, saying which is
missing, otherwise.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.projects import FAST, REPO, make_project
from support.servers import BIN, PrefectServer, spawn, stop, tail
from support.team import DATABASES, need_module, postgres
from support.vcs import git

from flows.orphans import WORKSPACE_PREFIX
from trainflow.core import processes

pytestmark = pytest.mark.slow

POOL, DEPLOYMENT = "trainflow-pool", "training_pipeline/nightly"
SETTINGS = {"data.source": "builtin:iris", "register.model_name": "iris", **FAST}
# What only the server's process gets: its database, and a scheduler that makes the cron's runs 2 s after a deploy
# (every 60 s by default).
SERVER_ONLY = ("PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS")


@dataclass
class PostgresPrefectServer(PrefectServer):
    """support.servers.PrefectServer with its database in PostgreSQL (`database`: a postgresql+asyncpg URL)."""

    database: str = ""

    def _env(self, base: dict[str, str] | None) -> dict[str, str]:
        values = (self.database, "2")
        return {**super()._env(base), **dict(zip(SERVER_ONLY, values, strict=True))}

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        return {k: v for k, v in super().env(base).items() if k not in SERVER_ONLY}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PostgresPrefectServer]:
    need_module("asyncpg")
    with postgres(tmp_path / "postgres") as db:
        url = db.create_database(DATABASES[1]).replace("postgresql+psycopg2://", "postgresql+asyncpg://")
        (tmp_path / "prefect-home").mkdir()
        running = PostgresPrefectServer(tmp_path / "prefect-home", database=url)
        try:
            running.start(timeout_s=240)  # its migrations, on a fresh database
            yield running
        finally:
            running.stop()


def workspaces(base: Path) -> tuple[Path, Path]:
    """A: the pipeline with what a checkout of the repo has beside it (flows, tasks, prefect.yaml, .gitignore),
    committed; B: a git clone of A."""
    a = make_project(base / "a", SETTINGS)
    for rel in ("flows", "tasks", "prefect.yaml", ".gitignore"):
        src, dest = REPO / rel, a / rel
        if src.is_dir():
            shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest)
    git(a, "add", "-A")
    git(a, "commit", "-qm", "the flows and their deployment")
    git(base, "clone", "-q", str(a), str(base / "b"))
    return a, base / "b"


def client(server: PrefectServer) -> Any:
    from prefect.client.orchestration import SyncPrefectClient

    return SyncPrefectClient(server.url)


def wait_for(what: str, check: Any, timeout_s: float, *logs: Path) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"no {what} after {timeout_s:g} s; logs:\n" + "\n".join(map(tail, logs))
        time.sleep(0.5)
    return value


def prefect(root: Path, env: dict[str, str], *args: str) -> None:
    proc = subprocess.run([str(BIN / "prefect"), *args], cwd=root, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"prefect {' '.join(args)} in {root.name}:\n{proc.stdout}{proc.stderr}"


def cron_runs(server: PrefectServer, deployment_id: Any) -> list[Any]:
    """The deployment's runs the scheduler made from its cron, still to run."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.objects import StateType

    with client(server) as c:
        runs = c.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))
    return [r for r in runs if r.auto_scheduled and r.state_type == StateType.SCHEDULED]


def deployed(server: PrefectServer) -> tuple[Any, list[Any]]:
    """The deployment, and the automations of its triggers."""
    with client(server) as c:
        dep = c.read_deployment_by_name(DEPLOYMENT)
        return dep, c.read_resource_related_automations(f"prefect.deployment.{dep.id}")


def submitted_by(server: PrefectServer, flow_run_id: Any) -> list[str]:
    """The workers that submitted the flow run, by name (their `prefect.worker.submitted-flow-run` events)."""
    from prefect.events.filters import EventFilter, EventNameFilter, EventRelatedFilter

    wanted = EventFilter(
        event=EventNameFilter(name=["prefect.worker.submitted-flow-run"]),
        related=EventRelatedFilter(id=[f"prefect.flow-run.{flow_run_id}"]),
    )
    with client(server) as c:
        return [e.resource.name or "" for e in c.read_events(wanted, limit=50).events]


def run_the_next_cron_run(server: PrefectServer, deployment_id: Any, logs: list[Path]) -> Any:
    """Make the deployment's next run of the cron due now; wait until it ends, Completed; return it."""
    from prefect.states import Scheduled
    from prefect.types._datetime import now

    run = min(cron_runs(server, deployment_id), key=lambda r: r.expected_start_time)
    with client(server) as c:
        c.set_flow_run_state(run.id, Scheduled(scheduled_time=now("UTC")), force=True)

        def final() -> Any:
            state = c.read_flow_run(run.id).state
            return state if state is not None and state.is_final() else None

        state = wait_for("final state of the flow run", final, 300, *logs)
        assert state.is_completed(), f"{state.name}: {state.message}\n" + "\n".join(map(tail, logs))
        return c.read_flow_run(run.id)


def test_a_deployment_from_two_workspaces_runs_on_a_worker_of_either_and_its_schedule_is_not_doubled(
    server: PostgresPrefectServer, tmp_path: Path
) -> None:
    from prefect.client.schemas.objects import WorkerStatus

    a, b = workspaces(tmp_path)
    env = server.env()  # and MLFLOW_TRACKING_URI: this test's store, the team's (tests/conftest.py)

    # Deployed from A, then again from B (each teammate runs `prefect deploy --all`).
    prefect(a, env, "work-pool", "create", POOL, "--type", "process")
    prefect(a, env, "--no-prompt", "deploy", "--all")
    first, triggers = deployed(server)
    assert [(s.schedule.cron, s.schedule.timezone, s.active) for s in first.schedules] == [("0 3 * * *", "UTC", True)]
    assert len(triggers) == 1
    made = wait_for("runs of the cron", lambda: cron_runs(server, first.id), 60, server.log)
    prefect(b, env, "--no-prompt", "deploy", "--all")
    dep, triggers = deployed(server)
    assert dep.id == first.id and dep.work_pool_name == POOL
    assert [(s.schedule.cron, s.schedule.timezone, s.active) for s in dep.schedules] == [("0 3 * * *", "UTC", True)]
    assert len(triggers) == 1, [t.name for t in triggers]
    # The pull step now names B: the directory every run of the deployment runs in, whichever worker starts it.
    assert dep.pull_steps == [{"prefect.deployments.steps.set_working_directory": {"directory": str(b)}}]
    wait_for("the cron's runs again", lambda: len(cron_runs(server, dep.id)) >= len(made), 60, server.log)
    for _ in range(3):  # over three of the scheduler's rounds
        times = [r.expected_start_time for r in cron_runs(server, dep.id)]
        assert len(times) == len(set(times)), "the cron's runs were doubled"
        assert all(t.hour == 3 and t.minute == 0 for t in times)
        time.sleep(2)

    # A worker in each workspace, both serving the pool.
    worker_env = {**env, "PREFECT_WORKER_QUERY_SECONDS": "2"}
    workers: dict[str, subprocess.Popen[bytes]] = {}
    logs = {name: tmp_path / f"worker-{name}.log" for name in ("a", "b")}
    try:
        for name, root in (("a", a), ("b", b)):
            cmd = [str(BIN / "prefect"), "worker", "start", "--pool", POOL, "--name", f"team-{name}"]
            workers[name] = spawn(cmd, root, worker_env, logs[name])

        def online() -> bool:
            with client(server) as c:
                found = c.read_workers_for_work_pool(POOL)
            return {w.name for w in found if w.status == WorkerStatus.ONLINE} == {"team-a", "team-b"}

        wait_for("both workers online", online, 120, *logs.values())

        ran: list[str] = []
        done_ids = []
        for _ in range(2):
            done = run_the_next_cron_run(server, dep.id, list(logs.values()))
            done_ids.append(done.id)
            assert (done.work_pool_name, done.work_queue_name, done.run_count) == (POOL, "default", 1)
            assert WORKSPACE_PREFIX + processes.workspace_tag(b) in done.tags  # where the pull step took it
            [worker] = wait_for("its worker's event", functools.partial(submitted_by, server, done.id), 60, server.log)
            ran.append(worker)
            stop(workers[worker.removeprefix("team-")])  # the next run has the other worker only
        assert sorted(ran) == ["team-a", "team-b"], ran
    finally:
        for proc in workers.values():
            stop(proc)

    with client(server) as c:
        others = [r for r in c.read_flow_runs() if r.state_name not in ("Scheduled", "Late")]
    assert sorted(r.id for r in others) == sorted(done_ids), [(r.name, r.state_name) for r in others]
    assert [submitted_by(server, run_id) for run_id in done_ids] == [[worker] for worker in ran]  # each once
    assert (b / "reports/registration.json").is_file() and not (a / "reports").exists()
