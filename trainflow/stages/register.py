"""register: a new MLflow registry version with lineage tags; `champion` moves only if the gate metric improves on
the same test data (an older champion is re-scored on this run's test split when that split has changed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from trainflow import tracking as mlflow_tracking  # `tracking` is the stage's params section
from trainflow.artifacts.predict import ExportedModel
from trainflow.core import outage
from trainflow.core.errors import ServiceError, UserError
from trainflow.core.io import read_json, sha256_files, write_json
from trainflow.core.paths import SPLITS, Paths
from trainflow.data import stream
from trainflow.data.schema import Schema
from trainflow.data.split import ASSIGNMENT, Assignment, Held, TestRows, time_order
from trainflow.data.stream import Split
from trainflow.params import DataParams, EvaluateParams, ModelParams, RegisterParams, SplitParams, TrackingParams
from trainflow.registry import card, changes, lineage, registry
from trainflow.registry.gate import Scored, Slicing

# dvc.yaml lists what the stage reads (tests/contracts/test_stage_params.py); the rest, with why no rerun is needed:
PARAMS = ("register", "evaluate.batch_size", "seed", "split.time_column")
READS_UNLISTED = {
    "data.memory_budget_mb": "how the test split is read to re-score the champion (whole or a block at a time), not "
    "what: the same outputs bit for bit",
    "tracking.experiment": "where the model is logged when train could not: nothing reruns for it",
    "model.code": "which files count as the model's code in the version's code_dirty tag; changing it retrains "
    "(train lists model), and so reruns register",
}
LOGS_PARAMS = True  # the params whole, as `logged`: the version's params tag (what `trainflow verify` retrains from)


def rescorer(paths: Paths, batch_size: int, data: DataParams) -> registry.Rescore:
    """models:/name/version -> that version's metrics on this project's test split, measured as evaluate does."""

    def rescore(model_uri: str) -> tuple[dict[str, float], Scored]:
        from trainflow.artifacts import predict

        return scored(predict.load(model_uri), paths, batch_size, data)  # the pyfunc, loaded from code: no pickle

    return rescore


def scored(exported: ExportedModel, paths: Paths, batch_size: int, data: DataParams) -> tuple[dict[str, float], Scored]:
    """A model's metrics and per-row outputs on this project's test split, measured as evaluate measures them."""
    from trainflow.stages.evaluate import score_split

    metrics, outputs, labels = score_split(exported, paths, "register", batch_size, data)
    return metrics, Scored(np.asarray(labels), np.asarray(outputs))


def slicing(paths: Paths, schema: Schema, time_column: str | None) -> Slicing:
    """This split's test rows for the gate: the tags that record their split in the version (its assignment's lineage
    and generation, or a time split's column), and, from a champion's tags, which of them its own split held."""
    rows = TestRows.read(paths.splits)
    column = time_column
    if column is not None and rows.settings is None:  # a time split: no assignment, each test row by its time
        rows = TestRows.by_time(column, Split.stored(paths.splits, "test").column(column))
    tags = {registry.LINEAGE_TAG: rows.lineage} if rows.lineage else {}
    if rows.generation is not None:
        tags[registry.GENERATION_TAG] = str(rows.generation)

    def held(champion: dict[str, str]) -> Held:
        generation = champion.get(registry.GENERATION_TAG, "")
        lineage_of = champion.get(registry.LINEAGE_TAG)
        stored = CachedSplits(paths, champion.get("data_hash"))
        return rows.held_by(lineage_of, int(generation) if generation.isdigit() else None, stored)

    return Slicing(schema.classes if schema.task == "classification" else None, tags, held)


class CachedSplits:
    """A version's splits in the project's DVC cache, found by its `data_hash` tag (DVC's hash of data/splits: a
    listing of its files' md5s, each file stored under its md5, once `dvc commit` or the register stage stored them).
    What the gate asks of the champion's split (split.Stored); None for what is not there or cannot be read."""

    def __init__(self, paths: Paths, dir_hash: str | None) -> None:
        self.files: dict[str, Path] = {}
        cache = paths.root / ".dvc" / "cache" / "files" / "md5"  # DVC 3's default cache, as verify reads it
        if dir_hash and dir_hash.endswith(".dir"):
            try:
                listing = json.loads((cache / dir_hash[:2] / dir_hash[2:]).read_text())
                self.files = {e["relpath"]: cache / e["md5"][:2] / e["md5"][2:] for e in listing}
            except (OSError, ValueError, KeyError, TypeError):
                pass

    def _file(self, name: str) -> Path | None:
        path = self.files.get(name)
        return path if path is not None and path.is_file() else None

    def assignment(self) -> Assignment | None:
        path = self._file(ASSIGNMENT)
        try:
            return Assignment.read(path) if path is not None else None
        except Exception:  # noqa: BLE001 - a damaged file is as good as none: the gate then compares nothing
            return None

    def latest(self, column: str) -> Any | None:
        import pandas as pd
        import pyarrow.parquet as pq

        def read(path: Path) -> pd.Series:
            return pq.read_table(path, columns=[column]).column(0).to_pandas()

        table, which = self._file(stream.LINKED), self._file(stream.ROWS)
        try:
            if table is not None and which is not None:  # streamed: the linked table, a byte a row for its split
                split = np.load(which)
                parts = [read(table)[(split == SPLITS.index("train")) | (split == SPLITS.index("val"))]]
            else:
                parts = [read(p) for name in ("train", "val") if (p := self._file(f"{name}.parquet")) is not None]
            times = time_order(pd.concat(parts, ignore_index=True), column) if parts else None
        except Exception:  # noqa: BLE001 - unreadable: as if not there
            return None
        return times.max() if times is not None and len(times) else None


def logged_model(paths: Paths, train_run: dict[str, Any], flavor: str, experiment: str) -> tuple[str, str]:
    """(run id, models:/ URI) of the trained model in MLflow, logged as register.flavor. Train logs the default flavour
    (package). When tracking was down during train, the model was not logged (and perhaps no run started), and train
    never logs another flavour: log it now — into the run that already holds this model (an earlier attempt of
    register, or train's), else into train's run, else into a new one — so retries never log one model twice."""
    if flavor == "package" and train_run.get("model_uri") and train_run.get("run_id"):
        return str(train_run["run_id"]), str(train_run["model_uri"])
    from mlflow.tracking import MlflowClient

    experiment_id = mlflow_tracking.ensure_experiment(experiment, paths.root)
    found = mlflow_tracking.run_of_model(experiment_id, paths.final, flavor)
    if found is not None and found[1] is not None:
        return found[0], found[1]
    run_id = found[0] if found else train_run.get("run_id")
    if not run_id:
        tags = {
            "trainflow.data_sha256": read_json(paths.final / "training.json")["data_sha256"],
            mlflow_tracking.MODEL_HASH_TAG: mlflow_tracking.model_hash(
                paths.final
            ),  # found by a retry, should this one fail
            "trainflow.logged_by": "register (tracking was down during train)",
        }
        run_id = MlflowClient().create_run(experiment_id, tags=tags).info.run_id
    model_uri = mlflow_tracking.log_pyfunc(
        str(run_id), paths.final, stream.head(Split.stored(paths.splits, "val"), 5), flavor
    )
    why = "tracking was down during train" if flavor == "package" else "register.flavor code: models-from-code"
    print(f"register: logged the model to MLflow run {run_id} ({why})", file=sys.stderr)
    return str(run_id), model_uri


def run(
    paths: Paths,
    *,
    register: RegisterParams,
    evaluate: EvaluateParams,
    seed: int,
    split: SplitParams,
    data: DataParams,
    tracking: TrackingParams,
    model: ModelParams,
    logged: dict[str, Any],
) -> dict[str, Any]:
    for needed in (paths.metrics, paths.train_run, Split.stored(paths.splits, "test")):
        if not needed.exists():
            raise UserError(f"register: {needed} is missing; run the split, train and evaluate stages first")
    metrics = read_json(paths.metrics)
    train_run = read_json(paths.train_run)
    commit, dirty = lineage.git_commit(paths.root)
    training = read_json(paths.final / "training.json")
    schema = Schema.read(paths.split_schema)
    # What `trainflow verify` retrains from. The code: the commit, unless code_dirty (git_dirty counts params.yaml
    # too, which -S rewrites; the params are recorded whole). The data: DVC's hash of the splits present (not
    # dvc.lock's, which `trainflow stage` never updates), kept in DVC's cache; md5 of every split byte.
    code = lineage.code_changes(paths.root, model.code)
    data_hash, listing = lineage.dvc_dir_hash(paths.splits)
    lineage.cache_folder(paths.root, paths.splits, data_hash, listing)
    tags = {
        **register.tags,  # e.g. the sweep trial the params came from (trainflow tune --apply)
        "target": schema.target,
        "task": schema.task,
        "git_commit": commit,
        "git_dirty": str(dirty).lower(),
        "code_dirty": "unknown" if code is None else str(bool(code)).lower(),
        "data_hash": data_hash,
        "data_sha256": training["data_sha256"],
        "params_hash": lineage.params_hash(logged),
        "params": lineage.params_record(logged),
        **lineage.environment(str(training.get("device", "unknown"))),
        # a retrain to the same bytes registers no version
        registry.MODEL_TAG: mlflow_tracking.model_hash(paths.final),
        registry.FLAVOR_TAG: register.flavor,  # ... unless it is stored another way
    }
    if code:
        tags["code_changes"] = json.dumps(code[:50])
    # This model's outputs on the test rows, scored as evaluate did: the paired gate compares them with the champion's
    # row by row, and the model card's intervals are bootstraps of them.
    outputs = scored(ExportedModel.load(paths.final), paths, evaluate.batch_size, data)[1]
    sliced = slicing(paths, schema, split.time_column)
    sources = paths.processed / changes.SOURCES  # what ingest read: rows and hash per file
    files = read_json(sources) if sources.is_file() else None
    if files is not None:
        tags[changes.DATA_TAG] = changes.data_tag(files)
    uri = mlflow_tracking.configure(paths.root)
    try:
        run_id, model_uri = logged_model(paths, train_run, register.flavor, tracking.experiment)
        reason = why_this_run(paths, register.model_name, logged, files, commit, dirty, run_id)
        result = registry.register(
            model_uri,
            run_id,
            register,
            metrics,
            {**tags, "mlflow_run_id": run_id},
            test_hash=sha256_files(Split.stored(paths.splits, "test").files()),
            rescore=rescorer(paths, evaluate.batch_size, data),
            challenger=outputs,  # the point rule too, should rows the champion trained on be left out
            seed=seed,
            slicing=sliced,
        )
    except (UserError, ServiceError):  # a ServiceError from the registry names what failed already
        raise
    except Exception as exc:
        if not outage.unavailable(exc):
            raise
        raise ServiceError(
            f"register: the MLflow tracking store at {uri} did not answer ({type(exc).__name__}: {exc}). Nothing was "
            "lost: the trained model and its metrics are in models/final and reports/. Rerun `trainflow stage "
            "register` (or `dvc repro`, `trainflow run`) once the server answers; a model version is never "
            "registered twice."
        ) from exc
    result["why"] = reason
    print(f"register: why this run ran: {reason['summary']}", file=sys.stderr)
    cards = card.write(paths, result, metrics, outputs, seed)
    try:
        from mlflow.tracking import MlflowClient

        # with the version's run (this run's, or, when no new version was made, the version's own): `trainflow
        # models show` reads it there
        version_run = str(result["tags"].get("mlflow_run_id") or run_id)
        for path in cards:
            MlflowClient().log_artifact(version_run, str(path), "card")
    except Exception as exc:
        if not outage.unavailable(exc):
            raise
        raise ServiceError(
            f"register: the MLflow tracking store at {uri} did not answer while the model card was logged "
            f"({type(exc).__name__}: {exc}); the version is registered. Rerun `trainflow stage register`."
        ) from exc
    write_json(paths.registration, result)
    return result


def why_this_run(
    paths: Paths,
    name: str,
    logged: dict[str, Any],
    files: dict[str, Any] | None,
    commit: str,
    dirty: bool,
    run_id: str,
) -> dict[str, Any]:
    """What changed since the champion this run's model would replace (trainflow.registry.changes), also tagged on the
    training run (`trainflow.why`) so the MLflow UI says it beside the run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    champion = registry.current_champion(client, name)
    then = None
    if champion is not None and champion.run_id:
        run = registry.lookup(lambda: client.get_run(champion.run_id), f"reading the run of champion {name!r}")
        then = dict(run.data.params) if run is not None else None
    now = {k: str(v) for k, v in mlflow_tracking.flatten(logged).items()}
    reason = changes.explain(paths.root, champion, then, files, now, commit, dirty)
    registry.lookup(lambda: client.set_tag(run_id, "trainflow.why", reason["summary"][:5000]), "tagging the run")
    return reason
