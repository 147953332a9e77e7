"""Whole outputs of tracking, the registry, params' messages and the plots, pinned exactly: every param, tag and
metric a training run logs; the registration dict, the version tags and the aliases after each decision; the full
text of a params error; the data a plot draws. Each value is written out by hand from the inputs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from support.projects import model_run

from trainflow import tracking
from trainflow.artifacts import manifest
from trainflow.core import outage
from trainflow.core.errors import ParamsError, ServiceError, UserError
from trainflow.params import RegisterParams
from trainflow.registry import gate, registry

FIX = "Fix params.yaml or the -S override, then rerun (`trainflow params schema` lists every field)."


# --- tracking: the training run ---------------------------------------------------------------------------------------


def test_a_training_run_logs_exactly_its_flattened_params_its_tags_metrics_and_status(tmp_path: Path) -> None:
    """start() logs every param, nested sections flattened to dotted keys as text, and the tags given (plus the run
    name); set_tags, log_metrics and finish add exactly what they are given; record() names the run and the store."""
    from mlflow.tracking import MlflowClient

    run = tracking.TrainingRun(tmp_path, "exp", tmp_path / "fallback.json")
    run.start({"seed": 3, "train": {"lr": 0.5, "opt": {"name": "adam"}}, "flag": True}, {"t": "v"}, run_name="nm")
    run.set_tags({"k": "w", "k2": "w2"})
    run.log_metrics({"acc": 0.5, "loss": 1.25})
    run.finish("FAILED")
    got = MlflowClient().get_run(str(run.run_id))
    assert got.data.params == {"seed": "3", "train.lr": "0.5", "train.opt.name": "adam", "flag": "True"}
    assert got.data.tags == {"t": "v", "mlflow.runName": "nm", "k": "w", "k2": "w2"}
    assert got.data.metrics == {"acc": 0.5, "loss": 1.25}
    assert got.info.status == "FAILED"
    experiment = MlflowClient().get_experiment(str(run.experiment_id))
    assert experiment.name == "exp"
    assert experiment.artifact_location == (tmp_path / "mlartifacts").resolve().as_uri()
    assert run.record() == {
        "run_id": got.info.run_id,
        "experiment_id": experiment.experiment_id,
        "model_uri": None,
        "tracking_uri": os.environ["MLFLOW_TRACKING_URI"],  # conftest's store
        "tracking_error": None,
    }
    assert run.error is None


def test_a_second_run_of_the_experiment_reuses_it_and_more_than_100_params_all_arrive(tmp_path: Path) -> None:
    """MLflow takes at most 100 params per batch: 250 arrive in three batches, all of them."""
    from mlflow.tracking import MlflowClient

    first = tracking.TrainingRun(tmp_path, "exp", tmp_path / "f.json")
    first.start({}, {})
    second = tracking.TrainingRun(tmp_path, "exp", tmp_path / "f.json")
    params = {f"p{i:03d}": i for i in range(250)}
    second.start(params, {})
    assert second.experiment_id == first.experiment_id
    assert MlflowClient().get_run(str(second.run_id)).data.params == {k: str(v) for k, v in params.items()}
    assert MlflowClient().get_run(str(first.run_id)).data.params == {}


def test_a_pipeline_run_records_its_workspace_and_process(tmp_path: Path) -> None:
    import os
    import socket

    import psutil
    from mlflow.tracking import MlflowClient

    run = tracking.TrainingRun(tmp_path, "exp", tmp_path / "f.json")
    run.start({}, {"a": "b"}, pipeline=True)
    tags = MlflowClient().get_run(str(run.run_id)).data.tags
    host = socket.gethostname()
    started = psutil.Process().create_time()
    assert tags == {
        "a": "b",
        "mlflow.runName": tags["mlflow.runName"],  # MLflow names an unnamed run itself
        "trainflow.workspace": f"{host}:{tmp_path.resolve()}",
        "trainflow.process": f"{host}:{os.getpid()}:{started:.2f}",
    }


def test_the_first_failure_warns_once_with_the_whole_story_and_turns_tracking_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    run = tracking.TrainingRun(tmp_path, "exp", tmp_path / "f.json")
    run.start({}, {})
    run_id = str(run.run_id)

    def boom(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(MlflowClient, "set_tag", boom)
    with pytest.warns(UserWarning) as caught:
        run.set_tags({"k": "v"})
    assert [str(w.message) for w in caught] == [
        f"MLflow tracking at {run.uri} failed while tagging the run (RuntimeError: boom). Training goes on without "
        f"it: metrics are kept in {tmp_path / 'f.json'}, everything else in models/ and reports/; `trainflow stage "
        "register` logs the model to MLflow once the server answers."
    ]
    assert run.error == "tagging the run: RuntimeError: boom"
    assert run.record()["tracking_error"] == "tagging the run: RuntimeError: boom"
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        run.log_metrics({"acc": 1.0})
        run.finish()
    got = MlflowClient().get_run(run_id)
    assert got.data.metrics == {} and got.info.status == "RUNNING"  # nothing more was sent


def test_without_a_run_nothing_but_starting_is_tried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    called: list[str] = []
    monkeypatch.setattr(MlflowClient, "set_tag", lambda *a, **k: called.append("set_tag"))
    monkeypatch.setattr(MlflowClient, "log_metric", lambda *a, **k: called.append("log_metric"))
    monkeypatch.setattr(MlflowClient, "set_terminated", lambda *a, **k: called.append("set_terminated"))
    run = tracking.TrainingRun(tmp_path, "exp", tmp_path / "f.json")
    run.set_tags({"k": "v"})
    run.log_metrics({"a": 1.0})
    run.finish()
    assert called == [] and run.error is None
    run.attach("abc")
    run.set_tags({"k": "v"})
    run.log_metrics({"a": 1.0})
    run.finish()
    assert called == ["set_tag", "log_metric", "set_terminated"]


def test_the_logger_sends_every_point_with_its_step_and_writes_no_fallback(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    run = tracking.TrainingRun(tmp_path, "exp", tmp_path / "f.json")
    run.start({}, {})
    logger = run.logger(flush_every=3, flush_interval_s=60)
    for step in range(5):
        logger.log({"loss": 1.0 / (step + 1), "lr": 0.1}, step)
    logger.close()
    logger.close()  # twice is harmless
    client = MlflowClient()
    history = {(m.step, m.value) for m in client.get_metric_history(str(run.run_id), "loss")}
    assert history == {(s, 1.0 / (s + 1)) for s in range(5)}
    assert {(m.step, m.value) for m in client.get_metric_history(str(run.run_id), "lr")} == {(s, 0.1) for s in range(5)}
    assert not logger.failed and not (tmp_path / "f.json").exists()
    with pytest.raises(RuntimeError) as late:
        logger.log({"loss": 0.0}, 9)
    assert str(late.value) == "MLflowLogger.log() called after close()"


def test_a_logger_without_a_run_keeps_every_point_in_the_fallback_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fallback = tmp_path / "fb.json"
    logger = tracking.MLflowLogger("", fallback, flush_every=1, flush_interval_s=0.01)
    logger.log({"loss": 2, "acc": 0.5}, 1)
    logger.log({"loss": 1}, 2)
    assert logger.failed
    logger.close()
    assert json.loads(fallback.read_text()) == [{"step": 1, "loss": 2.0, "acc": 0.5}, {"step": 2, "loss": 1.0}]
    assert capsys.readouterr().err == f"train: metrics kept locally in {fallback}\n"


@pytest.mark.parametrize(("interval", "timeout"), [(0.0, 1.0), (-1.0, 1.0), (1.0, -0.5)])
def test_a_logger_refuses_intervals_that_cannot_work(tmp_path: Path, interval: float, timeout: float) -> None:
    with pytest.raises(ValueError) as bad:
        tracking.MLflowLogger("", tmp_path / "f.json", flush_interval_s=interval, close_timeout_s=timeout)
    assert str(bad.value) == "flush_interval_s must be > 0 and close_timeout_s >= 0"


def test_a_logger_accepts_the_edges_of_its_limits(tmp_path: Path) -> None:
    logger = tracking.MLflowLogger("", tmp_path / "f.json", flush_every=0, flush_interval_s=0.01, close_timeout_s=0)
    assert logger.flush_every == 1
    assert (logger.flush_interval_s, logger.close_timeout_s) == (0.01, 0)
    logger.close()


def test_a_failed_send_warns_once_naming_the_error_and_the_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setattr(MlflowClient, "log_batch", lambda *a, **k: (_ for _ in ()).throw(OSError("down")))
    fallback = tmp_path / "fb.json"
    with pytest.warns(UserWarning) as caught:
        logger = tracking.MLflowLogger("run1", fallback, flush_every=100, flush_interval_s=60)
        logger.log({"a": 1.0}, 0)
        logger.close()
    assert [str(w.message) for w in caught] == [
        f"MLflow logging failed (OSError: down); metrics are kept in {fallback}"
    ]
    assert logger.failed
    assert json.loads(fallback.read_text()) == [{"step": 0, "a": 1.0}]


def test_keep_locally_writes_the_fallback_even_when_sending_worked(tmp_path: Path) -> None:
    run = tracking.TrainingRun(tmp_path, "exp", tmp_path / "f.json")
    run.start({}, {})
    logger = run.logger()
    logger.log({"a": 3.0}, 7)
    logger.close()
    assert not (tmp_path / "f.json").exists()
    logger.keep_locally()  # after close: written at once
    assert json.loads((tmp_path / "f.json").read_text()) == [{"step": 7, "a": 3.0}]


def test_flatten_joins_nested_keys_with_dots_under_a_prefix() -> None:
    nested = {"a": 1, "b": {"c": 2, "d": {"e": [3]}}, "f": {}}
    assert tracking.flatten(nested) == {"a": 1, "b.c": 2, "b.d.e": [3]}
    assert tracking.flatten(nested, "p.") == {"p.a": 1, "p.b.c": 2, "p.b.d.e": [3]}


def test_the_tracking_uri_is_the_environment_s_else_the_project_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://x:5000")
    assert tracking.tracking_uri(tmp_path) == "http://x:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    assert tracking.tracking_uri(tmp_path) == f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}"


def test_configure_sets_short_http_retries_unless_the_environment_says_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    for key in tracking.HTTP_DEFAULTS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    monkeypatch.delenv("MLFLOW_DISABLE_TELEMETRY", raising=False)
    uri = tracking.configure(tmp_path)
    assert uri == os.environ["MLFLOW_TRACKING_URI"]  # conftest's store: the environment wins
    got = {k: os.environ[k] for k in [*tracking.HTTP_DEFAULTS, "MLFLOW_DISABLE_TELEMETRY"]}
    assert got == {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }


def test_unavailable_and_not_found_tell_an_outage_from_an_answer() -> None:
    import requests
    from mlflow.exceptions import MlflowException

    def mlflow_error(message: str, code: str) -> MlflowException:
        exc = MlflowException(message)
        exc.error_code = code
        return exc

    outages = [
        requests.exceptions.ConnectionError("refused"),
        ConnectionError("reset"),
        TimeoutError("slow"),
        mlflow_error("x", "TEMPORARILY_UNAVAILABLE"),
        mlflow_error("x", "DEADLINE_EXCEEDED"),
        mlflow_error("x", "REQUEST_LIMIT_EXCEEDED"),
        mlflow_error("x", "RESOURCE_EXHAUSTED"),
        mlflow_error("HTTPConnectionPool: Max retries exceeded with url", "INTERNAL_ERROR"),
        mlflow_error("API request to /x failed with exception boom", "INTERNAL_ERROR"),
        mlflow_error("Read Timed Out", "INTERNAL_ERROR"),
    ]
    answers = [
        mlflow_error("Registered model alias champion not found.", "INVALID_PARAMETER_VALUE"),
        mlflow_error("gone", "RESOURCE_DOES_NOT_EXIST"),
        mlflow_error("bad", "INVALID_PARAMETER_VALUE"),
        mlflow_error("max retries exceeded", "INTERNAL_ERROR"),  # MLflow's text is capitalised
        ValueError("Max retries exceeded"),
    ]
    assert [outage.unavailable(e) for e in outages] == [True] * len(outages)
    assert [outage.unavailable(e) for e in answers] == [False] * len(answers)
    assert [outage.not_found(e) for e in answers] == [True, True, False, False, False]
    assert [outage.not_found(e) for e in outages] == [False] * len(outages)
    assert not outage.not_found(mlflow_error("not found", "ENDPOINT_NOT_FOUND"))


def test_the_run_folder_is_the_utc_time_and_the_run_id() -> None:
    assert re.fullmatch(r"\d{8}-\d{6}_abc", tracking.run_folder("abc"))
    assert re.fullmatch(r"\d{8}-\d{6}_no-mlflow-[0-9a-f]{8}", tracking.run_folder(None))


def test_loggers_close_every_one_and_raise_the_first_error() -> None:
    seen: list[tuple[str, Any]] = []

    class Fake:
        def __init__(self, name: str, error: Exception | None = None) -> None:
            self.name, self.error = name, error

        def log(self, metrics: dict[str, float], step: int) -> None:
            seen.append((self.name, (metrics, step)))

        def close(self) -> None:
            seen.append((self.name, "close"))
            if self.error:
                raise self.error

    first, second = RuntimeError("first"), RuntimeError("second")
    both = tracking.Loggers([Fake("a", first), Fake("b", second), Fake("c")])
    both.log({"x": 1.0}, 4)
    with pytest.raises(RuntimeError) as raised:
        both.close()
    assert raised.value is first
    assert seen == [("a", ({"x": 1.0}, 4)), ("b", ({"x": 1.0}, 4)), ("c", ({"x": 1.0}, 4)),
                    ("a", "close"), ("b", "close"), ("c", "close")]  # fmt: skip


def test_end_orphans_ends_only_this_workspace_s_runs_whose_process_is_gone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import os
    import socket

    from mlflow.tracking import MlflowClient

    tracking.configure(tmp_path)
    client = MlflowClient()
    experiment = tracking.ensure_experiment("exp", tmp_path)
    host = socket.gethostname()
    dead = f"{host}:{2**22 + 12345}:1.00"  # a pid above the kernel's limit: no such process
    alive = tracking.processes.process_tag()
    ws = f"{host}:/some/where"

    def made(workspace: str, process: str) -> str:
        tags = {tracking.WORKSPACE_TAG: workspace, tracking.PROCESS_TAG: process}
        return str(client.create_run(experiment, tags=tags).info.run_id)

    orphan, living, elsewhere = made(ws, dead), made(ws, alive), made(f"{host}:/other", dead)
    capsys.readouterr()
    assert tracking.end_orphans(client, experiment, ws) == [orphan]
    assert client.get_run(orphan).info.status == "KILLED"
    assert client.get_run(orphan).data.tags["trainflow.ended"] == (
        f"its process ({dead}) ended while the run was RUNNING, without ending it (killed, or its machine went "
        "down); ended by the next train stage of the workspace"
    )
    assert [client.get_run(r).info.status for r in (living, elsewhere)] == ["RUNNING", "RUNNING"]
    assert capsys.readouterr().err == f"train: MLflow run {orphan} was left RUNNING by a dead process: KILLED\n"
    assert os.getpid() != 2**22 + 12345


def test_run_of_model_prefers_the_run_that_logged_the_model(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    tracking.configure(tmp_path)
    client = MlflowClient()
    experiment = tracking.ensure_experiment("exp", tmp_path)
    final = tmp_path / "final"
    final.mkdir()
    (final / "w.bin").write_bytes(b"weights")
    assert tracking.run_of_model(experiment, final) is None
    digest = tracking.model_hash(final)
    bare = client.create_run(experiment, tags={tracking.MODEL_HASH_TAG: digest}).info.run_id
    assert tracking.run_of_model(experiment, final) == (bare, None)
    tags = {tracking.MODEL_HASH_TAG: digest, tracking.MODEL_URI_TAG: "models:/m-1"}
    logged = client.create_run(experiment, tags=tags).info.run_id
    assert tracking.run_of_model(experiment, final) == (logged, "models:/m-1")


# --- registry ---------------------------------------------------------------------------------------------------------


def test_beats_is_strict_by_more_than_the_margin_in_the_metric_s_direction() -> None:
    assert registry.beats(0.5, None, "accuracy", 0.0)
    assert registry.beats(0.81, 0.8, "accuracy", 0.0)
    assert not registry.beats(0.8, 0.8, "accuracy", 0.0)
    assert not registry.beats(0.85, 0.8, "accuracy", 0.05)  # 0.85 is not more than 0.8 + 0.05
    assert registry.beats(0.86, 0.8, "accuracy", 0.05)
    for lower in ("log_loss", "ece", "rmse", "mae"):
        assert registry.beats(0.7, 0.8, lower, 0.05)
        assert not registry.beats(0.75, 0.8, lower, 0.05)
        assert not registry.beats(0.9, 0.8, lower, 0.0)
    assert registry.beats(0.9, 0.8, "r2", 0.0)


def test_the_gate_metric_auto_is_accuracy_or_r2_and_an_unmeasured_one_is_refused() -> None:
    assert registry.gate_metric(RegisterParams(), {"accuracy": 1.0, "r2": 0.1}) == "accuracy"
    assert registry.gate_metric(RegisterParams(), {"r2": 0.1, "rmse": 2.0}) == "r2"
    assert registry.gate_metric(RegisterParams(gate_metric="rmse"), {"r2": 0.1, "rmse": 2.0}) == "rmse"
    with pytest.raises(ParamsError) as bad:
        registry.gate_metric(RegisterParams(gate_metric="f1_macro"), {"r2": 0.1, "rmse": 2.0})
    assert str(bad.value) == (
        "params.yaml: 1 invalid parameter:\n"
        "  register.gate_metric: f1_macro is not measured for this task; the metrics are ['r2', 'rmse']\n" + FIX
    )


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("sqlite:////abs/dir/x.db", "/abs/dir/x.db.registry.lock"),
        ("sqlite:///rel%20dir/x.db", "rel dir/x.db.registry.lock"),
        ("file:///store/ml%20runs", "/store/ml runs/.registry.lock"),
        ("/plain/path", "/plain/path/.registry.lock"),
    ],
)
def test_the_lock_sits_beside_a_local_store(uri: str, expected: str) -> None:
    assert registry.lock_path(uri) == Path(expected)


@pytest.mark.parametrize("uri", ["sqlite://", "sqlite:///:memory:", "http://server:5000"])
def test_a_store_without_a_local_file_locks_in_the_temp_directory(uri: str) -> None:
    import hashlib
    import tempfile

    digest = hashlib.sha256(uri.encode()).hexdigest()[:16]
    assert registry.lock_path(uri) == Path(tempfile.gettempdir()) / f"trainflow-registry-{digest}.lock"


def test_a_failed_registry_call_says_what_where_and_that_nothing_changed(tmp_path: Path) -> None:
    uri = tracking.configure(tmp_path)
    error = registry.registry_failed("looking up x", OSError("refused"), "Try again")
    assert isinstance(error, ServiceError)
    assert str(error) == (
        f"looking up x: the MLflow tracking store at {uri} did not answer (OSError: refused). That is no answer "
        "about what the registry holds, so nothing was decided and the champion alias is as it was. Try again."
    )


class Store:
    """This test's registry (a SQLite store in tmp_path) and registrations of stand-in models into model "m"."""

    def __init__(self, root: Path) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = tracking.configure(root)
        self.root = root
        self.client = MlflowClient()
        self.experiment = tracking.ensure_experiment("trainflow", root)

    def run(self) -> str:
        return model_run(self.client, self.experiment, self.root / "models")

    def register(
        self,
        metrics: dict[str, float],
        tags: dict[str, str] | None = None,
        run_id: str | None = None,
        params: RegisterParams | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        run_id = run_id or self.run()
        kwargs = {"test_hash": "h", "rescore": unexpected_rescore, **kwargs}
        params = params or RegisterParams(model_name="m", decide="point")
        return registry.register(f"runs:/{run_id}/model", run_id, params, metrics, tags or {}, **kwargs)

    def aliases(self) -> dict[str, str]:
        return {a: str(v) for a, v in self.client.get_registered_model("m").aliases.items()}

    def model_tags(self) -> dict[str, str]:
        return dict(self.client.get_registered_model("m").tags)

    def version_tags(self, version: int) -> dict[str, str]:
        """The version's tags but the manifest of its files (`test_the_first_registration_...` checks that)."""
        tags = self.client.get_model_version("m", str(version)).tags
        return {k: v for k, v in tags.items() if not k.startswith(manifest.HEAD_TAG)}


def unexpected_rescore(uri: str) -> Any:
    raise AssertionError(f"{uri} re-scored, but the test split is the same")


CHANGE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00 (.*)", re.S)


def change(tags: dict[str, str]) -> str:
    """A champion_change tag without its time stamp (checked to be an ISO time in UTC to the second)."""
    match = CHANGE.fullmatch(tags.pop(registry.CHANGE_TAG))
    assert match is not None
    return match.group(1)


def test_the_first_registration_is_champion_with_every_tag_and_the_kind_of_the_name(tmp_path: Path) -> None:
    store = Store(tmp_path)
    run_id = store.run()
    lineage = {"target": "species", "task": "classification", "data_hash": "d1"}
    result = store.register({"accuracy": 0.75, "n_test": 40}, lineage, run_id=run_id)
    assert result == {
        "model_name": "m",
        "version": 1,
        "model_uri": "models:/m/1",
        "gate_metric": "accuracy",
        "value": 0.75,
        "previous_champion": None,
        "previous_value": None,
        "previous_metrics": None,
        "rescored": False,
        "champion": True,
        "champion_version": 1,
        "decision": "version 1 is the first champion of m",
        "decide": "point",
        "comparison": None,
        "test_rows": None,
        "tags": {**lineage, "test_data_hash": "h"},
    }
    tags = store.version_tags(1)
    assert change(tags) == "register: version 1 is the first champion of m"
    assert tags == {
        **lineage,
        "test_data_hash": "h",
        "metric.accuracy": "0.75",
        "metric.n_test": "40.0",
        "registry_decision": "version 1 is the first champion of m",
    }
    assert store.aliases() == {"champion": "1", "challenger": "1"}
    assert store.model_tags() == {"target": "species", "task": "classification", "champion_history": "[1]"}
    # The manifest of the version's files (the stand-in model holds an MLmodel alone), in the registry.
    every = store.client.get_model_version("m", "1").tags
    assert manifest.recorded(every, "version 1") == {"MLmodel": hashlib.sha256(b"flavors: {}\n").hexdigest()}
    assert store.client.get_model_version("m", "1").run_id == run_id


def test_a_worse_version_is_challenger_only_and_the_decision_says_by_how_much(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.register({"accuracy": 0.75})
    params = RegisterParams(model_name="m", decide="point", min_improvement=0.05)
    result = store.register({"accuracy": 0.79}, params=params)
    decision = (
        "accuracy 0.79 does not beat champion version 1's 0.75 (same test split) by more than min_improvement 0.05: "
        "stays version 1"
    )
    assert result == {
        "model_name": "m",
        "version": 2,
        "model_uri": "models:/m/2",
        "gate_metric": "accuracy",
        "value": 0.79,
        "previous_champion": 1,
        "previous_value": 0.75,
        "previous_metrics": {"accuracy": 0.75},
        "rescored": False,
        "champion": False,
        "champion_version": 1,
        "decision": decision,
        "decide": "point",
        "comparison": None,
        "test_rows": None,
        "tags": {"test_data_hash": "h"},
    }
    assert store.aliases() == {"champion": "1", "challenger": "2"}
    assert store.version_tags(2) == {"test_data_hash": "h", "metric.accuracy": "0.79", "registry_decision": decision}
    assert store.model_tags() == {"champion_history": "[1]"}


def test_a_better_version_takes_the_champion_and_joins_the_history(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.register({"accuracy": 0.75})
    result = store.register({"accuracy": 0.8125})
    decision = (
        "accuracy 0.8125 beats champion version 1's 0.75 (same test split) by more than min_improvement 0: "
        "champion moves to version 2"
    )
    assert (result["champion"], result["champion_version"], result["previous_champion"]) == (True, 2, 1)
    assert result["decision"] == decision
    tags = store.version_tags(2)
    assert change(tags) == f"register: {decision}"
    assert store.aliases() == {"champion": "2", "challenger": "2"}
    assert store.model_tags() == {"champion_history": "[1, 2]"}


def test_a_lower_is_better_gate_promotes_the_lower_value(tmp_path: Path) -> None:
    store = Store(tmp_path)
    params = RegisterParams(model_name="m", decide="point", gate_metric="log_loss")
    store.register({"accuracy": 0.9, "log_loss": 0.5}, params=params)
    result = store.register({"accuracy": 0.8, "log_loss": 0.25}, params=params)
    assert result["champion"] is True and result["gate_metric"] == "log_loss" and result["value"] == 0.25
    assert result["decision"] == (
        "log_loss 0.25 beats champion version 1's 0.5 (same test split) by more than min_improvement 0: "
        "champion moves to version 2"
    )


def test_a_champion_measured_on_another_split_is_rescored_and_decided_on_that(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.register({"accuracy": 0.95}, test_hash="old")
    asked: list[str] = []

    def rescore(uri: str) -> Any:
        asked.append(uri)
        # its rows, as the paired rule would need them (a point decision only counts them)
        return {"accuracy": 0.5, "n_test": 10.0}, gate.Scored(np.zeros(10), np.zeros((10, 2)))

    result = store.register({"accuracy": 0.6}, test_hash="new", rescore=rescore)
    assert asked == ["models:/m/1"]
    assert result["rescored"] is True
    assert result["previous_metrics"] == {"accuracy": 0.5, "n_test": 10.0} and result["previous_value"] == 0.5
    assert result["decision"] == (
        "accuracy 0.6 beats champion version 1's 0.5 (re-scored on the new test split) by more than min_improvement "
        "0: champion moves to version 2"
    )
    assert result["tags"] == {"test_data_hash": "new"}
    assert store.aliases() == {"champion": "2", "challenger": "2"}


def test_a_champion_tagged_without_the_gate_metric_is_rescored_even_on_the_same_split(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.register({"accuracy": 0.95})
    params = RegisterParams(model_name="m", decide="point", gate_metric="f1_macro")

    def rescore(uri: str) -> Any:
        return {"f1_macro": 0.25}, None  # scored from its tags' split: no rows

    result = store.register({"accuracy": 0.6, "f1_macro": 0.5}, params=params, rescore=rescore)
    assert result["rescored"] is False and result["previous_metrics"] == {"f1_macro": 0.25}
    assert result["decision"].startswith("f1_macro 0.5 beats champion version 1's 0.25 (same test split)")


def test_a_champion_without_the_gate_metric_stays_and_the_decision_says_why(tmp_path: Path) -> None:
    """The decision is recorded on the version and returned, and the champion stays. (register() raised KeyError
    building its result, from previous[gate] of a champion without the gate metric, after it had written the tags.)"""
    store = Store(tmp_path)
    store.register({"accuracy": 0.95}, test_hash="old")
    run_id = store.run()
    result = store.register({"accuracy": 0.99}, run_id=run_id, test_hash="new", rescore=lambda uri: ({"r2": 0.1}, None))
    decision = (
        "champion stays version 1: it has no accuracy on this test data (it predicts something else), so the two are "
        "not compared; to serve version 2 instead, run `trainflow models promote 2`"
    )
    assert result["decision"] == decision
    assert (result["champion"], result["champion_version"], result["previous_champion"]) == (False, 1, 1)
    assert (result["previous_value"], result["previous_metrics"]) == (None, {"r2": 0.1})
    assert store.version_tags(2) == {"test_data_hash": "new", "metric.accuracy": "0.99", "registry_decision": decision}
    assert store.aliases() == {"champion": "1", "challenger": "2"}
    again = store.register({"accuracy": 0.99}, run_id=run_id, test_hash="new")
    assert (again["champion"], again["champion_version"]) == (False, 1)
    assert again["decision"] == (
        "already registered as version 2 by an earlier run of register, nothing changed (its decision then: "
        f"{decision})"
    )


def test_a_champion_that_fails_to_rescore_stays_and_says_how_to_promote_anyway(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.register({"accuracy": 0.95}, test_hash="old")

    def rescore(uri: str) -> Any:
        raise KeyError("column x")

    result = store.register({"accuracy": 0.99}, test_hash="new", rescore=rescore)
    decision = (
        "champion stays version 1: it could not be re-scored on the new test split (KeyError: 'column x'); to "
        "promote version 2 anyway, run `trainflow models promote 2 --name m --reason ...` (it keeps the history a "
        "rollback needs)"
    )
    assert (result["champion"], result["rescored"], result["previous_metrics"]) == (False, False, None)
    assert result["decision"] == decision
    assert store.version_tags(2)["registry_decision"] == decision
    assert store.aliases() == {"champion": "1", "challenger": "2"}


def test_a_rerun_of_a_decided_run_registers_nothing_and_reports_the_registry_as_it_is(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.register({"accuracy": 0.75})
    run_id = store.run()
    store.register({"accuracy": 0.5}, run_id=run_id)
    again = store.register({"accuracy": 0.5}, {"target": "y"}, run_id=run_id, test_hash="h2")
    assert again == {
        "model_name": "m",
        "version": 2,
        "model_uri": "models:/m/2",
        "gate_metric": "accuracy",
        "value": 0.5,
        "previous_champion": None,
        "previous_value": None,
        "previous_metrics": None,
        "rescored": False,
        "champion": False,
        "champion_version": 1,
        "decision": "already registered as version 2 by an earlier run of register, nothing changed (its decision "
        "then: accuracy 0.5 does not beat champion version 1's 0.75 (same test split) by more than min_improvement 0:"
        " stays version 1)",
        "decide": None,
        "comparison": None,
        "test_rows": None,
        "tags": {"target": "y", "test_data_hash": "h2"},
    }
    assert len(store.client.search_model_versions("name='m'")) == 2


def test_an_attempt_that_failed_before_deciding_is_completed_on_its_version(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.register({"accuracy": 0.75})
    run_id = store.run()
    source = f"{store.client.get_run(run_id).info.artifact_uri}/model"
    store.client.create_model_version("m", source, run_id=run_id)  # version 2: created, never decided
    result = store.register({"accuracy": 0.9}, {"data_hash": "d"}, run_id=run_id)
    assert (result["version"], result["champion"], result["previous_champion"]) == (2, True, 1)
    tags = store.version_tags(2)
    change(tags)
    assert tags == {
        "data_hash": "d",
        "test_data_hash": "h",
        "metric.accuracy": "0.9",
        "registry_decision": result["decision"],
    }
    assert len(store.client.search_model_versions("name='m'")) == 2


def test_an_interrupted_attempt_that_had_set_the_champion_is_recorded_as_such(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.register({"accuracy": 0.75})
    run_id = store.run()
    source = f"{store.client.get_run(run_id).info.artifact_uri}/model"
    store.client.create_model_version("m", source, run_id=run_id)
    store.client.set_registered_model_alias("m", "champion", "2")
    result = store.register({"accuracy": 0.1}, run_id=run_id)
    assert result["decision"] == "version 2 is the champion of m (set by an interrupted attempt)"
    assert (result["champion"], result["champion_version"], result["previous_champion"]) == (True, 2, None)
    assert store.model_tags() == {"champion_history": "[1, 2]"}


def test_the_same_model_from_another_run_is_not_registered_again(tmp_path: Path) -> None:
    store = Store(tmp_path)
    first = store.register({"accuracy": 0.75}, {"model_sha256": "abc", "data_hash": "d1"})
    assert first["version"] == 1
    again = store.register({"accuracy": 0.75}, {"model_sha256": "abc", "data_hash": "d2"}, test_hash="h9")
    assert again["version"] == 1 and again["champion"] is True and again["champion_version"] == 1
    assert again["tags"] == {"model_sha256": "abc", "data_hash": "d1", "test_data_hash": "h9"}
    assert again["decision"].startswith("no new version: run ")
    assert again["decision"].endswith(
        " exported byte for byte the model of version 1, nothing changed (its decision then: version 1 is the first "
        "champion of m)"
    )
    assert len(store.client.search_model_versions("name='m'")) == 1
    other = store.register({"accuracy": 0.5}, {"model_sha256": "def"})
    assert other["version"] == 2


def test_a_name_refuses_a_model_of_another_kind_naming_both(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.register({"accuracy": 0.75}, {"target": "species", "task": "classification"})
    with pytest.raises(UserError) as refused:
        store.register({"r2": 0.5}, {"target": "price", "task": "regression"})
    assert str(refused.value) == (
        "register: 'm' holds models predicting 'species' (classification); this run predicts 'price' (regression). "
        "One registered name holds one kind of model, so that the champion gate compares like with like: register "
        "this one under its own name, -S register.model_name=auto (named after the data) or "
        "-S register.model_name=<name>, then rerun `trainflow stage register`."
    )
    assert len(store.client.search_model_versions("name='m'")) == 1
    same = store.register({"accuracy": 0.5}, {"target": "species", "task": "classification"})
    assert same["version"] == 2


def test_a_name_registered_before_kind_tags_takes_its_kind_from_the_newest_version(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.client.create_registered_model("m")
    for target in ("old", "species"):
        run_id = store.run()
        source = f"{store.client.get_run(run_id).info.artifact_uri}/model"
        store.client.create_model_version("m", source, run_id=run_id, tags={"target": target, "task": "t"})
    registry.check_kind(store.client, "m", {"target": "species", "task": "t"})
    with pytest.raises(UserError, match=r"^register: 'm' holds models predicting 'species' \(t\); this run predicts "
                       r"'old' \(t\)\."):  # fmt: skip
        registry.check_kind(store.client, "m", {"target": "old", "task": "t"})
    registry.check_kind(store.client, "nothing", {"target": "x"})  # no such name: anything goes


def test_promote_and_rollback_move_the_champion_and_record_why(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.register({"accuracy": 0.75})
    store.register({"accuracy": 0.5})
    assert registry.promote("m", 2, "ticket 7") == {"model_name": "m", "champion": 2, "previous_champion": 1}
    assert store.aliases() == {"champion": "2", "challenger": "2"}
    assert store.model_tags() == {"champion_history": "[1, 2]"}
    assert change(store.version_tags(2)) == "promoted by hand (trainflow models promote): ticket 7"
    assert registry.champion_history(store.client, "m") == [1, 2]

    assert registry.rollback("m", "bad fix") == {"model_name": "m", "champion": 1, "previous_champion": 2}
    assert store.aliases() == {"champion": "1", "challenger": "2"}
    assert store.model_tags() == {"champion_history": "[1]"}
    tags1 = store.version_tags(1)
    assert change(tags1) == "rolled back to from version 2 (trainflow models rollback): bad fix"
    rolled = store.version_tags(2)["rolled_back"]
    assert CHANGE.fullmatch(rolled) and rolled.endswith(" bad fix")
    with pytest.raises(UserError) as only:
        registry.rollback("m", "again")
    assert str(only.value) == (
        "m: version 1 is the only champion it has had; nothing to roll back to (`trainflow models promote VERSION` "
        "makes another version champion)"
    )
    assert registry.promote("m", 1, "again") == {"model_name": "m", "champion": 1, "previous_champion": 1}
    assert store.model_tags() == {"champion_history": "[1]"}  # not listed twice


def test_the_models_commands_name_what_is_missing(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with pytest.raises(UserError) as no_model:
        registry.list_versions("m")
    assert str(no_model.value) == (
        f"no registered model 'm' in the tracking store {store.uri} (it holds no registered model yet); register "
        "one first (`trainflow run`), or name another with --name (`trainflow models list --all` lists them)"
    )
    store.client.create_registered_model("m")
    with pytest.raises(UserError) as no_champion:
        registry.rollback("m", "why")
    assert str(no_champion.value) == "m has no champion to roll back; `trainflow models promote VERSION` sets one"
    with pytest.raises(UserError) as no_version:
        registry.promote("m", 3, "why")
    assert str(no_version.value) == "m has no version 3; `trainflow models list` shows them"
    assert registry.list_versions("m") == []
    assert registry.champion_history(store.client, "m") == []


def test_models_list_gives_every_version_newest_first_with_all_it_knows(tmp_path: Path) -> None:
    store = Store(tmp_path)
    lineage = {"target": "y", "task": "classification", "data_hash": "d1"}
    store.register({"accuracy": 0.75, "f1_macro": 0.5}, lineage)
    store.register({"accuracy": 0.5}, {"target": "y", "task": "classification"})
    listed = registry.list_versions("m")
    v2, v1 = (store.client.get_model_version("m", v) for v in ("2", "1"))
    assert [v["version"] for v in listed] == [2, 1]
    first_change = listed[1]["champion_change"]
    assert CHANGE.fullmatch(first_change) and first_change.endswith(" register: version 1 is the first champion of m")
    assert listed == [
        {
            "version": 2,
            "aliases": ["challenger"],
            "metrics": {"accuracy": 0.5},
            "target": "y",
            "task": "classification",
            "data_hash": "",
            "run_id": v2.run_id,
            "created": v2.creation_timestamp,
            "champion_change": "",
        },
        {
            "version": 1,
            "aliases": ["champion"],
            "metrics": {"accuracy": 0.75, "f1_macro": 0.5},
            "target": "y",
            "task": "classification",
            "data_hash": "d1",
            "run_id": v1.run_id,
            "created": v1.creation_timestamp,
            "champion_change": first_change,
        },
    ]
    registry.promote("m", 2, "r")
    assert [v["aliases"] for v in registry.list_versions("m")] == [["challenger", "champion"], []]


def test_paired_without_the_challenger_s_rows_is_a_programming_error(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with pytest.raises(ValueError) as bad:
        store.register({"accuracy": 0.5}, params=RegisterParams(model_name="m"))
    assert str(bad.value) == "register.decide: paired needs the challenger's per-row outputs"


# --- params: the whole message of each invalid value ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "path", "message"),
    [
        ({"train": {"min_lr": 1, "lr": 0.1}}, "train", "train.min_lr (1) is above train.lr (0.1); lower min_lr"),
        ({"data": {"target": "y", "features": ["a", "y"]}}, "data",
         "data.features lists the target column 'y'; remove it from the list"),
        ({"data": {"target": "y", "exclude": ["y"]}}, "data",
         "data.exclude lists the target column 'y'; the target is never a feature"),
        ({"data": {"columns": ["a", "b"]}}, "data",
         "data.columns names the columns of header-less files: set data.header: false too"),
        ({"data": {"target": "t", "text_column": "t"}}, "data",
         "data.text_column is the target column; name the text feature"),
        ({"data": {"text_column": "t", "image_column": "t"}}, "data",
         "data.image_column is the target or the text column; name the column of image paths"),
        ({"data": {"source": "builtin:nope"}}, "data",
         "data.source: unknown built-in dataset; choose one of builtin:digits, builtin:iris, builtin:wine, "
         "builtin:breast_cancer, builtin:diabetes, builtin:digits_images"),
        ({"register": {"min_delta": 0.1}}, "register",
         "min_delta was renamed register.min_improvement (it applies to both register.decide rules); rename it in "
         "params.yaml"),
        ({"train": {"max_time": "abc"}}, "train.max_time",
         "'abc' is not a duration; write seconds (3600) or e.g. 20s, 45m, 2h, 1h30m, 1d (got 'abc')"),
        ({"train": {"max_time": 0}}, "train.max_time", "must be a positive duration, got 0 (got 0)"),
        ({"train": {"preempt_signals": ["SIGFOO", "SIGBAR"]}}, "train.preempt_signals",
         "unknown signal(s) SIGFOO, SIGBAR; use names such as SIGTERM, SIGINT, SIGUSR1 (got ['SIGFOO', 'SIGBAR'])"),
        ({"train": {"preempt_signals": ["SIGKILL", "SIGSTOP"]}}, "train.preempt_signals",
         "SIGKILL, SIGSTOP cannot be caught; a process killed so resumes from its last periodic checkpoint "
         "(got ['SIGKILL', 'SIGSTOP'])"),
        ({"train": {"world_size": 0}}, "train.world_size", "must be at least 1 (or auto) (got 0)"),
        ({"train": {"batch_size": 0}}, "train.batch_size", "must be at least 1 (or auto) (got 0)"),
        ({"trian": {}}, "trian",
         "unknown parameter (check the spelling; `trainflow params schema` lists the valid ones)"),
        ({"train": {"batch_size": "auto"}}, "train",
         "train.batch_size auto needs train.global_batch (the samples per optimizer update to keep, e.g. "
         "global_batch: 64); set it, or set batch_size to a number"),
        ({"train": {"batch_size": "auto", "global_batch": 64, "accumulate": 2}}, "train",
         "train.accumulate (2): batch_size auto chooses it (global_batch / world_size / batch_size); leave accumulate "
         "at 1, or set batch_size to a number"),
        ({"train": {"global_batch": 64, "batch_size": 16, "accumulate": 2, "world_size": 1}}, "train",
         "train.global_batch (64) is not train.batch_size * train.accumulate * world size (16 * 2 * 1 = 32); make "
         "them agree, set global_batch: null, or set batch_size: auto to have batch_size and accumulate chosen for "
         "it"),
        ({"tune": {"space": {"data.x": {"type": "float", "low": 0, "high": 1}}}}, "tune.space.data.x",
         "a sweep varies features, model, train params (data and split stay fixed for a study); write section.field, "
         "e.g. train.lr"),
        ({"tune": {"space": {"train.device": {"type": "categorical", "choices": ["cpu"]}}}}, "tune.space.train.device",
         "not a hyperparameter (a trial runs in one process)"),
        ({"tune": {"space": {"train.nope": {"type": "categorical", "choices": [1]}}}}, "tune.space.train.nope",
         "train has no field 'nope' (`trainflow params schema` lists them)"),
        ({"tune": {"space": {"train.lr.x": {"type": "categorical", "choices": [1]}}}}, "tune.space.train.lr.x",
         "train.lr has no sub-fields"),
        ({"tune": {"space": {"train.lr": {"type": "float", "low": 2, "high": 1}}}}, "tune.space.train.lr",
         "low (2) is above high (1)"),
        ({"tune": {"space": {"train.lr": {"type": "float", "choices": [1]}}}}, "tune.space.train.lr",
         "a float dimension takes `low` and `high`, not choices"),
        ({"tune": {"space": {"train.lr": {"type": "categorical", "low": 1}}}}, "tune.space.train.lr",
         "a categorical dimension takes `choices` (a list), not low/high"),
        ({"tune": {"space": {"train.lr": {"type": "float", "low": 0, "high": 1, "log": True}}}}, "tune.space.train.lr",
         "log: true needs low > 0 and no step"),
        ({"tune": {"space": {"train.epochs": {"type": "int", "low": 1, "high": 2.5}}}}, "tune.space.train.epochs",
         "an int dimension takes whole numbers for low, high and step"),
        ({"tune": {"space": {"train.epochs": {"type": "int", "low": 0, "high": 3}}}}, "tune.space.train.epochs",
         "0 is not a valid value (must be at least 1 (or auto) (got 0))"),
        ({"deploy": {"name": "-x"}}, "deploy.name",
         "must be letters, digits, '.', '_' or '-', starting with a letter or digit (got '-x')"),
        ({"deploy": {"timezone": "Mars/Base"}}, "deploy.timezone",
         "unknown time zone; use an IANA name such as UTC, Europe/Paris, America/New_York (got 'Mars/Base')"),
    ],
)  # fmt: skip
def test_an_invalid_value_is_reported_with_its_path_and_the_whole_message(
    raw: dict[str, Any], path: str, message: str
) -> None:
    from trainflow.params import validate

    with pytest.raises(ParamsError) as bad:
        validate(raw, "p.yaml")
    assert bad.value.problems == [(path, message)]
    assert str(bad.value) == f"p.yaml: 1 invalid parameter:\n  {path}: {message}\n{FIX}"


def test_every_problem_is_reported_at_once_counted_in_the_plural() -> None:
    from trainflow.params import validate

    with pytest.raises(ParamsError) as bad:
        validate({"seed": -1, "train": {"lr": "fast"}, "x": 1}, "src")
    assert str(bad.value).splitlines() == [
        "src: 3 invalid parameters:",
        "  seed: Input should be greater than or equal to 0 (got -1)",
        "  train.lr: Input should be a valid number, unable to parse string as a number (got 'fast')",
        "  x: unknown parameter (check the spelling; `trainflow params schema` lists the valid ones)",
        FIX,
    ]


@pytest.mark.parametrize(
    ("text", "keys", "value"),
    [("train.lr=3.0e-4", ["train", "lr"], 3e-4), ("train.lr=3e-4", ["train", "lr"], "3e-4"),  # YAML 1.1: a string
     (" seed =7", ["seed"], 7), ("data.target=", ["data", "target"], ""),
     ("a.b=[1, 2]", ["a", "b"], [1, 2]), ("a=x=y", ["a"], "x=y")],
)  # fmt: skip
def test_an_override_is_a_dotted_key_and_a_yaml_value(text: str, keys: list[str], value: Any) -> None:
    from trainflow.params import parse_override

    assert parse_override(text) == (keys, value)


@pytest.mark.parametrize("text", ["train.lr", "=3", "a..b=1", ".a=1", "a.=1"])
def test_an_override_without_a_whole_key_says_what_it_must_look_like(text: str) -> None:
    from trainflow.params import parse_override

    with pytest.raises(ParamsError) as bad:
        parse_override(text)
    assert bad.value.source == "-S"
    assert bad.value.problems == [(text, "an override must look like key.subkey=value, e.g. -S train.lr=3e-4")]


def test_an_override_with_invalid_yaml_names_the_key_and_the_value() -> None:
    from trainflow.params import parse_override

    with pytest.raises(ParamsError) as bad:
        parse_override("train.lr=[1")
    ((key, message),) = bad.value.problems
    assert key == "train.lr" and message.startswith("value '[1' is not valid YAML: ")


def test_apply_overrides_sets_nested_keys_in_a_copy() -> None:
    from trainflow.params import apply_overrides

    raw = {"train": {"lr": 1}, "seed": 1, "data": "flat"}
    out = apply_overrides(raw, ["train.lr=2", "model.name=mlp", "data.target=y"])
    assert out == {"train": {"lr": 2}, "seed": 1, "data": {"target": "y"}, "model": {"name": "mlp"}}
    assert raw == {"train": {"lr": 1}, "seed": 1, "data": "flat"}


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(90, 90.0), (1.5, 1.5), ("20s", 20.0), ("45m", 2700.0), ("2h", 7200.0), ("1h30m", 5400.0), ("1d", 86400.0),
     ("1d 2h 3m 4.5s", 93784.5), ("0.5h", 1800.0)],
)  # fmt: skip
def test_durations_are_seconds_or_days_hours_minutes_seconds(value: float | str, seconds: float) -> None:
    from trainflow.params import duration_seconds

    assert duration_seconds(value) == seconds


@pytest.mark.parametrize("value", ["", "3x", "h", "1h1d"])
def test_a_duration_that_is_none_says_how_to_write_one(value: str) -> None:
    from trainflow.params import duration_seconds

    with pytest.raises(ValueError) as bad:
        duration_seconds(value)
    assert str(bad.value) == f"{value!r} is not a duration; write seconds (3600) or e.g. 20s, 45m, 2h, 1h30m, 1d"


def test_a_params_file_with_a_key_twice_names_both_lines(tmp_path: Path) -> None:
    from trainflow.params import read_raw

    path = tmp_path / "params.yaml"
    path.write_text("train:\n  lr: 1\n  lr: 2\nseed: 1\nlist:\n  - {a: 1, a: 2}\n")
    with pytest.raises(ParamsError) as bad:
        read_raw(path)
    assert bad.value.source == str(path)
    assert bad.value.problems == [
        ("train.lr", "given twice (lines 2 and 3); keep one of them"),
        ("list[0].a", "given twice (lines 6 and 6); keep one of them"),
    ]


def test_a_params_file_that_is_missing_broken_or_not_a_mapping_says_so(tmp_path: Path) -> None:
    from trainflow.params import read_raw

    path = tmp_path / "params.yaml"
    with pytest.raises(ParamsError) as missing:
        read_raw(path)
    assert missing.value.problems == [("<file>", "file not found; run from the project root or create params.yaml")]
    path.write_text("- a\n- b\n")
    with pytest.raises(ParamsError) as listed:
        read_raw(path)
    assert listed.value.problems == [("<root>", "params.yaml must be a mapping of sections")]
    path.write_text("a: [1\n")
    with pytest.raises(ParamsError) as broken:
        read_raw(path)
    assert broken.value.problems[0][0] == "<file>" and broken.value.problems[0][1].startswith("not valid YAML: ")
    path.write_text("")
    assert read_raw(path) == {}


def test_loaded_params_with_overrides_name_the_overrides_as_their_source(tmp_path: Path) -> None:
    from trainflow.params import load_params

    path = tmp_path / "params.yaml"
    path.write_text("seed: 1\n")
    assert load_params(path, ["seed=5"]).seed == 5
    with pytest.raises(ParamsError) as bad:
        load_params(path, ["seed=-1"])
    assert bad.value.source == f"{path} with -S overrides"
    path.write_text("seed: -1\n")
    with pytest.raises(ParamsError) as plain:
        load_params(path)
    assert plain.value.source == str(path)


def test_the_default_search_space_is_lr_dropout_and_hidden_sizes() -> None:
    from trainflow.params import default_space

    assert {k: v.model_dump() for k, v in default_space().items()} == {
        "train.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True, "step": None, "choices": None},
        "model.dropout": {"type": "float", "low": 0.0, "high": 0.5, "log": False, "step": None, "choices": None},
        "model.hidden_sizes": {
            "type": "categorical", "low": None, "high": None, "log": False, "step": None,
            "choices": [[128], [256, 128], [512, 256]],
        },
    }  # fmt: skip


# --- plots: what each figure draws ------------------------------------------------------------------------------------


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures the plots draw, kept open to read back."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kept: list[Any] = []
    monkeypatch.setattr(plt, "close", kept.append)
    return kept


def _lines(ax: Any) -> list[tuple[list[float], list[float], str]]:
    return [
        (list(map(float, line.get_xdata())), list(map(float, line.get_ydata())), line.get_label())
        for line in ax.get_lines()
    ]


def test_training_curves_draw_both_losses_and_the_validation_metric(tmp_path: Path, figures: list[Any]) -> None:
    from trainflow.plots import training_curves

    history = pd.DataFrame({"epoch": [1, 2], "train_loss": [0.9, 0.5], "val_loss": [1.0, 0.7], "val_r2": [0.1, 0.4]})
    training_curves(history, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    (fig,) = figures
    loss, metric = fig.axes
    assert _lines(loss) == [([1, 2], [0.9, 0.5], "train"), ([1, 2], [1.0, 0.7], "val")]
    assert (loss.get_xlabel(), loss.get_ylabel(), loss.get_title()) == ("epoch", "loss (mean per sample)", "Loss")
    assert [t.get_text() for t in loss.get_legend().get_texts()] == ["train", "val"]
    assert _lines(metric) == [([1, 2], [0.1, 0.4], "_child0")]
    assert (metric.get_xlabel(), metric.get_ylabel(), metric.get_title()) == ("epoch", "R²", "Validation R²")
    assert metric.get_lines()[0].get_color() == "tab:green"
    assert list(fig.get_size_inches()) == [10, 4]


def test_training_curves_prefer_accuracy_and_fall_back_to_the_loss(tmp_path: Path, figures: list[Any]) -> None:
    from trainflow.plots import training_curves

    base = {"epoch": [1], "train_loss": [0.9], "val_loss": [1.0]}
    training_curves(pd.DataFrame({**base, "val_r2": [0.3], "val_accuracy": [0.5]}), tmp_path / "a.png")
    training_curves(pd.DataFrame(base), tmp_path / "b.png")
    titles = [(f.axes[1].get_title(), f.axes[1].get_ylabel(), _lines(f.axes[1])[0][1]) for f in figures]
    assert titles == [("Validation accuracy", "accuracy", [0.5]), ("Validation loss", "loss", [1.0])]


def test_predicted_vs_actual_scatters_the_points_over_the_diagonal(tmp_path: Path, figures: list[Any]) -> None:
    from trainflow.plots import predicted_vs_actual

    predicted_vs_actual(np.array([1.0, 2.0, 5.0]), np.array([0.5, 2.5, 4.0]), tmp_path / "p.png")
    (fig,) = figures
    (ax,) = fig.axes
    assert ax.collections[0].get_offsets().tolist() == [[1.0, 0.5], [2.0, 2.5], [5.0, 4.0]]
    assert _lines(ax) == [([0.5, 5.0], [0.5, 5.0], "_child1")]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("actual", "predicted", "Predicted vs actual (test)")
    assert list(fig.get_size_inches()) == [5, 5]


def test_roc_and_pr_curves_are_labelled_with_their_areas(tmp_path: Path, figures: list[Any]) -> None:
    from trainflow.plots import roc_pr_curves

    labels = np.array([0, 0, 1, 1])
    proba = np.array([[0.9, 0.1], [0.6, 0.4], [0.65, 0.35], [0.2, 0.8]])
    roc_pr_curves(labels, proba, ["no", "yes"], tmp_path / "r.png")
    (fig,) = figures
    roc, pr = fig.axes
    # scores of "yes": 0.1, 0.4 (negatives), 0.35, 0.8 (positives): 3 of 4 pairs ordered, AUC 0.75;
    # AP: at 0.8 precision 1 (recall 0.5), at 0.35 precision 2/3 (recall 1): 0.5 * 1 + 0.5 * 2/3
    assert [line.get_label() for line in roc.get_lines()] == ["_child0", "yes (AUC 0.750)"]
    assert [line.get_label() for line in pr.get_lines()] == ["yes (AP 0.833)"]
    assert _lines(roc)[0][:2] == ([0, 1], [0, 1])
    assert _lines(roc)[1][:2] == ([0.0, 0.0, 0.5, 0.5, 1.0], [0.0, 0.5, 0.5, 1.0, 1.0])
    assert (roc.get_xlabel(), roc.get_ylabel(), roc.get_title()) == (
        "false positive rate",
        "true positive rate",
        "ROC (test, positive class)",
    )
    assert (pr.get_xlabel(), pr.get_ylabel(), pr.get_title()) == (
        "recall",
        "precision",
        "Precision-recall (test, positive class)",
    )
    assert pr.get_ylim() == (0, 1.02)
    assert pr.get_lines()[0].get_drawstyle() == "steps-post"
    assert roc.get_legend() is not None and pr.get_legend() is not None


def test_roc_titles_say_one_vs_rest_or_the_top_classes(tmp_path: Path, figures: list[Any]) -> None:
    from trainflow.plots import roc_pr_curves

    rng = np.random.default_rng(0)
    for k in (3, 12):
        labels = np.arange(60) % k
        proba = rng.dirichlet(np.ones(k), 60)
        roc_pr_curves(labels, proba, [f"c{i}" for i in range(k)], tmp_path / f"{k}.png")
    assert [f.axes[0].get_title() for f in figures] == ["ROC (test, one vs rest)", "ROC (test, top 10 of 12 classes)"]
    assert [len(f.axes[0].get_lines()) for f in figures] == [4, 11]


def test_the_history_table_puts_update_epoch_loss_first_and_lr_last() -> None:
    from trainflow.plots import history_frame

    frame = history_frame([{"lr": 0.1, "val_b": 1.0, "epoch": 1, "val_a": 2.0, "update": 5, "train_loss": 0.5}])
    assert list(frame.columns) == ["update", "epoch", "train_loss", "val_a", "val_b", "lr"]
    assert list(history_frame([{"val_x": 1.0, "epoch": 2}]).columns) == ["epoch", "val_x"]


def test_a_source_outside_data_raw_is_refused_with_the_commands_that_copy_it_in(tmp_path: Path) -> None:
    from trainflow.params import load_params

    project = tmp_path / "proj"
    project.mkdir()
    (project / "params.yaml").write_text("data:\n  source: ../x.csv\n  target: y\nseed: -1\n")
    with pytest.raises(ParamsError) as bad:
        load_params(project / "params.yaml")
    assert bad.value.problems == [
        ("seed", "Input should be greater than or equal to 0 (got -1)"),
        ("data.source",
         f"../x.csv is outside the project ({project}): DVC watches only data/raw/ for the ingest stage, so rows added "
         f"to it later would leave `dvc status` clean and the model stale. Copy it into data/raw/ and track it: "
         f"`cp {tmp_path / 'x.csv'} data/raw/ && dvc add data/raw/x.csv`, then rerun with "
         "`-S data.source=data/raw/x.csv`"),
    ]  # fmt: skip
    (project / "params.yaml").write_text("data:\n  source: data/raw/x.csv\n  target: y\n")
    assert load_params(project / "params.yaml").data.source == "data/raw/x.csv"


def test_written_overrides_keep_the_file_s_nulls_and_comments(tmp_path: Path) -> None:
    from trainflow.params import write_overrides

    path = tmp_path / "params.yaml"
    path.write_text("seed: 1  # the seed\ntrain:\n  max_time: null\n  lr: 0.1\n")
    write_overrides(path, ["seed=2", "train.lr=0.5", "data.exclude=[a, b]"])
    assert path.read_text() == ("seed: 2  # the seed\ntrain:\n  max_time: null\n  lr: 0.5\ndata:\n  exclude: [a, b]\n")


def test_a_glob_outside_data_raw_is_copied_in_as_a_folder_of_its_own(tmp_path: Path) -> None:
    from trainflow.params import source_outside

    project = tmp_path / "proj"
    project.mkdir()
    assert source_outside("../in/*.csv", project) == (
        f"../in/*.csv is outside the project ({project}): DVC watches only data/raw/ for the ingest stage, so rows "
        "added to it later would leave `dvc status` clean and the model stale. Copy it into data/raw/ and track it: "
        f"`mkdir -p data/raw/in && cp {tmp_path / 'in'}/*.csv data/raw/in/ && dvc add data/raw/in`, then rerun with "
        "`-S 'data.source=data/raw/in/*.csv'`"
    )
    assert source_outside("builtin:iris", project) is None
    assert source_outside("data/raw/a.csv", project) is None


def test_a_cron_prefect_cannot_read_is_refused_with_examples() -> None:
    from trainflow.params import validate

    with pytest.raises(ParamsError) as bad:
        validate({"deploy": {"cron": "every day"}}, "p.yaml")
    assert bad.value.problems == [
        ("deploy.cron",
         "not a cron expression Prefect accepts: five fields minute hour day-of-month month day-of-week, e.g. "
         "'0 3 * * *' (daily at 03:00) or '0 3 * * 1' (Mondays at 03:00); H and R are not supported "
         "(got 'every day')"),
    ]  # fmt: skip


def test_the_confusion_matrix_names_its_axes_and_cells(figures: list[Any], tmp_path: Path) -> None:
    """Rows are the actual class, columns the predicted one; each cell its row share over its count."""
    from trainflow import plots

    plots.confusion_matrix(np.array([0, 0, 1, 1]), np.array([0, 1, 1, 1]), ["a", "b"], tmp_path / "cm.png")
    (fig,) = figures
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("predicted", "actual")
    assert ax.get_title() == "Confusion matrix (test)\neach cell: % of the actual class's rows (count)"
    assert [t.get_text() for t in ax.texts] == ["50%\n(1)", "50%\n(1)", "100%\n(2)"]
    assert fig.axes[1].get_ylabel() == "share of the actual class's test rows"


def test_a_store_that_stops_answering_while_the_champion_is_re_scored_decides_nothing_and_says_rerun(
    tmp_path: Path,
) -> None:
    """The champion's files cannot be fetched (the store is down): not "the champion stays", but a ServiceError that
    names the store and says to rerun register; no decision tag is written."""
    import mlflow

    store = Store(tmp_path)
    store.register({"accuracy": 0.95}, test_hash="old")

    def down(uri: str) -> Any:
        raise ConnectionError("connection reset")

    with pytest.raises(ServiceError) as exc:
        store.register({"accuracy": 0.99}, test_hash="new", rescore=down)
    assert str(exc.value).endswith(
        f"the MLflow tracking store at {mlflow.get_tracking_uri()} did not answer (ConnectionError: connection "
        "reset). That is no answer about what the registry holds, so nothing was decided and the champion alias is "
        "as it was. Rerun `trainflow stage register` (or the flow) once it answers: the rerun completes this "
        "registration, and a run never registers a second version."
    )
    assert "registry_decision" not in store.version_tags(2)
    assert store.aliases()["champion"] == "1"
