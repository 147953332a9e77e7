"""A real MLflow tracking server that goes down at the start, in the middle or at the end of training: train and
evaluate complete and keep everything locally, with one warning; register then fails with a clear error (exit 1,
outputs intact) and succeeds once the server is back, registering the model exactly once. And a server that answers
the champion lookup with 503: once is retried by MLflow's own HTTP retries, always is an error, never "no champion"."""

from __future__ import annotations

import http.server
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.projects import make_project
from support.servers import free_port, wait_for_http

from trainflow import cli
from trainflow.core import outage
from trainflow.core.io import read_json
from trainflow.core.paths import Paths
from trainflow.engine.trainer import Trainer
from trainflow.params import load_params
from trainflow.stages import run_stage

pytestmark = pytest.mark.slow


class Server:
    """`mlflow server` on 127.0.0.1:port over one SQLite store, which survives stop() and start()."""

    def __init__(self, store: Path, port: int) -> None:
        self.store, self.port = store, port
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        mlflow = Path(sys.executable).parent / "mlflow"
        args = [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
                "--backend-store-uri", f"sqlite:///{self.store / 'mlflow.db'}",
                "--default-artifact-root", str(self.store / "artifacts")]  # fmt: skip
        log = open(self.store / "server.log", "ab")  # noqa: SIM115 - the server's, closed with the process
        self.proc = subprocess.Popen(args, stdout=log, stderr=log, start_new_session=True)
        proc, server_log = self.proc, self.store / "server.log"
        wait_for_http(f"{self.uri}/health", lambda: None if proc.poll() is None else server_log.read_text()[-2000:], 90)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # as a crash: no goodbye to the clients
            self.proc.wait()


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    store = tmp_path / "server"
    store.mkdir()
    srv = Server(store, free_port())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", srv.uri)
    yield srv
    srv.stop()


def stage(root: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> int:
    monkeypatch.chdir(root)
    return cli.main(["stage", name])


def outputs(root: Path) -> dict[str, bytes]:
    files = [*(root / "models" / "final").iterdir(), root / "reports" / "metrics.json"]
    return {p.name: p.read_bytes() for p in files}


def tracking_warnings(caught: list[Any]) -> list[str]:
    return [str(w.message) for w in caught if "MLflow tracking at" in str(w.message)]


@pytest.fixture(scope="module")
def split_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An iris project, ingested and split (neither stage talks to MLflow): each case copies it."""
    settings = {"data.source": "builtin:iris", "register.model_name": "iris", "train.epochs": 6,
                "train.log_every": 2, "train.progress": "false"}  # fmt: skip
    root = make_project(tmp_path_factory.mktemp("outage") / "proj", settings)
    paths = Paths(root)
    for name in ("ingest", "split"):
        run_stage(name, load_params(paths.params), paths)
    return root


@pytest.mark.parametrize("when", ["start", "middle", "end"])
def test_training_survives_a_tracking_outage_and_register_catches_up(
    tmp_path: Path,
    server: Server,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    when: str,
    split_project: Path,
) -> None:
    root = Path(shutil.copytree(split_project, tmp_path / "proj"))
    paths = Paths(root)
    if when != "start":
        server.start()
    if when == "middle":  # the server dies at the first metrics read, while the run is going
        original_log = Trainer._log

        def log_then_die(self: Trainer, bar: Any) -> None:
            server.stop()
            original_log(self, bar)

        monkeypatch.setattr(Trainer, "_log", log_then_die)
    if when == "end":  # the server dies once the weights are trained, before the model is logged
        original_fit = Trainer.fit

        def fit_then_die(self: Trainer, *args: Any) -> Any:
            state = original_fit(self, *args)
            server.stop()
            return state

        monkeypatch.setattr(Trainer, "fit", fit_then_die)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert stage(root, monkeypatch, "train") == 0
        assert stage(root, monkeypatch, "evaluate") == 0
    assert len(tracking_warnings(caught)) == 1, tracking_warnings(caught)
    train_run = read_json(paths.train_run)
    assert train_run["model_uri"] is None and train_run["tracking_error"]
    assert (train_run["run_id"] is None) == (when == "start")
    assert (paths.final / "model.safetensors").is_file() and read_json(paths.metrics)["accuracy"] > 0.8
    # Every logged point is kept locally: the train metrics every 2 updates, the val metrics every epoch.
    local = read_json(paths.reports / "train_metrics_local.json")
    updates, epochs = (read_json(paths.final / "training.json")[k] for k in ("updates", "epochs"))
    assert [p["step"] for p in local if "train_loss" in p] == list(range(2, updates + 1, 2))
    assert len([p for p in local if "val_loss" in p]) == epochs

    # Register needs the server: a clear error, exit 1, and train's and evaluate's outputs untouched.
    before = outputs(root)
    capsys.readouterr()
    assert stage(root, monkeypatch, "register") == 1
    err = capsys.readouterr().err
    assert f"the MLflow tracking store at {server.uri} did not answer" in err and "Traceback" not in err
    assert "Rerun `trainflow stage register`" in err
    assert outputs(root) == before and not paths.registration.exists()

    # The server is back: register logs the model (into train's run, if it had one) and registers it, once.
    server.start()
    assert stage(root, monkeypatch, "register") == 0
    assert stage(root, monkeypatch, "register") == 0  # a rerun registers nothing more
    from mlflow.tracking import MlflowClient

    versions = MlflowClient(server.uri).search_model_versions("name='iris'")
    assert [int(v.version) for v in versions] == [1]
    registration = read_json(paths.registration)
    assert registration["version"] == 1 and registration["champion"] is True
    if train_run["run_id"] is not None:
        assert versions[0].run_id == train_run["run_id"]
    import mlflow.pyfunc
    import pandas as pd

    test = pd.read_parquet(paths.split_file("test"))
    served = mlflow.pyfunc.load_model("models:/iris@champion").predict(test)
    assert (served["prediction"] == test["target"].astype(str)).mean() == pytest.approx(
        read_json(paths.metrics)["accuracy"]
    )


class Flaky:
    """An HTTP proxy to `upstream` that answers 503 (with MLflow's JSON) to the first `times` GET requests whose path
    holds `path` (lookups: setting an alias is a POST to the same path), and passes every other request through."""

    def __init__(self, upstream: str, path: str, times: int) -> None:
        self.upstream, self.path, self.times, self.seen = upstream, path, times, 0
        flaky = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                flaky.handle(self)

            do_POST = do_PATCH = do_DELETE = do_GET

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0)) or None
        lookup = h.command == "GET" and self.path in h.path
        self.seen += lookup
        if lookup and self.seen <= self.times:
            status, data = 503, b'{"error_code": "TEMPORARILY_UNAVAILABLE", "message": "busy, try again"}'
        else:
            headers = {"Content-Type": h.headers.get("Content-Type") or "application/json"}
            request = urllib.request.Request(self.upstream + h.path, data=body, method=h.command, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    status, data = answer.status, answer.read()
            except urllib.error.HTTPError as error:  # MLflow's 4xx answers, passed on as they are
                status, data = error.code, error.read()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_over_a_server_a_503_once_is_retried_and_only_not_found_means_no_champion(
    tmp_path: Path, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from trainflow import tracking
    from trainflow.core.errors import ServiceError
    from trainflow.params import RegisterParams
    from trainflow.registry import registry

    server.start()
    proxy = Flaky(server.uri, "/registered-models/alias", times=0)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", proxy.uri)
    for key, value in tracking.HTTP_DEFAULTS.items():
        monkeypatch.setenv(key, value)  # trainflow's own HTTP retries: 2, with backoff
    tracking.configure(tmp_path)
    client = MlflowClient()
    experiment = tracking.ensure_experiment("trainflow", tmp_path)

    def model_run() -> str:
        run_id = str(client.create_run(experiment).info.run_id)
        (tmp_path / run_id).mkdir()
        (tmp_path / run_id / "MLmodel").write_text("flavors: {}\n")
        client.log_artifacts(run_id, str(tmp_path / run_id), "model")
        return run_id

    def no_rescore(uri: str) -> dict[str, float]:
        raise AssertionError(f"{uri} re-scored, but the test split is the same")

    def register(accuracy: float, run_id: str) -> dict[str, Any]:
        # the point rule: the accuracies are made up (the paired rule would re-score both models)
        uri, params, metrics = (
            f"runs:/{run_id}/model",
            RegisterParams(model_name="m", decide="point"),
            {"accuracy": accuracy},
        )
        return registry.register(uri, run_id, params, metrics, {}, test_hash="h", rescore=no_rescore)

    # The champion lookup is answered 503 once: MLflow's HTTP retry asks again, and the answer decides.
    proxy.times = proxy.seen + 1
    assert register(0.99, model_run())["decision"] == "version 1 is the first champion of m"
    assert proxy.seen == proxy.times + 1  # the 503 and the retry
    proxy.times = proxy.seen + 1
    second = register(0.50, model_run())
    assert second["champion"] is False and second["previous_value"] == 0.99, second["decision"]
    assert proxy.seen == proxy.times + 1
    # 503 on every try: an error naming the server and no decision; the rerun decides once the server answers.
    proxy.times = proxy.seen + 99
    third = model_run()
    with pytest.raises(
        ServiceError, match=f"looking up the champion of 'm': the MLflow tracking store at {proxy.uri} did not answer"
    ):
        register(0.10, third)
    assert client.get_registered_model("m").aliases == {"champion": "1", "challenger": "3"}
    assert registry.DECISION_TAG not in client.get_model_version("m", "3").tags
    proxy.times = proxy.seen
    assert register(0.10, third)["champion_version"] == 1
    # What the server answers for what is not there: "not found", the one answer that means "no champion".
    for missing in (
        lambda: client.get_model_version_by_alias("m", "nobody"),
        lambda: client.get_model_version_by_alias("nothing", "champion"),
        lambda: client.get_registered_model("nothing"),
        lambda: client.get_model_version("m", "7"),
    ):
        with pytest.raises(MlflowException) as absent:
            missing()
        assert outage.not_found(absent.value), absent.value
    proxy.close()
