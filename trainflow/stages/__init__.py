"""The five stages. Each is a typed function of (validated params, paths) -> summary dict; the CLI, dvc.yaml and the
Prefect tasks are thin shells around these functions."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainflow.core.paths import Paths
    from trainflow.params import PipelineParams

STAGES = ("ingest", "split", "train", "evaluate", "register")


def importable(root: Path) -> None:
    """Put the project root first on sys.path, so model.name `mymodels:Net` imports ./mymodels.py without
    PYTHONPATH, whatever directory the process started in."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))


def run_stage(name: str, params: PipelineParams, paths: Paths, **options: Any) -> dict[str, Any]:
    """Run one stage by name: the single entry the CLI and the Prefect tasks share. `options`: the stage's own
    keyword arguments (ingest: accept_schema)."""
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; stages are {', '.join(STAGES)}")
    importable(paths.root)
    module = importlib.import_module(f"trainflow.stages.{name}")
    result: dict[str, Any] = module.run(params, paths, **options)
    return result
