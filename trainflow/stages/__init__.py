"""The five stages. Each is `run(paths, *, <its params>) -> summary dict`: its keywords are the top-level params it
reads, declared in the module beside it (PARAMS: what its dvc.yaml `params:` lists; READS_UNLISTED: what it reads
that DVC must not rerun it for, each with the reason). `run_stage` picks them out of the whole params; the CLI,
dvc.yaml and the Prefect tasks are thin shells around it. tests/contracts/test_stage_params.py runs the stages with
params that record every field read, and checks both declarations against dvc.yaml and against the reads."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
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


def keywords(module: ModuleType) -> list[str]:
    """The top-level params a stage's `run` takes: the first part of each of its PARAMS and READS_UNLISTED."""
    names = [*module.PARAMS, *module.READS_UNLISTED]
    return list(dict.fromkeys(n.split(".")[0] for n in names))


def run_stage(name: str, params: PipelineParams, paths: Paths, **options: Any) -> dict[str, Any]:
    """Run one stage by name: the single entry the CLI and the Prefect tasks share. `options`: the stage's own
    keyword arguments (ingest: accept_schema). A stage that records the params (train logs them with its MLflow
    run, register tags them on the version for `trainflow verify`) also gets them whole as `logged`: JSON, never
    read to decide anything."""
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; stages are {', '.join(STAGES)}")
    importable(paths.root)
    module = importlib.import_module(f"trainflow.stages.{name}")
    if getattr(module, "LOGS_PARAMS", False):
        options["logged"] = params.model_dump(mode="json")
    result: dict[str, Any] = module.run(paths, **params.sections(keywords(module)), **options)
    return result
