"""Registry decisions: the challenger alias, the gate on the same test data (re-scoring the champion when the test
split changed, and deciding on the re-scored number), keeping the champion when it cannot be re-scored, one champion
under concurrent registrations, and no decision at all on a lookup or a re-score that failed for want of an answer."""

from __future__ import annotations

import contextlib
import errno
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from mlflow.exceptions import MlflowException, RestException
from mlflow.protos.databricks_pb2 import (
    ENDPOINT_NOT_FOUND,
    INVALID_PARAMETER_VALUE,
    RESOURCE_DOES_NOT_EXIST,
    TEMPORARILY_UNAVAILABLE,
)
from scipy.stats import binomtest
from support.projects import blobs, model_run, retrain
from support.splits import splitmix64_by_hand

from trainflow.artifacts.predict import ExportedModel
from trainflow.core import outage
from trainflow.core.errors import DiskFullError, ServiceError
from trainflow.core.io import read_json, write_json
from trainflow.core.paths import Paths
from trainflow.params import RegisterParams, load_params, write_overrides
from trainflow.registry import registry
from trainflow.stages import STAGES, run_stage
from trainflow.stages.evaluate import score


def run_all(root: Path, stages: tuple[str, ...] = STAGES) -> None:
    paths = Paths(root)
    for stage in stages:
        run_stage(stage, load_params(paths.params), paths)


def point_rule(root: Path) -> None:
    """register.decide: point, the rule these tests are about (metrics.json's value against the champion's)."""
    write_overrides(Paths(root).params, ["register.decide=point"])


def aliases(name: str) -> dict[str, str]:
    from mlflow.tracking import MlflowClient

    return {alias: str(v) for alias, v in MlflowClient().get_registered_model(name).aliases.items()}


def test_every_version_is_challenger_and_a_worse_one_leaves_the_champion(trained: Path) -> None:
    point_rule(trained)  # the accuracy below is made up: the point rule reads it, the paired one re-scores
    paths = Paths(trained)
    first = read_json(paths.registration)
    assert first["champion"] is True and first["previous_champion"] is None
    assert aliases("blobs") == {"champion": "1", "challenger": "1"}

    metrics = read_json(paths.metrics)
    retrain(trained, seed=1)  # a new training run: a new version
    write_json(paths.metrics, {**metrics, "accuracy": metrics["accuracy"] - 0.05})
    run_all(trained, ("register",))
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


def test_a_changed_test_split_rescores_the_champion_first(trained: Path) -> None:
    point_rule(trained)  # the rule that reads tags when the split is the same, and re-scores when it is not
    paths = Paths(trained)
    old_model = trained.parent / "v1_model"
    shutil.copytree(paths.final, old_model)
    old_hash = read_json(paths.registration)["tags"]["test_data_hash"]
    old_n_test = read_json(paths.metrics)["n_test"]

    # New data arrives: the test split grows (old test rows keep their split), so its hash changes.
    grown = pd.concat([blobs(), blobs(n=120, seed=1)], ignore_index=True)
    grown.to_csv(trained / "data/raw/blobs.csv", index=False)
    run_all(trained)
    reg = read_json(paths.registration)
    assert reg["tags"]["test_data_hash"] != old_hash
    assert reg["rescored"] is True and reg["previous_champion"] == 1, reg["decision"]
    # The champion was scored exactly as evaluate scores, on the new test split.
    test = pd.read_parquet(paths.split_file("test"))
    expected, _ = score(ExportedModel.load(old_model), test, "test", 1024)
    assert reg["previous_metrics"] == expected and reg["previous_value"] == expected["accuracy"]
    assert reg["previous_metrics"]["n_test"] == len(test) > old_n_test
    assert "re-scored on the new test split" in reg["decision"]
    assert reg["champion"] is (reg["value"] > expected["accuracy"])  # and the gate decided on it


def test_a_champion_that_cannot_be_rescored_stays(trained: Path) -> None:
    paths = Paths(trained)
    test = pd.read_parquet(paths.split_file("test"))
    test.iloc[:-1].to_parquet(paths.split_file("test"), index=False)  # a different test split...
    shutil.rmtree(trained / "mlartifacts")  # ...and the champion's files are gone
    metrics = read_json(paths.metrics)
    retrain(trained, seed=1)
    write_json(paths.metrics, {**metrics, "accuracy": metrics["accuracy"] + 0.5})  # a "better" challenger
    run_all(trained, ("register",))
    reg = read_json(paths.registration)
    assert reg["champion"] is False and reg["champion_version"] == 1
    assert "could not be re-scored" in reg["decision"]
    assert aliases("blobs") == {"champion": "1", "challenger": "2"}
    # The decision's advice, followed as written (with a reason): version 2 becomes champion, in the history.
    advice = re.search(r"run `trainflow (models promote 2 --name blobs) --reason \.\.\.`", reg["decision"])
    assert advice is not None, reg["decision"]
    from mlflow.tracking import MlflowClient

    from trainflow import cli

    assert cli.main([*advice.group(1).split(), "--reason", "re-scoring failed"]) == 0
    assert aliases("blobs") == {"champion": "2", "challenger": "2"}
    assert registry.champion_history(MlflowClient(), "blobs") == [1, 2]


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
    from mlflow.models import get_model_info

    outputs = get_model_info(models[1]).signature.outputs  # what predict returns: the prediction, each class's proba
    assert outputs is not None and "prediction" in outputs.input_names()
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
                    RegisterParams(model_name="race", decide="point"),
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


def test_two_registrations_at_once_leave_exactly_one_champion(trained: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results, errors = _register_twice_at_once(Paths(trained), monkeypatch)
    assert not errors, errors
    assert sorted(r["version"] for r in results) == [1, 2]
    winners = [r for r in results if r["champion"]]
    assert len(winners) == 1
    assert aliases("race")["champion"] == str(winners[0]["version"])
    loser = next(r for r in results if not r["champion"])
    assert loser["previous_champion"] == winners[0]["version"]


def test_without_the_lock_the_race_is_lost(trained: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race above is real: with the lock removed, both registrations see no champion and both claim it, or
    MLflow itself fails on the simultaneous alias writes (seen about one run in three)."""
    monkeypatch.setattr(registry, "registry_lock", lambda *_: contextlib.nullcontext())
    results, errors = _register_twice_at_once(Paths(trained), monkeypatch)
    assert errors or [r["champion"] for r in results] == [True, True]


# --- the gate after a re-score follows the re-scored number --------------------------------------------------------


def _relabel(test: pd.DataFrame, every: int) -> pd.DataFrame:
    """The test split with every `every`-th row's label moved to the next class: a harder test split (another hash),
    on which any model that was right before is now wrong on those rows."""
    classes = sorted(test["label"].unique())
    out = test.copy()
    rows = out.index[::every]
    out.loc[rows, "label"] = [classes[(classes.index(c) + 1) % len(classes)] for c in out.loc[rows, "label"]]
    return out


@pytest.mark.parametrize(
    ("champion_tag", "margin", "promoted"),
    [
        (1.0, +0.05, True),  # its tag (old split) would keep it; re-scored on the new split it loses
        (0.1, -0.05, False),  # its tag would lose; re-scored on the new split it wins
    ],
)
def test_the_gate_after_a_rescore_follows_the_rescored_metric(
    trained: Path, champion_tag: float, margin: float, promoted: bool
) -> None:
    point_rule(trained)  # the accuracy below is made up: the point rule reads it, the paired one re-scores
    from mlflow.tracking import MlflowClient

    paths = Paths(trained)
    old_model = trained.parent / "v1_model"
    shutil.copytree(paths.final, old_model)
    # The champion's tagged accuracy, as if measured on an older split; the gate must not look at it.
    MlflowClient().set_model_version_tag("blobs", "1", "metric.accuracy", repr(champion_tag))
    test = _relabel(pd.read_parquet(paths.split_file("test")), every=4)
    test.to_parquet(paths.split_file("test"), index=False)
    # The champion on the new split, scored independently of register (as evaluate scores).
    rescored, _ = score(ExportedModel.load(old_model), test, "test", 1024)
    metrics = read_json(paths.metrics)
    retrain(trained, seed=1)
    challenger = rescored["accuracy"] + margin
    assert (challenger > champion_tag) is not promoted  # the tag alone would decide the other way
    write_json(paths.metrics, {**metrics, "accuracy": challenger})
    run_all(trained, ("register",))

    reg = read_json(paths.registration)
    assert reg["rescored"] is True and reg["previous_champion"] == 1
    assert reg["previous_value"] == rescored["accuracy"] and reg["previous_metrics"] == rescored
    assert reg["champion"] is promoted, reg["decision"]
    assert aliases("blobs") == {"champion": "2" if promoted else "1", "challenger": "2"}
    assert f"{rescored['accuracy']:.6g} (re-scored on the new test split)" in reg["decision"]


# --- lookups that fail: only the registry saying "not found" means there is no champion ----------------------------
#
# A real SQLite registry (conftest's per-test URI) with champion version 1 of `m` at accuracy 0.99 on test split "h",
# made with the plain MLflow client. The failures are the ones MLflow 3.17 raises, measured: SqlAlchemyStore's locked
# database, a tracking server's 503 on every HTTP retry, a proxy's 404 page, a 503 in MLflow's JSON.

SERVICE_FAILURES = {
    "sqlite locked": lambda: MlflowException(
        "(sqlite3.OperationalError) database is locked", error_code=TEMPORARILY_UNAVAILABLE
    ),
    "503 on every retry": lambda: MlflowException(
        "API request to http://mlflow:5000/api/2.0/mlflow/registered-models/alias failed with exception "
        "HTTPConnectionPool(host='mlflow', port=5000): Max retries exceeded with url: /api/2.0/mlflow/registered-"
        "models/alias?name=m&alias=champion (Caused by ResponseError('too many 503 error responses'))"
    ),
    "a proxy's 404": lambda: MlflowException(
        "API request to endpoint /api/2.0/mlflow/registered-models/alias failed with error code 404 != 200. Response "
        "body: '<html>Not Found</html>'",
        error_code=ENDPOINT_NOT_FOUND,
    ),
    "503 json": lambda: RestException({"error_code": "TEMPORARILY_UNAVAILABLE", "message": "try again later"}),
}


class Registry:
    """The test's registry: this test's SQLite store (set first: mlflow keeps the last test's URI otherwise)."""

    def __init__(self, root: Path) -> None:
        from mlflow.tracking import MlflowClient

        from trainflow import tracking

        self.uri = tracking.configure(root)
        self.root = root
        self.client = MlflowClient()
        self.experiment = tracking.ensure_experiment("trainflow", root)

    def with_champion(self, accuracy: float = 0.99, test_hash: str = "h") -> Registry:
        run_id = model_run(self.client, self.experiment, self.root / "models")
        source = f"{self.client.get_run(run_id).info.artifact_uri}/model"
        tags = {"metric.accuracy": repr(accuracy), registry.TEST_HASH_TAG: test_hash}
        version = self.client.create_model_version("m", source, run_id=run_id, tags=tags).version
        self.client.set_registered_model_alias("m", registry.CHAMPION, version)
        return self

    def register(self, accuracy: float, run_id: str | None = None, **kwargs: Any) -> tuple[str, dict[str, Any]]:
        """Register a new run's model (or `run_id`'s again: a retry) at `accuracy`; the run id and registration."""
        run_id = run_id or model_run(self.client, self.experiment, self.root / "models")
        kwargs = {"test_hash": "h", "rescore": unexpected_rescore, **kwargs}
        params = RegisterParams(model_name="m", decide="point")  # the registry mechanics, on made-up accuracies
        return run_id, registry.register(f"runs:/{run_id}/model", run_id, params, {"accuracy": accuracy}, {}, **kwargs)

    def decided(self, version: str) -> bool:
        return registry.DECISION_TAG in self.client.get_model_version("m", version).tags


def unexpected_rescore(uri: str) -> dict[str, float]:
    raise AssertionError(f"{uri} re-scored, but the test split is the same")


@pytest.fixture
def reg(tmp_path: Path) -> Registry:
    registry_ = Registry(tmp_path)
    registry_.client.create_registered_model("m")
    return registry_.with_champion()


def failing(monkeypatch: pytest.MonkeyPatch, method: str, exc: Callable[[], Exception], times: int) -> list[int]:
    """MlflowClient.`method` raises exc() on its first `times` calls, then answers; returns the list of calls."""
    from mlflow.tracking import MlflowClient

    real = getattr(MlflowClient, method)
    calls: list[int] = []

    def flaky(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) <= times:
            raise exc()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, method, flaky)
    return calls


@pytest.mark.parametrize("failure", SERVICE_FAILURES)
def test_a_champion_lookup_that_fails_once_decides_nothing_and_the_retry_decides(
    reg: Registry, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    calls = failing(monkeypatch, "get_model_version_by_alias", SERVICE_FAILURES[failure], times=1)
    with pytest.raises(ServiceError) as failed:
        reg.register(0.50)
    assert f"looking up the champion of 'm': the MLflow tracking store at {reg.uri} did not answer" in str(failed.value)
    assert "nothing was decided" in str(failed.value) and "Rerun `trainflow stage register`" in str(failed.value)
    assert aliases("m") == {"champion": "1", "challenger": "2"} and not reg.decided("2")
    # The register task's retry (tasks/retry.py retries a ServiceError) runs it again: the registry answers now.
    from prefect.states import Failed

    from tasks.retry import retry_unless_user_error

    assert retry_unless_user_error(None, None, Failed(data=failed.value))
    run_id = reg.client.get_model_version("m", "2").run_id
    _, result = reg.register(0.50, run_id)
    assert len(calls) == 2
    assert result["version"] == 2 and result["champion"] is False and result["champion_version"] == 1
    assert result["previous_value"] == 0.99 and "does not beat champion version 1's 0.99" in result["decision"]
    assert aliases("m") == {"champion": "1", "challenger": "2"}
    assert sorted(int(v.version) for v in reg.client.search_model_versions("name='m'")) == [1, 2]


def test_a_champion_lookup_that_keeps_failing_never_decides(reg: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = failing(monkeypatch, "get_model_version_by_alias", SERVICE_FAILURES["503 on every retry"], times=99)
    run_id = None
    for _ in range(4):  # the first try and the register task's 3 retries
        with pytest.raises(ServiceError, match=f"MLflow tracking store at {re.escape(reg.uri)}"):
            reg.register(0.50, run_id)
        run_id = reg.client.get_model_version("m", "2").run_id  # the retries register the same run
    assert len(calls) == 4
    assert aliases("m") == {"champion": "1", "challenger": "2"} and not reg.decided("2")
    assert len(reg.client.search_model_versions("name='m'")) == 2  # the retries registered nothing more


def test_no_champion_alias_or_no_model_makes_the_first_champion(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    reg.client.create_registered_model("m")  # a model without a champion (its versions were deleted, say)
    _, first = reg.register(0.50)
    assert first["champion"] is True and first["decision"] == "version 1 is the first champion of m"
    assert aliases("m") == {"champion": "1", "challenger": "1"}
    reg.client.delete_registered_model("m")  # no model at all
    _, again = reg.register(0.50)
    assert again["champion"] is True and again["version"] == 1


def test_not_found_is_what_the_store_answers_for_a_missing_alias_model_or_version(reg: Registry) -> None:

    def raised(call: Callable[[], Any]) -> BaseException:
        with pytest.raises(MlflowException) as info:
            call()
        return info.value

    missing = [
        lambda: reg.client.get_model_version_by_alias("m", "nobody"),
        lambda: reg.client.get_model_version_by_alias("nothing", registry.CHAMPION),
        lambda: reg.client.get_registered_model("nothing"),
        lambda: reg.client.get_model_version("m", "7"),
        lambda: reg.client.get_model_version("nothing", "1"),
    ]
    for call in missing:
        assert outage.not_found(raised(call)) and not outage.unavailable(raised(call)), raised(call)
    for name, failure in SERVICE_FAILURES.items():
        assert not outage.not_found(failure()), name
        # Which failures register's own error calls "did not answer" (a proxy's 404 is a ServiceError all the same).
        assert outage.unavailable(failure()) is (name != "a proxy's 404"), name
    assert not outage.not_found(MlflowException("Parameter 'name' must be a string", INVALID_PARAMETER_VALUE))


@pytest.mark.parametrize(
    ("method", "action"),
    [
        ("get_registered_model", lambda: registry.list_versions("m")),  # was "no registered model 'm'"
        ("get_registered_model", lambda: registry.rollback("m", "why")),
        ("get_model_version", lambda: registry.promote("m", 1, "why")),  # was "m has no version 1"
        ("get_model_version_by_alias", lambda: registry.promote("m", 1, "why")),  # was "previous_champion": None
        ("get_model_version_by_alias", lambda: registry.rollback("m", "why")),  # was "m has no champion"
    ],
)
def test_the_models_commands_report_a_failed_lookup_as_such(
    reg: Registry, monkeypatch: pytest.MonkeyPatch, method: str, action: Callable[[], Any]
) -> None:
    failing(monkeypatch, method, SERVICE_FAILURES["sqlite locked"], times=1)
    with pytest.raises(ServiceError, match="Rerun the `trainflow models` command once it answers"):
        action()
    assert aliases("m") == {"champion": "1"}
    assert registry.CHANGE_TAG not in reg.client.get_model_version("m", "1").tags


def test_models_list_says_how_each_version_became_champion_and_nothing_for_the_others(reg: Registry) -> None:
    reg.register(0.50)  # version 2: does not beat the champion
    registry.promote("m", 2, "the fix for ticket 7")
    listed = {v["version"]: v["champion_change"] for v in registry.list_versions("m")}
    assert re.fullmatch(r"\S+ promoted by hand \(trainflow models promote\): the fix for ticket 7", listed[2]), listed
    assert listed[1] == ""  # champion before, by an alias alone: no record of how


def test_models_list_says_what_each_version_predicts_and_on_which_data(reg: Registry) -> None:
    reg.register(0.50)  # version 2
    for key, value in {"target": "species", "task": "classification", "data_hash": "d41d8cd98f00"}.items():
        reg.client.set_model_version_tag("m", "2", key, value)
    listed = {v["version"]: v for v in registry.list_versions("m")}
    assert {k: listed[2][k] for k in ("target", "task", "data_hash")} == {
        "target": "species",
        "task": "classification",
        "data_hash": "d41d8cd98f00",
    }
    assert {k: listed[1][k] for k in ("target", "task", "data_hash")} == {"target": "", "task": "", "data_hash": ""}


def test_a_register_retry_after_tracking_was_down_takes_the_model_an_earlier_attempt_logged(tmp_path: Path) -> None:
    """Train could not log the model (tracking was down); an earlier attempt of register logged it into a run of its
    own and then failed. The retry finds that run by the model's hash and logs nothing twice."""
    from trainflow import tracking
    from trainflow.stages.register import logged_model

    reg = Registry(tmp_path)
    paths = Paths(tmp_path)
    paths.final.mkdir(parents=True)
    (paths.final / "model.safetensors").write_bytes(b"the weights")
    (paths.final / "training.json").write_text("{}")
    train_run = reg.client.create_run(reg.experiment).info.run_id  # tracking failed before the model was logged
    tags = {tracking.MODEL_HASH_TAG: tracking.model_hash(paths.final), tracking.MODEL_URI_TAG: "models:/m-earlier"}
    earlier = reg.client.create_run(reg.experiment, tags=tags).info.run_id
    runs = len(reg.client.search_runs([reg.experiment]))
    found = logged_model(paths, {"run_id": train_run, "model_uri": None}, "package", "trainflow")
    assert found == (earlier, "models:/m-earlier")
    assert len(reg.client.search_runs([reg.experiment])) == runs


def test_a_rerun_after_the_decision_reports_a_failed_lookup_as_such(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, first = reg.register(0.50)
    assert first["champion"] is False
    failing(monkeypatch, "get_model_version_by_alias", SERVICE_FAILURES["sqlite locked"], times=1)
    with pytest.raises(ServiceError):  # was a registration.json saying there is no champion
        reg.register(0.50, run_id)
    assert reg.register(0.50, run_id)[1]["champion_version"] == 1


def _load_fails(monkeypatch: pytest.MonkeyPatch, exc: Callable[[], Exception]) -> registry.Rescore:
    """A rescore that loads the champion as register's does (predict.load), while downloading it raises exc(); the
    new version's files (register records their manifest) download."""
    import mlflow.artifacts

    from trainflow.artifacts import predict

    real = mlflow.artifacts.download_artifacts

    def download_artifacts(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("artifact_uri") != "models:/m/1":  # the champion, version 1
            return real(*args, **kwargs)
        raise exc()

    def rescore(uri: str) -> dict[str, float]:
        predict.load(uri)
        raise AssertionError("loading the champion was to fail")

    monkeypatch.setattr(mlflow.artifacts, "download_artifacts", download_artifacts)
    return rescore


@pytest.mark.parametrize(
    ("failure", "error"),
    [
        (SERVICE_FAILURES["503 on every retry"], ServiceError),
        (lambda: OSError(errno.ENOSPC, "No space left on device"), DiskFullError),
    ],
)
def test_an_outage_while_rescoring_the_champion_decides_nothing(
    reg: Registry, monkeypatch: pytest.MonkeyPatch, failure: Callable[[], Exception], error: type[Exception]
) -> None:
    with pytest.raises(error, match="Nothing was decided|nothing was decided"):  # was "champion stays version 1"
        reg.register(0.999, test_hash="another split", rescore=_load_fails(monkeypatch, failure))
    assert aliases("m") == {"champion": "1", "challenger": "2"} and not reg.decided("2")


def test_a_champion_whose_files_are_gone_still_stays(reg: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    def gone() -> Exception:  # what MLflow's local artifact store raises once the files are deleted
        return MlflowException("No such artifact: ''", error_code=RESOURCE_DOES_NOT_EXIST)

    _, result = reg.register(0.999, test_hash="another split", rescore=_load_fails(monkeypatch, gone))
    assert result["champion"] is False and "could not be re-scored" in result["decision"]
    assert aliases("m") == {"champion": "1", "challenger": "2"} and reg.decided("2")


def test_a_rescore_failure_while_the_registry_is_down_decides_nothing(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    def rescore(uri: str) -> dict[str, float]:
        # The champion's files fail in a way unavailable() does not know, and the registry does not answer either.
        failing(monkeypatch, "get_registered_model", SERVICE_FAILURES["sqlite locked"], times=99)
        raise RuntimeError("could not connect to the artifact store's endpoint")

    said = "re-scoring champion version 1 of 'm' on the new test split: the MLflow tracking store at .* did not answer"
    with pytest.raises(ServiceError, match=said):
        reg.register(0.999, test_hash="another split", rescore=rescore)
    monkeypatch.undo()  # the registry answers again
    assert aliases("m") == {"champion": "1", "challenger": "2"} and not reg.decided("2")


# --- one registered name, one kind of model (issue 27, item 6) -------------------------------------------------------


def test_a_name_holds_one_kind_of_model_and_auto_names_new_data_after_itself(trained: Path) -> None:
    from mlflow.tracking import MlflowClient

    from trainflow.core.errors import UserError

    # trained: blobs, 'label', classification, registered as "blobs" (the fixture names it)
    client = MlflowClient()
    assert client.get_registered_model("blobs").tags.items() >= {"target": "label", "task": "classification"}.items()
    # The user's next data set is a regression table; register.model_name stays "blobs" (an earlier -S, say).
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, 200)
    pd.DataFrame({"x": x, "z": rng.normal(0, 1, 200), "y": 2 * x}).to_csv(trained / "data/raw/r.csv", index=False)
    paths = Paths(trained)
    write_overrides(paths.params, ["data.source=data/raw/r.csv", "data.target=y", "train.monitor=val_loss"])
    run_all(trained, ("ingest", "split", "train", "evaluate"))
    with pytest.raises(UserError) as refused:
        run_all(trained, ("register",))
    message = str(refused.value)
    assert "'blobs' holds models predicting 'label' (classification); this run predicts 'y' (regression)" in message
    assert "-S register.model_name=auto" in message
    assert [int(v.version) for v in client.search_model_versions("name='blobs'")] == [1]  # nothing added to it
    # The advice, followed: auto names the model after its data, and the first run on it just works.
    write_overrides(paths.params, ["register.model_name=auto"])
    run_all(trained, ("register",))
    reg = read_json(paths.registration)
    assert reg["model_name"] == "r-y" and reg["version"] == 1 and reg["champion"] is True
    assert client.get_registered_model("r-y").tags.items() >= {"target": "y", "task": "regression"}.items()
    assert aliases("blobs") == {"champion": "1", "challenger": "1"}


def test_auto_names_the_default_data_as_before(tmp_path: Path) -> None:
    from support.projects import make_project

    from trainflow.params import default_model_name

    # The committed params.yaml (make_project's), not the working copy: a user's -S runs change that one.
    assert load_params(make_project(tmp_path / "p") / "params.yaml").register.model_name == "trainflow-digits"
    assert default_model_name("data/raw/titanic.csv", "Survived") == "titanic-Survived"
    assert default_model_name("data/raw/sales/*.csv", "units sold") == "sales-units-sold"
    assert default_model_name("data/raw/tips.csv", "size", "regression") == "tips-size-regression"


def test_the_data_hash_tag_is_what_dvc_recorded_for_the_splits(csv_project: Path) -> None:
    """The version's data_hash is DVC's own hash of data/splits (dvc commit, then dvc.lock read here), so a registered
    model leads back to the data it was trained on."""
    import subprocess
    import sys

    import yaml
    from mlflow.tracking import MlflowClient

    run_all(csv_project, ("ingest", "split"))
    dvc = Path(sys.executable).parent / "dvc"
    done = subprocess.run(
        [str(dvc), "commit", "-f", "ingest", "split"], cwd=csv_project, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    outs = yaml.safe_load((csv_project / "dvc.lock").read_text())["stages"]["split"]["outs"]
    (recorded,) = [o["md5"] for o in outs if o["path"] == "data/splits"]
    run_all(csv_project, ("train", "evaluate", "register"))
    assert recorded.endswith(".dir")  # DVC's hash of a directory
    assert MlflowClient().get_model_version("blobs", "1").tags["data_hash"] == recorded


# --- the paired gate (register.decide: paired, the default) --------------------------------------------------------


def test_the_paired_gate_promotes_a_real_improvement_and_not_a_reseeded_twin(csv_project: Path) -> None:
    """A champion that barely trained, then a trained model (promoted: its lower bound is far above 0), then the same
    model from another initialisation (promoted only if the bound says so). Each comparison is recomputed here from
    the two models' own outputs on the test rows."""
    from mlflow.tracking import MlflowClient

    paths = Paths(csv_project)
    blobs(n=600, separation=1.5).to_csv(csv_project / "data/raw/blobs.csv", index=False)
    write_overrides(paths.params, ["train.epochs=1", "train.lr=0.000001", "train.min_lr=0"])
    run_all(csv_project)
    test = pd.read_parquet(paths.split_file("test"))

    def right(model: Path) -> np.ndarray:
        exported = ExportedModel.load(model)
        return exported.outputs(test).argmax(axis=1) == exported.pre.labels(test, "test")

    previous = csv_project.parent / "previous"
    for step, overrides in enumerate([["train.lr=0.01"], ["seed=1"]]):
        shutil.rmtree(previous, ignore_errors=True)
        shutil.copytree(paths.final, previous)
        write_overrides(paths.params, overrides)
        for stage in ("train", "evaluate", "register"):  # not split: the same test rows
            run_all(csv_project, (stage,))
        reg = read_json(paths.registration)
        c = reg["comparison"]
        new, old = right(paths.final), right(previous)
        assert reg["decide"] == "paired" and c["rows"] == len(test) == read_json(paths.metrics)["n_test"]
        assert c["challenger"] == pytest.approx(new.mean()) == read_json(paths.metrics)["accuracy"]
        assert c["champion"] == pytest.approx(old.mean())
        assert c["mcnemar"]["challenger_only"] == int(np.sum(new & ~old))
        differ = int(np.sum(new != old))
        p_better = binomtest(int(np.sum(new & ~old)), differ, 0.5, alternative="greater").pvalue if differ else 1.0
        # on right-or-wrong rows the sign-flip test is McNemar's: its Monte-Carlo p-value is near the exact one
        assert c["p_better"] == pytest.approx(p_better, abs=4 * np.sqrt(p_better * (1 - p_better) / 9999) + 1e-4)
        assert c["low"] <= c["improvement"] <= c["high"]
        assert reg["champion"] is bool(c["low"] > 0 and p_better < 0.05), reg["decision"]
        assert reg["champion"] or step == 1, reg["decision"]  # a real improvement is promoted
        assert aliases("blobs") == {"champion": str(reg["champion_version"]), "challenger": str(reg["version"])}
        tags = MlflowClient().get_model_version("blobs", str(reg["version"])).tags
        assert tags["gate.improvement"] == repr(c["improvement"]) and "paired sign-flip test" in tags["gate.test"]
        assert tags["registry_decision"] == reg["decision"]
        assert ("not shown better by more than 0 with 95% confidence" in reg["decision"]) is not reg["champion"]
        if step == 0:
            assert old.mean() < 0.6 < 0.85 < new.mean() and c["low"] > 0.2


def test_after_new_rows_the_comparison_shows_the_new_rows_slice_and_each_class(trained: Path) -> None:
    """10% new rows appended, then a retrain: the comparison's slices hold the test rows the champion's split did not
    have (found here by their values), the ones it had, and each class, with both models' accuracy on each."""
    paths = Paths(trained)
    champion_model = trained.parent / "champion"
    shutil.copytree(paths.final, champion_model)
    first = blobs()
    appended = blobs(n=24, seed=1)
    pd.concat([first, appended], ignore_index=True).to_csv(trained / "data/raw/blobs.csv", index=False)
    run_all(trained)

    reg = read_json(paths.registration)
    slices = {s["slice"]: s for s in reg["comparison"]["slices"]}
    test = pd.read_parquet(paths.split_file("test"))
    is_new = test.merge(appended.assign(_new=True), how="left", on=list(appended.columns))["_new"].eq(True).to_numpy()
    assert 0 < is_new.sum() < len(test)
    new, old = slices["rows new since the champion's split"], slices["rows the champion's split had"]
    assert (new["rows"], old["rows"]) == (int(is_new.sum()), int((~is_new).sum()))

    def accuracy(model: Path, rows: np.ndarray) -> float:
        exported = ExportedModel.load(model)
        right = exported.outputs(test).argmax(axis=1) == exported.pre.labels(test, "test")
        return float(right[rows].mean())

    assert new["challenger"] == pytest.approx(accuracy(paths.final, is_new))
    assert new["champion"] == pytest.approx(accuracy(champion_model, is_new))
    assert old["champion"] == pytest.approx(accuracy(champion_model, ~is_new))
    labels = test["label"].to_numpy()
    for name in sorted(set(labels)):
        assert slices[f"class {name}"]["rows"] == int((labels == name).sum())
        assert slices[f"class {name}"]["challenger"] == pytest.approx(accuracy(paths.final, labels == name))
    from mlflow.tracking import MlflowClient

    versions = MlflowClient().search_model_versions("name='blobs'")
    assert sorted(v.tags["split_generation"] for v in versions) == ["1", "2"]

    # The card says the same: the rows added to the file, the paired comparison and its new-rows slice.
    card = (paths.reports / "card.md").read_text()
    assert any("data/raw/blobs.csv" in line and "+24 rows" in line for line in reg["why"]["data"]), reg["why"]
    assert "Changes to the data since the champion: " + "; ".join(reg["why"]["data"]) in card
    c = reg["comparison"]
    assert "## Against the champion (paired, on the same test rows)" in card
    assert f"| 95% one-sided bounds | [{c['low']:.4g}, {c['high']:.4g}] |" in card
    assert f"| rows new since the champion's split | {new['rows']} | accuracy | {new['challenger']:.4g} |" in card


def test_each_run_says_what_changed_since_the_champion(trained: Path) -> None:
    """Why a run ran (issue 27 item 2), against the champion: rows appended to the data file, a param, code (a commit
    touching trainflow/), or nothing at all; in registration.json, the registry artifact and the run's MLflow tag."""
    import subprocess

    from mlflow.tracking import MlflowClient

    from trainflow.stages import report

    paths = Paths(trained)

    def register_again(*overrides: str) -> dict[str, Any]:
        write_overrides(paths.params, list(overrides))
        run_all(trained)
        return read_json(paths.registration)["why"]  # type: ignore[no-any-return]

    first = read_json(paths.registration)["why"]  # the fixture's run
    assert first["compared_with"] is None and "first version" in first["summary"]
    assert register_again()["summary"].startswith("nothing changed since champion version 1")

    rows = blobs()
    pd.concat([rows, blobs(n=24, seed=1)], ignore_index=True).to_csv(trained / "data/raw/blobs.csv", index=False)
    grown = register_again()
    assert grown["data"] == [f"data/raw/blobs.csv: +24 rows ({len(rows)} -> {len(rows) + 24})"], grown
    assert grown["params"] == [] and grown["code"] == []
    champion_now = int(aliases("blobs")["champion"])

    changed = register_again("train.lr=0.005")
    assert changed["compared_with"] == champion_now and changed["code"] == []
    # against the champion, whichever it is: the data it was trained on (v1: before the append), its lr
    assert changed["data"] == (grown["data"] if champion_now == 1 else [])
    champion = MlflowClient().get_model_version("blobs", str(champion_now))
    lr_then = MlflowClient().get_run(champion.run_id).data.params["train.lr"]
    assert changed["params"] == [f"train.lr: {lr_then} -> 0.005"]
    reg = read_json(paths.registration)
    assert f"Why this run ran: {changed['summary']}" in report.registry_markdown(reg)
    run = MlflowClient().get_run(reg["tags"]["mlflow_run_id"])
    assert run.data.tags["trainflow.why"] == changed["summary"]

    (trained / "trainflow_note.py").write_text("# a user model file would be here\n")
    subprocess.run(["git", "add", "-A"], cwd=trained, check=True, capture_output=True)
    subprocess.run(["git", "commit", "-qm", "code"], cwd=trained, check=True, capture_output=True)
    coded = register_again("train.lr=0.004")
    assert "trainflow_note.py" in coded["code"], coded


# --- a champion trained on another split (split.seed, fractions, keys: another assignment) --------------------------


@pytest.mark.slow  # two trainings on 600 and 720 rows; the rule itself: test_rows_the_champion_trained_on_are_left_out
def test_after_a_split_seed_change_the_gate_compares_only_test_rows_the_champion_never_trained_on(
    csv_project: Path,
) -> None:
    """The champion trained on split.seed 42's split (committed to DVC's cache, as `trainflow run` does); then 120
    rows are appended and split.seed becomes 1, so every row is assigned afresh. The gate compares the two on the test
    rows the champion's split held out of train and val (found here by value in its own train and val files), and the
    slice of rows new since its split is the rows whose raw key its table did not hold (set arithmetic, checked
    against its assignment's keys seeded by hand)."""
    import subprocess
    import sys

    import pyarrow.parquet as pq

    from trainflow.data.schema import ROW_KEY

    paths = Paths(csv_project)
    rows = blobs(n=600, separation=1.5)
    rows.to_csv(csv_project / "data/raw/blobs.csv", index=False)
    write_overrides(paths.params, ["split.test_fraction=0.3"])
    run_all(csv_project, ("ingest", "split"))
    dvc = Path(sys.executable).parent / "dvc"
    done = subprocess.run([str(dvc), "commit", "-f", "ingest", "split"], cwd=csv_project, capture_output=True)
    assert done.returncode == 0, done.stderr
    run_all(csv_project, ("train", "evaluate", "register"))
    then = csv_project.parent / "champion"
    shutil.copytree(paths.splits, then / "splits")
    shutil.copytree(paths.final, then / "model")
    shutil.copy(paths.table, then / "table.parquet")

    appended = blobs(n=120, seed=1, separation=1.5)
    pd.concat([rows, appended], ignore_index=True).to_csv(csv_project / "data/raw/blobs.csv", index=False)
    write_overrides(paths.params, ["split.seed=1"])
    run_all(csv_project)
    reg = read_json(paths.registration)
    c = reg["comparison"]
    assert reg["previous_champion"] == 1 and c is not None, reg["decision"]

    columns = list(rows.columns)
    test = pd.read_parquet(paths.split_file("test"))
    trained = pd.concat([pd.read_parquet(then / "splits" / f"{s}.parquet") for s in ("train", "val")])
    found = test.merge(trained[columns].assign(_t=True), how="left", on=columns)
    was_trained = found["_t"].eq(True).to_numpy()
    assert len(found) == len(test) and 20 <= int((~was_trained).sum()) < len(test)
    clean = ~was_trained
    assert (c["rows"], c["left_out"], c["test_rows"]) == (int(clean.sum()), int(was_trained.sum()), len(test))
    assert reg["test_rows"]["compared"] == c["rows"] and reg["test_rows"]["why"] == c["why"]
    assert f"compared on {clean.sum()} of the {len(test)} test rows: {was_trained.sum()} left out" in reg["decision"]

    def right(model: Path) -> np.ndarray:
        exported = ExportedModel.load(model)
        return exported.outputs(test).argmax(axis=1) == exported.pre.labels(test, "test")

    assert c["challenger"] == pytest.approx(right(paths.final)[clean].mean())
    assert c["champion"] == pytest.approx(right(then / "model")[clean].mean())

    # New since the champion's split: by raw row key, absent from the champion's table ...
    keyed = test.merge(pd.read_parquet(paths.table)[[*columns, ROW_KEY]], how="left", on=columns)
    raw = keyed[ROW_KEY].to_numpy(dtype=np.uint64)
    is_new = ~np.isin(raw, pd.read_parquet(then / "table.parquet")[ROW_KEY].to_numpy(dtype=np.uint64))
    # ... which is its assignment not holding the key: seeded (by hand) with the seed it was made under
    held = set(pq.read_table(then / "splits" / "assignment.parquet").column("key").to_pylist())
    from pandas.util import hash_pandas_object

    hashed = hash_pandas_object(keyed[[ROW_KEY]], index=False).to_numpy()
    np.testing.assert_array_equal(is_new, [splitmix64_by_hand(int(h), 42) not in held for h in hashed])
    new_rows = test[is_new].merge(appended, on=columns)
    assert len(new_rows) == int(is_new.sum()) > 0  # the appended rows, exactly
    slices = {s["slice"]: s for s in c["slices"]}
    assert slices["rows new since the champion's split"]["rows"] == int((is_new & clean).sum())
    assert slices["rows the champion's split had"]["rows"] == int((~is_new & clean).sum())
    assert slices["rows new since the champion's split"]["champion"] == pytest.approx(
        right(then / "model")[is_new & clean].mean()
    )


@pytest.mark.slow  # two trainings; the rule itself: test_rows_the_champion_trained_on_are_left_out_of_either_rule
def test_a_champion_whose_split_cannot_be_found_stays_and_its_advice_promotes_by_hand(trained: Path) -> None:
    """split.seed changed and the champion's splits are nowhere (no DVC cache): which test rows it trained on is
    unknown, so nothing is compared; the decision says so, and its advice, followed, makes the challenger champion."""
    from mlflow.tracking import MlflowClient

    from trainflow import cli

    paths = Paths(trained)
    write_overrides(paths.params, ["split.seed=1"])
    run_all(trained, ("split", "train", "evaluate"))
    shutil.rmtree(trained / ".dvc" / "cache", ignore_errors=True)
    run_all(trained, ("register",))
    reg = read_json(paths.registration)
    n = len(pd.read_parquet(paths.split_file("test")))
    assert reg["champion"] is False and reg["comparison"] is None and reg["previous_champion"] == 1
    assert reg["test_rows"] == {"test_rows": n, "compared": 0, "left_out": n, "why": reg["test_rows"]["why"]}
    assert reg["decision"].startswith(f"champion stays version 1: which of these {n} test rows its own split trained")
    assert "not in the DVC cache" in reg["decision"] and f"(0 of the {n} test rows compared)" in reg["decision"]
    assert (
        MlflowClient().get_model_version("blobs", "2").tags["split_assignment"]
        != (MlflowClient().get_model_version("blobs", "1").tags["split_assignment"])
    )
    advice = re.search(r"run `trainflow (models promote 2 --name blobs) --reason \.\.\.`", reg["decision"])
    assert advice is not None, reg["decision"]
    assert cli.main([*advice.group(1).split(), "--reason", "the new split, checked by hand"]) == 0
    assert aliases("blobs") == {"champion": "2", "challenger": "2"}


@pytest.mark.parametrize("decide", ["paired", "point"])
def test_rows_the_champion_trained_on_are_left_out_of_either_rule(tmp_path: Path, decide: str) -> None:
    """A stand-in champion re-scored on 80 test rows, 40 of which its split trained it on (it is right on all of
    those, and on none of the others); the challenger is right on the others. On the rows left, the challenger wins
    by every rule; on all of them, the champion would look as good. Where the rows are unknown, nothing is compared."""
    from trainflow.data.split import Held
    from trainflow.registry.gate import Scored, Slicing

    r = Registry(tmp_path)
    r.client.create_registered_model("m")
    r.with_champion(test_hash="theirs")
    n, labels = 80, np.arange(80) % 2
    trained = np.arange(n) < 40
    one_hot = np.eye(2)[labels] * 0.9 + 0.05

    def scored(right: np.ndarray) -> Scored:
        return Scored(labels, np.where(right[:, None], one_hot, one_hot[:, ::-1]))

    champion, challenger = scored(trained), scored(~trained | (np.arange(n) % 4 == 0))
    where = np.where(trained, 0, -1).astype(np.int8)  # its train split, or never held

    def rescore(uri: str) -> tuple[dict[str, float], Scored]:
        return {"accuracy": float(trained.mean())}, champion

    params = RegisterParams(model_name="m", decide=decide)
    metrics = {"accuracy": float((challenger.outputs.argmax(axis=1) == labels).mean())}
    slicing = Slicing(None, {"split_assignment": "ours"}, lambda tags: Held(where, ~trained, "by key"))
    run_id = model_run(r.client, r.experiment, tmp_path / "models")
    kwargs: dict[str, Any] = {"test_hash": "ours", "rescore": rescore, "challenger": challenger, "seed": 0}
    got = registry.register(f"runs:/{run_id}/model", run_id, params, metrics, {}, **kwargs, slicing=slicing)
    assert got["champion"] is True, got["decision"]
    assert got["test_rows"] == {"test_rows": n, "compared": 40, "left_out": 40, "why": "by key"}
    assert (
        "compared on 40 of the 80 test rows: 40 left out, as the champion trained or validated on them (by key)"
        in (got["decision"])
    )
    if decide == "paired":
        assert (got["comparison"]["rows"], got["comparison"]["champion"], got["comparison"]["challenger"]) == (40, 0, 1)
    else:
        assert "accuracy 1 beats champion version 1's 0 (re-scored on the new test split)" in got["decision"]
    assert r.client.get_model_version("m", str(got["version"])).tags["split_assignment"] == "ours"

    unknown = Slicing(None, {}, lambda tags: Held(None, None, "not in the DVC cache"))
    run_id = model_run(r.client, r.experiment, tmp_path / "models")
    kwargs["test_hash"] = "another"  # a test split the champion (version 2) was not tested on
    got = registry.register(f"runs:/{run_id}/model", run_id, params, metrics, {}, **kwargs, slicing=unknown)
    assert got["champion"] is False and got["comparison"] is None
    assert got["decision"].startswith(f"champion stays version 2: which of these {n} test rows its own split trained")
