"""Flow runs left Running by a process that died, ended as Crashed by the next run of the same workspace.

A flow run whose process is SIGKILLed, or whose machine goes down with the Prefect server (a redeploy, a reboot),
never reports its end, and Prefect shows it Running forever. Each training_pipeline run tags itself with its
workspace and its process (trainflow.core.workspace); a later run of the workspace, once it holds the workspace, looks
for Running runs with the same workspace tag whose process is gone and sets them Crashed, with a message saying so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainflow.core import processes

WORKSPACE_PREFIX = "trainflow-workspace:"
PROCESS_PREFIX = "trainflow-process:"


def claim(client: Any, flow_run: Any, root: Path) -> None:
    """Tag `flow_run` (this process's) with its workspace and process."""
    tags = [t for t in flow_run.tags if not t.startswith((WORKSPACE_PREFIX, PROCESS_PREFIX))]
    tags += [WORKSPACE_PREFIX + processes.workspace_tag(root), PROCESS_PREFIX + processes.process_tag()]
    client.update_flow_run(flow_run.id, tags=tags)


def crash_orphans(client: Any, current: Any, root: Path) -> list[Any]:
    """Set Crashed every other Running flow run tagged with this workspace whose process is gone; returns them."""
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        FlowRunFilterTags,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    running = client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            tags=FlowRunFilterTags(all_=[WORKSPACE_PREFIX + processes.workspace_tag(root)]),
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING])),
        )
    )
    crashed = []
    for run in running:
        process = next((t.removeprefix(PROCESS_PREFIX) for t in run.tags if t.startswith(PROCESS_PREFIX)), "")
        if run.id == current.id or processes.process_alive(process) is not False:
            continue
        message = (
            f"Its process ({process}) ended while the run was Running, without reporting (killed, or its machine "
            f"went down). Found by flow run {current.name!r} of the same workspace, which carries on from what it "
            "left: outputs DVC recorded, and the newest checkpoint."
        )
        client.set_flow_run_state(run.id, Crashed(message=message), force=True)
        crashed.append(run)
    return crashed
