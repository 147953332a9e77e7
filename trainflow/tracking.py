"""MLflow tracking: where runs go, and a logger that keeps MLflow off the training hot path.

The engine talks to the Logger protocol (`log(metrics, step)`, `close()`); this module is the MLflow side of it.
mlflow is imported lazily so the CLI starts fast.
"""

from __future__ import annotations

import os
import sys
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
    """Buffers metrics in memory and sends them in one batch per `flush_every` calls and at close.

    A tracking failure never fails training: it warns once and keeps the metrics in a local JSON file.
    """

    def __init__(self, run_id: str, fallback: Path, flush_every: int = 20) -> None:
        self.run_id = run_id
        self.fallback = fallback
        self.flush_every = flush_every
        self.pending: list[tuple[str, float, int]] = []
        self.all: list[dict[str, Any]] = []
        self.failed = False

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.pending += [(k, float(v), step) for k, v in metrics.items()]
        self.all.append({"step": step, **metrics})
        if len(self.pending) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if not self.pending or self.failed:
            return
        import time

        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient

        now = int(time.time() * 1000)
        try:
            MlflowClient().log_batch(self.run_id, metrics=[Metric(k, v, now, s) for k, v, s in self.pending])
            self.pending.clear()
        except Exception as exc:  # noqa: BLE001 - tracking must never stop training
            self.failed = True
            warnings.warn(f"MLflow logging failed ({exc}); metrics are kept in {self.fallback}", stacklevel=2)

    def close(self) -> None:
        self.flush()
        if self.failed:
            write_json(self.fallback, self.all)
            print(f"train: metrics kept locally in {self.fallback}", file=sys.stderr)
