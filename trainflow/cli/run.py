"""`trainflow run`: the whole pipeline through the Prefect flow, each stage only if DVC sees it changed, then its
summary; a run with nothing to do answers without starting Prefect (and still pushes to the DVC remote). params.yaml
already holds the -S overrides (overrides.py)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from trainflow.core.errors import Preempted, ServiceError, UserError
from trainflow.stages import STAGES

if TYPE_CHECKING:
    from trainflow.core.paths import Paths


def command(args: argparse.Namespace, paths: Paths) -> int:
    from trainflow.stages.report import summary

    if prefect_api_url() is None:
        from tasks import dvc

        if not dvc.changed_stages(paths.root):
            # Nothing to run: answer quickly, without starting Prefect's local server, which would take most of the
            # time (benchmarks/noop-run.md). On a Prefect server the flow runs anyway,
            # so every run is recorded there.
            push_unchanged(paths)
            print(summary(paths, {stage: {"skipped": True} for stage in STAGES}))
            return 0
        from flows.local_server import start_temporary_server

        start_temporary_server()  # Prefect's local mode, with a server that cannot outlive this run
    from flows.training_pipeline import training_pipeline
    from tasks.train import PREEMPTED_STATE

    state = training_pipeline(root=str(paths.root), caller_reports_errors=True, return_state=True)
    if state.name == PREEMPTED_STATE:  # checkpointed, resumable
        raise Preempted(state.message or "train: preempted")
    results = state.result()  # a stage's error is raised here, as the flow raised it
    assert isinstance(results, dict)
    print(summary(paths, results))
    return 0


def prefect_api_url() -> str | None:
    """PREFECT_API_URL from the environment or the active Prefect profile, read without importing Prefect (slow)."""
    if url := os.environ.get("PREFECT_API_URL"):
        return url
    import tomllib

    home = Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
    try:
        profiles = tomllib.loads((home / "profiles.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return None
    active = os.environ.get("PREFECT_PROFILE") or profiles.get("active", "local")
    url = profiles.get("profiles", {}).get(active, {}).get("PREFECT_API_URL")
    return str(url) if url else None


def push_unchanged(paths: Paths) -> None:
    """deploy.push for a run with nothing to do: the outputs may still be missing from the remote (a push that
    failed last time), and pushing what is there costs little."""
    from tasks import dvc
    from trainflow.params import load_params

    if not load_params(paths.params).deploy.push:
        return
    remote = dvc.default_remote(paths.root)
    if remote is None:
        return
    try:
        sent = dvc.push(paths.root, remote)
    except UserError:
        raise  # a full remote (DiskFullError) says so itself
    except Exception as exc:  # noqa: BLE001 - any failure of the remote: say which, and that nothing is lost
        raise ServiceError(
            f"push to DVC remote {remote!r} failed ({type(exc).__name__}: {exc}); the outputs are intact here: "
            "rerun `trainflow run` (or `dvc push`) once the remote answers"
        ) from exc
    print(f"[trainflow] push: {sent} file(s) sent to DVC remote {remote!r}", flush=True)
