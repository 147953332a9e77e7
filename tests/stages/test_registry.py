"""Registry decisions: the challenger alias, the gate on the same test data (re-scoring the champion when the test
split changed), keeping the champion when it cannot be re-scored, and one champion under concurrent registrations."""

from __future__ import annotations

import contextlib
import shutil
import threading
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import blobs, retrain

from trainflow import registry
from trainflow.io import read_json, write_json
from trainflow.params import RegisterParams, load_params
from trainflow.paths import Paths
from trainflow.predict import ExportedModel
from trainflow.stages import STAGES, run_stage
from trainflow.stages.evaluate import score


def run_all(root: Path, stages: tuple[str, ...] = STAGES) -> None:
    paths = Paths(root)
    for stage in stages:
        run_stage(stage, load_params(paths.params), paths)


def aliases(name: str) -> dict[str, str]:
    from mlflow.tracking import MlflowClient

    return {alias: str(v) for alias, v in MlflowClient().get_registered_model(name).aliases.items()}


def test_every_version_is_challenger_and_a_worse_one_leaves_the_champion(csv_project: Path) -> None:
    run_all(csv_project)
    paths = Paths(csv_project)
    first = read_json(paths.registration)
    assert first["champion"] is True and first["previous_champion"] is None
    assert aliases("blobs") == {"champion": "1", "challenger": "1"}

    metrics = read_json(paths.metrics)
    retrain(csv_project, seed=1)  # a new training run: a new version
    write_json(paths.metrics, {**metrics, "accuracy": metrics["accuracy"] - 0.05})
    run_all(csv_project, ("register",))
    reg = read_json(paths.registration)
    assert aliases("blobs") == {"champion": "1", "challenger": "2"}
    assert reg["champion"] is False and reg["champion_version"] == 1
    assert reg["rescored"] is False  # same test split: the champion's own tagged metrics are compared
    assert reg["previous_metrics"] == {k: float(v) for k, v in metrics.items()}
    assert reg["previous_value"] == metrics["accuracy"]
    assert "does not beat champion version 1" in reg["decision"]

    from mlflow.tracking import MlflowClient

    tags = MlflowClient().get_model_version("blobs", "2").tags
    assert tags["registry_decision"] == reg["decision"]
    assert tags["test_data_hash"] == first["tags"]["test_data_hash"] == reg["tags"]["test_data_hash"]
    for key in ("git_commit", "data_hash", "params_hash", "mlflow_run_id", "metric.accuracy"):
        assert tags[key], key


def test_a_changed_test_split_rescores_the_champion_first(csv_project: Path) -> None:
    run_all(csv_project)
    paths = Paths(csv_project)
    old_model = csv_project.parent / "v1_model"
    shutil.copytree(paths.final, old_model)
    old_hash = read_json(paths.registration)["tags"]["test_data_hash"]
    old_n_test = read_json(paths.metrics)["n_test"]

    # New data arrives: the test split grows (old test rows keep their split), so its hash changes.
    grown = pd.concat([blobs(), blobs(n=120, seed=1)], ignore_index=True)
    grown.to_csv(csv_project / "data/raw/blobs.csv", index=False)
    run_all(csv_project)
    reg = read_json(paths.registration)
    assert reg["tags"]["test_data_hash"] != old_hash
    assert reg["rescored"] is True and reg["previous_champion"] == 1, reg["decision"]
    # The champion was scored exactly as evaluate scores, on the new test split.
    test = pd.read_parquet(paths.split_file("test"))
    expected, _ = score(ExportedModel.load(old_model), test, "test", 1024)
    assert reg["previous_metrics"] == expected
    assert reg["previous_metrics"]["n_test"] == len(test) > old_n_test
    assert "re-scored on the new test split" in reg["decision"]


def test_a_champion_that_cannot_be_rescored_stays(csv_project: Path) -> None:
    run_all(csv_project)
    paths = Paths(csv_project)
    test = pd.read_parquet(paths.split_file("test"))
    test.iloc[:-1].to_parquet(paths.split_file("test"), index=False)  # a different test split...
    shutil.rmtree(csv_project / "mlartifacts")  # ...and the champion's files are gone
    metrics = read_json(paths.metrics)
    retrain(csv_project, seed=1)
    write_json(paths.metrics, {**metrics, "accuracy": metrics["accuracy"] + 0.5})  # a "better" challenger
    run_all(csv_project, ("register",))
    reg = read_json(paths.registration)
    assert reg["champion"] is False and reg["champion_version"] == 1
    assert "could not be re-scored" in reg["decision"]
    assert aliases("blobs") == {"champion": "1", "challenger": "2"}


def _register_twice_at_once(
    paths: Paths, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[dict[str, Any]], list[BaseException]]:
    """Two registrations in two threads that both read the champion at the same moment, unless a lock keeps them
    apart (then the barrier times out and the second reads the champion after the first has set it)."""
    from mlflow.tracking import MlflowClient

    from trainflow import tracking

    tracking.configure(paths.root)
    metrics = read_json(paths.metrics)
    # Two training runs (a run registers at most one version): the trained model, logged once more in a new run.
    example = pd.read_parquet(paths.split_file("val")).head(5)
    experiment = tracking.ensure_experiment("trainflow", paths.root)
    runs = [read_json(paths.train_run)["run_id"], MlflowClient().create_run(experiment).info.run_id]
    models = [read_json(paths.train_run)["model_uri"], tracking.log_pyfunc(runs[1], paths.final, example)]
    barrier = threading.Barrier(2, timeout=3)
    read_champion = registry.current_champion

    def in_step(client: Any, name: str) -> Any:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait()
        return read_champion(client, name)

    monkeypatch.setattr(registry, "current_champion", in_step)
    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            results.append(
                registry.register(
                    models[i],
                    runs[i],
                    RegisterParams(model_name="race"),
                    metrics,
                    {},
                    test_hash="h",
                    rescore=lambda _: {},
                )  # fmt: skip
            )
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results, errors


def test_two_registrations_at_once_leave_exactly_one_champion(
    csv_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_all(csv_project, ("ingest", "split", "train", "evaluate"))
    results, errors = _register_twice_at_once(Paths(csv_project), monkeypatch)
    assert not errors, errors
    assert sorted(r["version"] for r in results) == [1, 2]
    winners = [r for r in results if r["champion"]]
    assert len(winners) == 1
    assert aliases("race")["champion"] == str(winners[0]["version"])
    loser = next(r for r in results if not r["champion"])
    assert loser["previous_champion"] == winners[0]["version"]


def test_without_the_lock_the_race_is_lost(csv_project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race above is real: with the lock removed, both registrations see no champion and both claim it, or
    MLflow itself fails on the simultaneous alias writes (seen about one run in three)."""
    run_all(csv_project, ("ingest", "split", "train", "evaluate"))
    monkeypatch.setattr(registry, "registry_lock", lambda _uri: contextlib.nullcontext())
    results, errors = _register_twice_at_once(Paths(csv_project), monkeypatch)
    assert errors or [r["champion"] for r in results] == [True, True]


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("sqlite:////srv/mlflow/mlflow.db", "/srv/mlflow/mlflow.db.registry.lock"),
        ("sqlite:///mlflow.db", "mlflow.db.registry.lock"),
        ("file:///srv/mlruns", "/srv/mlruns/.registry.lock"),
        ("/srv/mlruns", "/srv/mlruns/.registry.lock"),
    ],
)
def test_the_lock_lives_beside_the_store(uri: str, expected: str) -> None:
    assert str(registry.lock_path(uri)) == expected
    assert registry.lock_path("http://mlflow:5000").name.startswith("trainflow-registry-")
