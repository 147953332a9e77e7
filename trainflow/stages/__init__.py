"""The five stages. Each is a typed function of (validated params, paths) -> summary dict; the CLI, dvc.yaml and the
Prefect tasks are thin shells around these functions."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainflow.params import PipelineParams
    from trainflow.paths import Paths

STAGES = ("ingest", "split", "train", "evaluate", "register")


def run_stage(name: str, params: PipelineParams, paths: Paths, **options: Any) -> dict[str, Any]:
    """Run one stage by name: the single entry the CLI and the Prefect tasks share. `options`: the stage's own
    keyword arguments (ingest: accept_schema)."""
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; stages are {', '.join(STAGES)}")
    module = importlib.import_module(f"trainflow.stages.{name}")
    result: dict[str, Any] = module.run(params, paths, **options)
    return result
