"""register: a new MLflow registry version with lineage tags; `champion` moves only if the gate metric improves on
the same test data (an older champion is re-scored on this run's test split when that split has changed)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from trainflow import card, lineage, registry, tracking, why
from trainflow.data import stream
from trainflow.data.schema import Schema
from trainflow.data.split import ASSIGNMENT, TEST_ROWS
from trainflow.errors import ServiceError, UserError
from trainflow.gate import Scored, Slicing
from trainflow.io import read_json, sha256_files, write_json
from trainflow.params import PipelineParams
from trainflow.paths import Paths
from trainflow.predict import ExportedModel


def rescorer(params: PipelineParams, paths: Paths) -> registry.Rescore:
    """models:/name/version -> that version's metrics on this project's test split, measured as evaluate does."""

    def rescore(model_uri: str) -> tuple[dict[str, float], Scored]:
        from trainflow import predict

        return scored(predict.load(model_uri), params, paths)  # the registered pyfunc, loaded from code: no pickle

    return rescore


def scored(exported: ExportedModel, params: PipelineParams, paths: Paths) -> tuple[dict[str, float], Scored]:
    """A model's metrics and per-row outputs on this project's test split, measured as evaluate measures them."""
    from trainflow.stages.evaluate import score_split

    metrics, outputs, labels = score_split(exported, paths, "register", params.evaluate.batch_size, params.data)
    return metrics, Scored(np.asarray(labels), np.asarray(outputs))


def split_generations(paths: Paths) -> tuple[int | None, np.ndarray | None]:
    """(the split assignment's generation, the generation each test row arrived in), where the split saved them (not
    a time split's, nor one made before they were saved)."""
    import pyarrow.parquet as pq

    assignment, rows = paths.splits / ASSIGNMENT, paths.splits / TEST_ROWS
    if not (assignment.is_file() and rows.is_file()):
        return None, None
    metadata = pq.read_schema(assignment).metadata or {}
    generation = int(metadata[b"generation"]) if b"generation" in metadata else None
    return generation, pq.read_table(rows).column("since").to_numpy()


def logged_model(params: PipelineParams, paths: Paths, train_run: dict[str, Any]) -> tuple[str, str]:
    """(run id, models:/ URI) of the trained model in MLflow, logged as register.flavor. Train logs the default flavour
    (package). When tracking was down during train, the model was not logged (and perhaps no run started), and train
    never logs another flavour: log it now — into the run that already holds this model (an earlier attempt of
    register, or train's), else into train's run, else into a new one — so retries never log one model twice."""
    flavor = params.register.flavor
    if flavor == "package" and train_run.get("model_uri") and train_run.get("run_id"):
        return str(train_run["run_id"]), str(train_run["model_uri"])
    from mlflow.tracking import MlflowClient

    experiment_id = tracking.ensure_experiment(params.tracking.experiment, paths.root)
    found = tracking.run_of_model(experiment_id, paths.final, flavor)
    if found is not None and found[1] is not None:
        return found[0], found[1]
    run_id = found[0] if found else train_run.get("run_id")
    if not run_id:
        tags = {
            "trainflow.data_sha256": read_json(paths.final / "training.json")["data_sha256"],
            tracking.MODEL_HASH_TAG: tracking.model_hash(paths.final),  # found by a retry, should this one fail
            "trainflow.logged_by": "register (tracking was down during train)",
        }
        run_id = MlflowClient().create_run(experiment_id, tags=tags).info.run_id
    model_uri = tracking.log_pyfunc(str(run_id), paths.final, stream.head(paths.split("val"), 5), flavor)
    why = "tracking was down during train" if flavor == "package" else "register.flavor code: models-from-code"
    print(f"register: logged the model to MLflow run {run_id} ({why})", file=sys.stderr)
    return str(run_id), model_uri


def run(params: PipelineParams, paths: Paths) -> dict[str, Any]:
    for needed in (paths.metrics, paths.train_run, paths.split("test")):
        if not needed.exists():
            raise UserError(f"register: {needed} is missing; run the split, train and evaluate stages first")
    metrics = read_json(paths.metrics)
    train_run = read_json(paths.train_run)
    commit, dirty = lineage.git_commit(paths.root)
    training = read_json(paths.final / "training.json")
    schema = Schema.read(paths.split_schema)
    tags = {
        **params.register.tags,  # e.g. the sweep trial the params came from (trainflow tune --apply)
        "target": schema.target,
        "task": schema.task,
        "git_commit": commit,
        "git_dirty": str(dirty).lower(),
        "data_hash": lineage.dvc_out_hash(paths.root, "split", "data/splits"),
        "data_sha256": training["data_sha256"],
        "params_hash": lineage.params_hash(params.model_dump()),
        registry.MODEL_TAG: tracking.model_hash(paths.final),  # a retrain to the same bytes registers no version
        registry.FLAVOR_TAG: params.register.flavor,  # ... unless it is stored another way
    }
    # The paired gate compares this model and the champion row by row: this one's outputs, scored as evaluate did.
    # This model's outputs on the test rows, scored as evaluate did: the paired gate compares them with the champion's
    # row by row, and the model card's intervals are bootstraps of them.
    outputs = scored(ExportedModel.load(paths.final), params, paths)[1]
    challenger = outputs if params.register.decide == "paired" else None
    slicing = Slicing(*split_generations(paths), schema.classes if schema.task == "classification" else None)
    sources = paths.processed / why.SOURCES  # what ingest read: rows and hash per file
    files = read_json(sources) if sources.is_file() else None
    if files is not None:
        tags[why.DATA_TAG] = why.data_tag(files)
    uri = tracking.configure(paths.root)
    try:
        run_id, model_uri = logged_model(params, paths, train_run)
        reason = why_this_run(params, paths, files, commit, dirty, run_id)
        result = registry.register(
            model_uri,
            run_id,
            params.register,
            metrics,
            {**tags, "mlflow_run_id": run_id},
            test_hash=sha256_files(paths.split("test").files()),
            rescore=rescorer(params, paths),
            challenger=challenger,
            seed=params.seed,
            slicing=slicing,
        )
    except (UserError, ServiceError):  # a ServiceError from the registry names what failed already
        raise
    except Exception as exc:
        if not tracking.unavailable(exc):
            raise
        raise ServiceError(
            f"register: the MLflow tracking store at {uri} did not answer ({type(exc).__name__}: {exc}). Nothing was "
            "lost: the trained model and its metrics are in models/final and reports/. Rerun `trainflow stage "
            "register` (or `dvc repro`, `trainflow run`) once the server answers; a model version is never "
            "registered twice."
        ) from exc
    result["why"] = reason
    print(f"register: why this run ran: {reason['summary']}", file=sys.stderr)
    cards = card.write(paths, result, metrics, outputs, params.seed)
    try:
        from mlflow.tracking import MlflowClient

        # with the version's run (this run's, or, when no new version was made, the version's own): `trainflow
        # models show` reads it there
        version_run = str(result["tags"].get("mlflow_run_id") or run_id)
        for path in cards:
            MlflowClient().log_artifact(version_run, str(path), "card")
    except Exception as exc:
        if not tracking.unavailable(exc):
            raise
        raise ServiceError(
            f"register: the MLflow tracking store at {uri} did not answer while the model card was logged "
            f"({type(exc).__name__}: {exc}); the version is registered. Rerun `trainflow stage register`."
        ) from exc
    write_json(paths.registration, result)
    return result


def why_this_run(
    params: PipelineParams, paths: Paths, files: dict[str, Any] | None, commit: str, dirty: bool, run_id: str
) -> dict[str, Any]:
    """What changed since the champion this run's model would replace (trainflow.why), also tagged on the training
    run (`trainflow.why`) so the MLflow UI says it beside the run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    name = params.register.model_name
    champion = registry.current_champion(client, name)
    then = None
    if champion is not None and champion.run_id:
        run = registry.lookup(lambda: client.get_run(champion.run_id), f"reading the run of champion {name!r}")
        then = dict(run.data.params) if run is not None else None
    now = {k: str(v) for k, v in tracking.flatten(params.model_dump()).items()}
    reason = why.explain(paths.root, champion, then, files, now, commit, dirty)
    registry.lookup(lambda: client.set_tag(run_id, "trainflow.why", reason["summary"][:5000]), "tagging the run")
    return reason
