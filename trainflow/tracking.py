"""MLflow tracking: where runs go, and a logger that keeps MLflow off the training hot path.

The engine talks to the Logger protocol (`log(metrics, step)`, `close()`); this module is the MLflow side of it.
mlflow is imported lazily so the CLI starts fast.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from trainflow.io import write_json


def tracking_uri(root: Path) -> str:
    """MLFLOW_TRACKING_URI if set, else a SQLite store at the project root (absolute, so the cwd never matters)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(root / 'mlflow.db').resolve()}"


def configure(root: Path) -> str:
    """Point mlflow at this project's store; create the experiment's artifact root beside it."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow

    uri = tracking_uri(root)
    mlflow.set_tracking_uri(uri)
    return uri


def ensure_experiment(name: str, root: Path) -> str:
    import mlflow

    exp = mlflow.get_experiment_by_name(name)
    if exp is not None:
        return str(exp.experiment_id)
    # Artifacts go next to the project, not into whatever the current directory is.
    location = (root / "mlartifacts").resolve().as_uri()
    return str(mlflow.create_experiment(name, artifact_location=location))


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


class MLflowLogger:
    """Sends metrics to MLflow from a background thread, so tracking never slows or fails training.

    `log()` only appends to in-memory buffers and returns. A daemon thread sends what is pending with
    `MlflowClient.log_batch` (at most 1000 metrics per call) once `flush_every` points are pending, every
    `flush_interval_s`, and at `close()`. A failing tracking server warns once and is not tried again; one slower
    than `close_timeout_s` at close is given up on. In either case every point logged is written to `fallback`
    as JSON (a list of `{"step": step, **metrics}`, one per `log()` call).
    """

    MAX_BATCH = 1000  # MLflow's limit on metrics per log_batch call

    def __init__(
        self,
        run_id: str,
        fallback: Path,
        flush_every: int = 20,
        flush_interval_s: float = 5.0,
        close_timeout_s: float = 30.0,
    ) -> None:
        if flush_interval_s <= 0 or close_timeout_s < 0:
            raise ValueError("flush_interval_s must be > 0 and close_timeout_s >= 0")
        import mlflow

        self.run_id = run_id
        self.fallback = fallback
        self.flush_every = max(1, flush_every)
        self.flush_interval_s = flush_interval_s
        self.close_timeout_s = close_timeout_s
        # The store the run lives in, fixed now: the tracking URI may change before the thread sends.
        self._tracking_uri = mlflow.get_tracking_uri()
        self._cond = threading.Condition()
        self._pending: list[tuple[str, float, int, int]] = []  # (key, value, timestamp ms, step)
        self._points: list[dict[str, Any]] = []  # every point logged, for the fallback file
        self._closed = False
        self._stopping = False  # close() asked the thread to send what is left and exit
        self._abandoned = False  # close() gave up waiting: the thread sends nothing more and stays quiet
        self._error: BaseException | None = None
        self._timed_out = False
        self._client: Any = None  # made in the thread, on first send
        self._thread = threading.Thread(target=self._run, name=f"mlflow-logger-{run_id}", daemon=True)
        self._thread.start()

    @property
    def failed(self) -> bool:
        """True once tracking failed or was given up on: the metrics then go to `fallback` at close."""
        return self._error is not None or self._timed_out

    def log(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        values = {k: float(v) for k, v in metrics.items()}
        with self._cond:
            if self._closed:
                raise RuntimeError("MLflowLogger.log() called after close()")
            self._points.append({"step": step, **values})
            if self._error is None:
                self._pending += [(k, v, now, step) for k, v in values.items()]
                if len(self._pending) >= self.flush_every:
                    self._cond.notify()

    def close(self) -> None:
        """Send what is pending (waiting at most `close_timeout_s`); on any failure write every point to `fallback`."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._stopping = True
            self._cond.notify()
        self._thread.join(self.close_timeout_s)
        if self._thread.is_alive():
            with self._cond:
                self._abandoned = True
                self._timed_out = self._error is None
            if self._timed_out:
                self._warn(
                    f"MLflow tracking is too slow (still sending after {self.close_timeout_s:g}s); "
                    f"giving up on it, metrics are kept in {self.fallback}",
                    stacklevel=3,  # the caller of close()
                )
        if self.failed:
            with self._cond:
                points = list(self._points)
            write_json(self.fallback, points)
            print(f"train: metrics kept locally in {self.fallback}", file=sys.stderr)

    def _run(self) -> None:
        """The background thread: send pending points in batches until close() or the first failure."""
        deadline = time.monotonic() + self.flush_interval_s
        while True:
            with self._cond:
                while not self._stopping and len(self._pending) < self.flush_every:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                if self._abandoned:
                    return
                batch, self._pending = self._pending, []
                stopping = self._stopping
            deadline = time.monotonic() + self.flush_interval_s
            if batch and not self._send(batch):
                return
            if stopping:
                with self._cond:
                    if not self._pending:
                        return

    def _send(self, batch: list[tuple[str, float, int, int]]) -> bool:
        try:
            from mlflow.entities import Metric
            from mlflow.tracking import MlflowClient

            if self._client is None:
                self._client = MlflowClient(tracking_uri=self._tracking_uri)
            client = self._client
            for i in range(0, len(batch), self.MAX_BATCH):
                chunk = batch[i : i + self.MAX_BATCH]
                client.log_batch(self.run_id, metrics=[Metric(k, v, t, s) for k, v, t, s in chunk], synchronous=True)
        except Exception as exc:  # noqa: BLE001 - tracking must never stop training
            with self._cond:
                self._error = exc
                self._pending.clear()
                quiet = self._abandoned
            if not quiet:
                self._warn(
                    f"MLflow logging failed ({type(exc).__name__}: {exc}); metrics are kept in {self.fallback}", 2
                )
            return False
        return True

    @staticmethod
    def _warn(message: str, stacklevel: int) -> None:
        try:
            warnings.warn(message, stacklevel=stacklevel)
        except Exception:  # noqa: BLE001 - under `-W error` a warning raises; it must not kill the thread
            print(f"warning: {message}", file=sys.stderr)
