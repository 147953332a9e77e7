"""The sweep flow: `trainflow tune` as a Prefect flow.

Ingest and split run first as in training_pipeline (only if DVC sees them changed, then committed). The trials then
fan out, all claiming from the study's storage (trainflow.tune.study):

- locally: one `trial` task per trial left, `tune.workers` at a time, each a worker process that claims and runs
  one trial (a process each: torch's global RNG and threads are per process, not per Prefect thread);
- on many machines (`deployment` set): `tune.workers` flow runs of the `tune_worker` deployment on a work pool
  (prefect.yaml), each claiming trials until none is left. The study's storage must then be a database every worker
  reaches (tune.storage: postgresql://...), the project at the same path, and MLflow a tracking server.

Then the results are written to reports/tune/ (and --apply's params.yaml change, with `apply`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

from prefect import flow, get_run_logger, task
from prefect.task_runners import ThreadPoolTaskRunner

from tasks import dvc
from tasks.ingest import ingest
from tasks.split import split
from trainflow import tune
from trainflow.core.errors import ParamsError
from trainflow.core.paths import Paths
from trainflow.params import PipelineParams, load_params
from trainflow.tune import runs as tune_runs
from trainflow.tune import study as tune_study


@task(name="trial")
def trial(root: str, params: dict[str, Any], budget: int) -> int:
    """Claim one trial of the study and run it (or resume one a killed worker left) in a worker process."""
    spec = json.dumps({"root": root, "params": params, "budget": budget, "max_trials": 1})
    done = subprocess.run(
        [sys.executable, "-m", "trainflow.tune.worker"], input=spec, text=True, capture_output=True, cwd=root
    )
    sys.stderr.write(done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"the trial's worker exited with {done.returncode}: {done.stderr.strip()[-2000:]}")
    ran: int = json.loads(done.stdout.strip().splitlines()[-1])["trials_run"]
    return ran


@flow(name="trials")
def run_trials(root: str, params: dict[str, Any], budget: int, count: int) -> int:
    """`count` trial tasks, as many at a time as the task runner's workers (the sweep sets tune.workers)."""
    futures = [trial.submit(root, params, budget) for _ in range(count)]
    return sum(f.result() for f in futures)


@flow(name="tune_worker")
def tune_worker(root: str = ".", overrides: list[str] | None = None, trials: int | None = None) -> int:
    """A worker on any machine of a work pool: claims and runs trials of the study until none is left."""
    paths = Paths(Path(root).resolve())
    params = _params(paths, overrides or [])
    if params.tune.backend != "optuna":
        raise ParamsError("params.yaml", [("tune.backend", "a work-pool worker runs Optuna trials: set it to optuna")])
    return tune.work(params, paths.root, trials or params.tune.trials, *tune_study.hashes(params, paths))


@flow(name="sweep")
def sweep(
    root: str = ".",
    overrides: list[str] | None = None,
    trials: int | None = None,
    workers: int | None = None,
    deployment: str | None = None,
    apply: bool = False,
) -> dict[str, Any]:
    """Run the study of params.yaml's tune: section (with -S style `overrides`) to its budget; see the module doc."""
    from trainflow.tune import results
    from trainflow.tune.study import open_study

    logger = get_run_logger()
    project = Path(root).resolve()
    paths = Paths(project)
    tune.check_overrides(overrides or [])
    for stage_task in (ingest, split):
        if dvc.changed(project, stage_task.name):
            stage_task(str(project))
            dvc.commit(project, stage_task.name)
    params = _params(paths, overrides or [])
    tune.check(params, paths)
    if params.tune.backend == "ray":  # Ray schedules its own trials (locally, or on the cluster of RAY_ADDRESS)
        if deployment:
            raise ParamsError("params.yaml", [("tune.backend", "ray runs on a Ray cluster, not a Prefect work pool: "
                                               "leave out deployment, or set tune.backend: optuna")])  # fmt: skip
        return tune.run(params, paths, trials=trials, workers=workers, apply=apply)
    budget, workers = trials or params.tune.trials, workers or params.tune.workers
    data, code = tune_study.hashes(params, paths)
    s = open_study(params, project, budget, data, code, on_create=tune_runs.parent_run(params, project))
    left = budget - s.terminal()
    logger.info("study %s: %d of %d trials left, %d at a time", s.name, left, budget, workers)
    if deployment:
        _on_work_pool(deployment, str(project), overrides or [], budget, workers)
    elif left:
        runner: Any = ThreadPoolTaskRunner(max_workers=workers)  # (its generic type trips mypy)
        fan_out = run_trials.with_options(task_runner=runner)
        fan_out(str(project), params.model_dump(mode="json"), budget, left)
    top = results.write(s, paths.reports / "tune")
    if s.terminal() == budget:
        tune_runs.finish_parent(s, top)
    summary: dict[str, Any] = {"study": s.name, "ended": s.terminal(), "trials": budget, "best": top}
    if apply and top is not None:
        summary["applied"] = results.apply(top, paths.params)
    return summary


def _params(paths: Paths, overrides: list[str]) -> PipelineParams:
    from trainflow.params import with_values

    return with_values(load_params(paths.params, overrides), {"train.progress": False}, "sweep")


def _on_work_pool(deployment: str, root: str, overrides: list[str], budget: int, workers: int) -> None:
    """`workers` flow runs of the tune_worker deployment, started together; waits until all have ended."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import FlowRun
    from prefect.deployments import run_deployment

    parameters = {"root": root, "overrides": overrides, "trials": budget}
    ids = [cast(FlowRun, run_deployment(deployment, parameters=parameters, timeout=0)).id for _ in range(workers)]
    with get_client(sync_client=True) as client:
        while True:
            states = [client.read_flow_run(i).state for i in ids]
            if all(st is not None and st.is_final() for st in states):
                break
            time.sleep(5)
    failed = [str(i) for i, st in zip(ids, states) if st is None or not st.is_completed()]
    if failed:
        raise RuntimeError(f"tune_worker flow run(s) {failed} did not complete; rerun the sweep to resume their trials")
