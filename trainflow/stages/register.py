"""register: a new MLflow registry version with lineage tags; `champion` moves only if the gate metric improves."""

from __future__ import annotations

from typing import Any

from trainflow import lineage, registry, tracking
from trainflow.errors import UserError
from trainflow.io import read_json, write_json
from trainflow.params import PipelineParams
from trainflow.paths import Paths


def run(params: PipelineParams, paths: Paths) -> dict[str, Any]:
    for needed in (paths.metrics, paths.train_run):
        if not needed.is_file():
            raise UserError(f"register: {needed} is missing; run the train and evaluate stages first")
    metrics = read_json(paths.metrics)
    train_run = read_json(paths.train_run)
    commit, dirty = lineage.git_commit(paths.root)
    training = read_json(paths.final / "training.json")
    tags = {
        "git_commit": commit,
        "git_dirty": str(dirty).lower(),
        "data_hash": lineage.dvc_out_hash(paths.root, "split", "data/splits"),
        "data_sha256": training["data_sha256"],
        "params_hash": lineage.params_hash(params.model_dump()),
        "mlflow_run_id": train_run["run_id"],
    }
    tracking.configure(paths.root)
    result = registry.register(train_run["model_uri"], params.register, metrics, tags)
    write_json(paths.registration, result)
    return result
