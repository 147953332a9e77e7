"""The training_pipeline flow: the five stage tasks in order, each run only when DVC sees it as changed.

After each stage runs, its outputs are committed to DVC, so `dvc status` stays clean and `dvc repro` is a no-op after
a flow run, and a later flow run over an unchanged pipeline recomputes nothing. Then the run publishes its reports as
Prefect artifacts (also when every stage was up to date) and pushes the DVC outputs to the default remote
(`deploy.push`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.client.schemas.objects import State
from prefect.states import Crashed

from flows import interrupts, orphans
from tasks import dvc
from tasks.evaluate import evaluate
from tasks.ingest import ingest
from tasks.push import push
from tasks.register import register
from tasks.split import split
from tasks.train import PREEMPTED_STATE, train
from trainflow.core import workspace
from trainflow.core.io import failpoint
from trainflow.core.paths import Paths
from trainflow.params import load_params
from trainflow.stages import report

STAGE_TASKS = (ingest, split, train, evaluate, register)


@flow(name="training_pipeline")
def training_pipeline(root: str = ".", caller_reports_errors: bool = False) -> dict[str, Any] | State:
    """Run ingest → split → train → evaluate → register in the project at `root`; returns each stage's summary, or,
    when training was preempted, a Crashed state named Preempted, which the flow run ends in (tasks/train.py).

    `caller_reports_errors`: the caller (the CLI) prints a failing stage's error itself, in one paragraph, so Prefect's
    own traceback of the same exception is silenced. Set here because Prefect configures its loggers at flow start.
    """
    if caller_reports_errors:
        for name in ("prefect.task_runs", "prefect.flow_runs"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    logger = get_run_logger()
    project = Path(root).resolve()
    results: dict[str, Any] = {}
    with workspace.hold(project, "the training_pipeline flow"):  # a deployment's run too (the CLI holds it already)
        end_orphaned_runs(project)
        for stage_task in STAGE_TASKS:
            name = stage_task.name
            if not dvc.changed(project, name):
                logger.info("%s: up to date, skipped", name)
                print(f"[trainflow] {name}: up to date, skipped", flush=True)
                results[name] = {"skipped": True}
                continue
            print(f"[trainflow] {name}: running", flush=True)
            results[name] = stage_task(str(project))
            if isinstance(results[name], State):  # train preempted: checkpointed, nothing to commit; a rerun resumes
                message = results[name].message or f"{name}: preempted"
                logger.warning("%s", message)
                print(f"[trainflow] {name}: preempted; rerun to resume", flush=True)
                # The flow run ends Preempted too (type Crashed), not Failed: a state of its own (the task's would
                # make it Failed, as a flow returning a task's unfinished state is).
                return Crashed(name=PREEMPTED_STATE, message=message)
            failpoint(f"commit-{name}")
            dvc.commit(project, name)
            interrupts.between_stages()  # `trainflow run` told to stop while the stage finished: stop, it is recorded
        publish_artifacts(Paths(project))
        if load_params(Paths(project).params).deploy.push:
            push_outputs(project)
    return results


def end_orphaned_runs(project: Path) -> None:
    """Tag this flow run with its workspace and process, and end as Crashed the runs of the workspace that a dead
    process left Running (flows/orphans.py). Bookkeeping: a failure is logged, never fails the run."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    logger = get_run_logger()
    try:
        with get_client(sync_client=True) as client:
            current = client.read_flow_run(flow_run.id)
            orphans.claim(client, current, project)
            for run in orphans.crash_orphans(client, current, project):
                message = f"flow run {run.name!r} was left Running by a process that died: set Crashed"
                logger.warning(message)
                print(f"[trainflow] {message}", flush=True)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        logger.warning("could not look for runs left Running by a dead process: %r", exc)


def publish_artifacts(paths: Paths) -> None:
    """The run's metrics beside the champion's, its MLflow run and the registry decision, as markdown artifacts.

    Built from the reports on disk, so a run that found everything up to date shows the same. A failure here is
    logged, not raised: the model is trained and registered by now, and observability must not fail the run.
    """
    from prefect.artifacts import create_markdown_artifact

    logger = get_run_logger()
    try:
        artifacts = report.artifacts(paths)
    except Exception as exc:  # noqa: BLE001 - see the docstring (e.g. a report written by an older trainflow)
        logger.warning("could not build the artifacts from %s: %r", paths.reports, exc)
        return
    for artifact in artifacts:
        try:
            create_markdown_artifact(markdown=artifact.markdown, key=artifact.key, description=artifact.description)
        except Exception as exc:  # noqa: BLE001 - see the docstring
            logger.warning("could not publish the %s artifact: %s", artifact.key, exc)


def push_outputs(project: Path) -> None:
    """Push what dvc.lock records to DVC's default remote, so another machine can `dvc pull` this run's outputs."""
    logger = get_run_logger()
    remote = dvc.default_remote(project)
    if remote is None:
        message = "push: no default DVC remote, skipped (set one with `dvc remote add -d NAME URL`)"
        logger.info(message)
        print(f"[trainflow] {message}", flush=True)
        return
    pushed = push(str(project), remote)
    message = f"push: {pushed['files_pushed']} file(s) sent to DVC remote {remote!r}"
    logger.info(message)
    print(f"[trainflow] {message}", flush=True)
