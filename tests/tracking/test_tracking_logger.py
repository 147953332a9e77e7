"""MLflowLogger: metrics reach MLflow off the training hot path; a slow or failing server never hurts training."""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from trainflow import tracking
from trainflow.core.io import read_json
from trainflow.tracking import MLflowLogger


@pytest.fixture(autouse=True)
def _store() -> Iterator[str]:
    """The test's store (conftest's copy of an empty one), set globally (other tests may have pointed mlflow
    elsewhere)."""
    uri = os.environ["MLFLOW_TRACKING_URI"]
    mlflow.set_tracking_uri(uri)
    yield uri
    mlflow.set_tracking_uri(None)  # type: ignore[arg-type]


def steps(n: int) -> list[dict[str, Any]]:
    """What the engine logs: a few float metrics per step, NaN and inf included."""
    out = []
    for s in range(n):
        loss = math.nan if s == 3 else (math.inf if s == 4 else 1.0 / (s + 1))
        out.append({"loss": loss, "lr": 0.1 * 0.9**s})
    return out


def same(a: Any, b: Any) -> bool:
    """Equality that treats NaN as equal to NaN."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


class FakeServer:
    """Stands in for MlflowClient.log_batch: records calls, can block (a slow server) or raise (a broken one)."""

    def __init__(self, *, block_s: float = 0.0, fail_from_call: int | None = None) -> None:
        self.block_s = block_s
        self.fail_from_call = fail_from_call
        self.calls: list[list[Any]] = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def log_batch(self, client: Any, run_id: str, metrics: Any = (), **kwargs: Any) -> None:
        self.calls.append(list(metrics))
        self.entered.set()
        if self.block_s:
            self.release.wait(self.block_s)  # sleeps block_s unless the test lets it go early
        if self.fail_from_call is not None and len(self.calls) >= self.fail_from_call:
            raise ConnectionError("tracking server down")

    def sent(self) -> list[tuple[str, float, int]]:
        return [(m.key, m.value, m.step) for call in self.calls for m in call]


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeServer]:
    fake = FakeServer()
    monkeypatch.setattr(MlflowClient, "log_batch", lambda self, *a, **kw: fake.log_batch(self, *a, **kw))
    yield fake
    fake.release.set()  # never leave a background thread blocked past the test


def test_metrics_arrive_in_mlflow_with_their_steps(tmp_path: Path) -> None:
    client = MlflowClient()
    run_id = client.create_run(client.create_experiment("t")).info.run_id
    logged = steps(30)
    logger = MLflowLogger(run_id, fallback=tmp_path / "local.json", flush_every=7, flush_interval_s=0.05)
    for s, metrics in enumerate(logged):
        logger.log(metrics, step=s)
    logger.close()

    for key in ("loss", "lr"):
        history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
        assert [m.step for m in history] == list(range(30))
        # NaN arrives as NaN; MLflow's SQL store keeps +inf as the largest float.
        expected = [sys.float_info.max if row[key] == math.inf else row[key] for row in logged]
        assert same([m.value for m in history], expected)
    assert not (tmp_path / "local.json").exists()  # nothing failed: no fallback file


def test_slow_server_never_slows_log(tmp_path: Path, server: FakeServer) -> None:
    server.block_s = 2.0
    logger = MLflowLogger("run", fallback=tmp_path / "local.json", flush_every=20)
    for s in range(20):
        logger.log({"loss": float(s)}, step=s)
    assert server.entered.wait(5), "the background thread should start sending once flush_every points are pending"

    start = time.perf_counter()
    for s in range(20, 220):
        logger.log({"loss": float(s)}, step=s)
    elapsed = time.perf_counter() - start

    assert elapsed < 0.25, f"200 log() calls took {elapsed:.3f}s while a send was in flight"
    assert not server.release.is_set() and len(server.calls) == 1  # the slow send really was still running
    server.release.set()
    logger.close()
    assert server.sent() == [("loss", float(s), s) for s in range(220)]
    assert not (tmp_path / "local.json").exists()


def test_failing_server_warns_once_and_keeps_every_point(
    tmp_path: Path, server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server.fail_from_call = 2  # the first batch gets through, then the server breaks
    fallback = tmp_path / "reports" / "local.json"
    logged = steps(50)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger = MLflowLogger("run", fallback=fallback, flush_every=10, flush_interval_s=0.01)
        for s, metrics in enumerate(logged):
            logger.log(metrics, step=s)  # raises nothing, ever
            time.sleep(0.001)
        logger.close()

    assert len(server.calls) == 2  # it stopped trying after the first failure
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages
    assert "tracking server down" in messages[0] and str(fallback) in messages[0]
    assert same(read_json(fallback), [{"step": s, **m} for s, m in enumerate(logged)])
    assert f"train: metrics kept locally in {fallback}" in capsys.readouterr().err


def test_failure_warning_under_W_error_does_not_raise(tmp_path: Path, server: FakeServer) -> None:
    server.fail_from_call = 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        logger = MLflowLogger("run", fallback=tmp_path / "local.json", flush_every=1)
        for s in range(5):
            logger.log({"loss": 1.0}, step=s)
        logger.close()
    assert [row["step"] for row in read_json(tmp_path / "local.json")] == list(range(5))


def test_close_gives_up_on_a_server_that_is_too_slow(
    tmp_path: Path, server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server.block_s = 10.0
    fallback = tmp_path / "local.json"
    logger = MLflowLogger("run", fallback=fallback, flush_every=5, close_timeout_s=0.2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in range(12):
            logger.log({"loss": float(s)}, step=s)
        assert server.entered.wait(5)
        start = time.perf_counter()
        logger.close()
        elapsed = time.perf_counter() - start

    assert 0.15 < elapsed < 2.0
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "too slow" in messages[0] and str(fallback) in messages[0], messages
    assert read_json(fallback) == [{"step": s, "loss": float(s)} for s in range(12)]
    assert f"train: metrics kept locally in {fallback}" in capsys.readouterr().err

    # Once the stuck call returns, the abandoned thread sends nothing more and exits.
    server.release.set()
    logger._thread.join(5)
    assert not logger._thread.is_alive()
    assert len(server.calls) == 1


def test_batches_are_chunked_to_mlflow_limit(tmp_path: Path, server: FakeServer) -> None:
    logger = MLflowLogger("run", fallback=tmp_path / "local.json", flush_every=10_000, flush_interval_s=60)
    for s in range(2500):
        logger.log({"loss": float(s)}, step=s)
    logger.close()
    assert [len(call) for call in server.calls] == [1000, 1000, 500]
    assert server.sent() == [("loss", float(s), s) for s in range(2500)]


def test_pending_points_are_sent_every_flush_interval(tmp_path: Path, server: FakeServer) -> None:
    logger = MLflowLogger("run", fallback=tmp_path / "local.json", flush_every=1000, flush_interval_s=0.05)
    logger.log({"loss": 0.5}, step=0)
    assert server.entered.wait(2), "a point below flush_every should still go out after flush_interval_s"
    assert server.sent() == [("loss", 0.5, 0)]
    logger.close()


def test_log_after_close_raises_and_close_is_idempotent(tmp_path: Path, server: FakeServer) -> None:
    logger = MLflowLogger("run", fallback=tmp_path / "local.json")
    logger.log({"loss": 1.0}, step=0)
    logger.close()
    logger.close()
    with pytest.raises(RuntimeError, match="after close"):
        logger.log({"loss": 2.0}, step=1)
    assert server.sent() == [("loss", 1.0, 0)]


def test_a_run_that_fails_after_its_metrics_were_sent_keeps_them_locally(
    tmp_path: Path, _store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failure warning promises the metrics are in the fallback file, whichever call failed: here every point
    reached MLflow and only the last call (logging the model) fails, after the logger was closed."""
    from trainflow.tracking import TrainingRun

    monkeypatch.setenv("MLFLOW_TRACKING_URI", _store)
    fallback = tmp_path / "reports" / "local.json"
    run = TrainingRun(tmp_path, "t", fallback)
    run.start({"lr": 0.1}, tags={})
    logger = run.logger(flush_every=1, flush_interval_s=0.01)
    logged = steps(6)
    for s, metrics in enumerate(logged):
        logger.log(metrics, step=s)
    logger.close()
    assert run.error is None and not fallback.exists()  # all sent: nothing kept locally yet
    assert len(MlflowClient(_store).get_metric_history(str(run.run_id), "lr")) == 6

    def down(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("tracking server down")

    monkeypatch.setattr(MlflowClient, "log_artifact", down)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.log_artifact(tmp_path / "anything.png", "plots")
    assert len(caught) == 1 and str(fallback) in str(caught[0].message)
    assert run.error is not None and "logging anything.png" in run.error
    assert same(read_json(fallback), [{"step": s, **m} for s, m in enumerate(logged)])


# --- what the logger sends and keeps, whole ---------------------------------------------------------------------


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
