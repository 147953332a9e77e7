"""Scheduled retraining: `trainflow deploy` serves training_pipeline as a deployment with a cron schedule, and a
trigger on the event `trainflow data add` emits (deploy.on_new_data), so a new data file retrains it too.

Serving registers the deployment `training_pipeline/<deploy.name>` on a Prefect server and runs each of its flow runs
(scheduled, or started with `prefect deployment run`) in a subprocess of this one, until interrupted. Teams with
workers use prefect.yaml instead (a process work pool); both read their schedule from the `deploy` params.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from trainflow.core.errors import UserError
from trainflow.core.paths import Paths
from trainflow.params import DeployParams, read_raw, validate

NO_SERVER = """trainflow deploy needs a Prefect server: schedules fire only on a server that keeps running, and \
PREFECT_API_URL is not set (Prefect's local mode starts a temporary server per process, which never schedules). \
Start one, point Prefect at it and rerun:

    prefect server start --host 127.0.0.1 --port 4200     # in another terminal, or as a service
    prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api
    trainflow deploy"""


def deploy_params(paths: Paths, **flags: str | None) -> DeployParams:
    """The `deploy` section of params.yaml with the command line's --cron/--name/--timezone on top, validated like
    params.yaml (an invalid --cron is reported as deploy.cron). Nothing is written: no stage reads these."""
    raw = read_raw(paths.params)
    section = dict(raw.get("deploy") or {})
    section.update({k: v for k, v in flags.items() if v is not None})
    raw["deploy"] = section
    given = [f"--{k}" for k, v in flags.items() if v is not None]
    return validate(raw, str(paths.params) + (f" with {', '.join(given)}" if given else "")).deploy


def api_url() -> str:
    """PREFECT_API_URL (environment or Prefect profile), checked to answer; a UserError saying what to start if not."""
    from prefect.client.orchestration import get_client
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if not url:
        raise UserError(NO_SERVER)
    with get_client(sync_client=True) as client:
        problem = client.api_healthcheck()
    if problem is not None:
        raise UserError(
            f"the Prefect server at PREFECT_API_URL={url} does not answer ({problem}); start it with "
            "`prefect server start`, or point PREFECT_API_URL at a running one"
        )
    return str(url)


def serve_kwargs(root: Path, deploy: DeployParams) -> dict[str, Any]:
    """Keyword arguments for Runner.add_flow: the deployment's name, schedule and the project it runs in."""
    from prefect.deployments.runner import EntrypointType
    from prefect.events import DeploymentEventTrigger
    from prefect.schedules import Cron

    from trainflow.data import arrival

    parameters = {"root": str(root.resolve())}
    triggers = [
        DeploymentEventTrigger(
            name=f"trainflow-{deploy.name}-on-new-data",
            description="Retrain when `trainflow data add` reports a new data file",
            expect={arrival.EVENT},
            match={"prefect.resource.id": arrival.resource_id(deploy.name)},
            parameters=parameters,
        )
    ]
    return {
        "name": deploy.name,
        "schedules": [Cron(deploy.cron, timezone=deploy.timezone)],
        "parameters": parameters,
        "triggers": triggers if deploy.on_new_data else [],
        "description": f"Retrain the trainflow pipeline in {root.resolve()} ({deploy.cron}, {deploy.timezone}"
        + (", and when new data lands)." if deploy.on_new_data else ")."),
        "tags": ["trainflow"],
        # Recorded as flows.training_pipeline.training_pipeline, not a path relative to wherever this was started.
        "entrypoint_type": EntrypointType.MODULE_PATH,
    }


def serve(paths: Paths, cron: str | None = None, name: str | None = None, timezone: str | None = None) -> int:
    """Register the deployment and run its flow runs until interrupted; returns the CLI's exit code (130 on Ctrl-C).

    One flow run at a time (`limit=1`): DVC allows one process per workspace, so a run started while another is
    going waits for it. On shutdown the schedule is paused (Prefect's default), so no runs pile up as Late while
    nothing serves them; the next `trainflow deploy` resumes it.
    """
    deploy = deploy_params(paths, cron=cron, name=name, timezone=timezone)
    url = api_url()
    from prefect.runner import Runner

    from flows.training_pipeline import training_pipeline

    runner = Runner(name=f"trainflow-{deploy.name}", limit=1, pause_on_shutdown=True)
    runner.add_flow(training_pipeline, **serve_kwargs(paths.root, deploy))
    full_name = f"{training_pipeline.name}/{deploy.name}"
    on_data = "  new data:    trainflow data add FILE  (its event starts a run)\n" if deploy.on_new_data else ""
    print(
        f"trainflow: serving {full_name} from {url}, cron '{deploy.cron}' ({deploy.timezone}), project {paths.root}\n"
        f"  run it now:  prefect deployment run {full_name}\n{on_data}"
        "  Ctrl-C stops serving (and pauses the schedule)",
        flush=True,
    )
    try:
        asyncio.run(runner.start())
    except KeyboardInterrupt:
        print(f"trainflow: stopped serving {full_name}; its schedule is paused until the next `trainflow deploy`")
        return 130
    return 0
