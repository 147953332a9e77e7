"""register: a new MLflow registry version with lineage tags; `champion` moves only if the gate metric improves on
the same test data (an older champion is re-scored on this run's test split when that split has changed)."""

from __future__ import annotations

from typing import Any

from trainflow import lineage, registry, tracking
from trainflow.errors import UserError
from trainflow.io import read_json, sha256_files, write_json
from trainflow.params import PipelineParams
from trainflow.paths import Paths


def rescorer(params: PipelineParams, paths: Paths) -> registry.Rescore:
    """models:/name/version -> that version's metrics on this project's test split, measured as evaluate does."""

    def rescore(model_uri: str) -> dict[str, float]:
        from trainflow import predict
        from trainflow.stages.evaluate import read_test, score

        exported = predict.load(model_uri)  # the registered pyfunc, loaded from code: nothing unpickled
        test = read_test(paths, "register")
        metrics, _ = score(exported, test, str(paths.split_file("test")), params.evaluate.batch_size)
        return metrics

    return rescore


def run(params: PipelineParams, paths: Paths) -> dict[str, Any]:
    test_file = paths.split_file("test")
    for needed in (paths.metrics, paths.train_run, test_file):
        if not needed.is_file():
            raise UserError(f"register: {needed} is missing; run the split, train and evaluate stages first")
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
    result = registry.register(
        train_run["model_uri"],
        params.register,
        metrics,
        tags,
        test_hash=sha256_files([test_file]),
        rescore=rescorer(params, paths),
    )
    write_json(paths.registration, result)
    return result
