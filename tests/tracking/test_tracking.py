"""trainflow.tracking's training run and helpers, whole: every param, tag and metric a training run logs, its first
failure warned once, the run folder, the tracking URI and HTTP settings, closing loggers, ending orphaned runs and
finding the run that logged a model. Each value is written out by hand from the inputs. (MLflowLogger:
test_tracking_logger.py.)"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

from trainflow import tracking


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
