"""A registration worker for tests/registry/test_concurrent_promotions.py: `register(name, accuracy)` logs a stand-in
model and registers it through trainflow.registry.register against the tracking server of MLFLOW_TRACKING_URI, with
random delays around every read and write of an alias, in a process of its own (a pool of spawned processes: real
concurrent clients, each paying its imports once)."""

from __future__ import annotations

import contextlib
import random
import tempfile
import time
from pathlib import Path
from typing import Any

JITTER_S = 0.05
EXPERIMENT = "race"


def start(seed: int, without_lock: bool, jitter_s: float = JITTER_S) -> None:
    """Pool initializer: delays of up to `jitter_s` around the alias calls; `without_lock` takes the registry lock
    away (the race the lock prevents, to show the test sees it)."""
    from mlflow.tracking import MlflowClient

    from trainflow.registry import registry

    rng = random.Random(seed)

    def jittered(call: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            time.sleep(rng.uniform(0, jitter_s))
            try:
                return call(*args, **kwargs)
            finally:
                time.sleep(rng.uniform(0, jitter_s))

        return wrapper

    for name in ("get_model_version_by_alias", "set_registered_model_alias") if jitter_s else ():
        setattr(MlflowClient, name, jittered(getattr(MlflowClient, name)))
    if without_lock:
        registry.registry_lock = lambda *_: contextlib.nullcontext()  # type: ignore[attr-defined]


def register(name: str, accuracy: float) -> dict[str, Any]:
    import mlflow
    from mlflow.tracking import MlflowClient

    from support.projects import model_run
    from trainflow.params import RegisterParams
    from trainflow.registry import registry

    def no_rescore(uri: str) -> Any:
        raise AssertionError(f"{uri} re-scored, but every version was tested on test split 'h'")

    client = MlflowClient()
    experiment = mlflow.get_experiment_by_name(EXPERIMENT).experiment_id  # made once, before the writers start
    with tempfile.TemporaryDirectory() as tmp:
        run_id = model_run(client, experiment, Path(tmp))
    params = RegisterParams(model_name=name, decide="point")
    return registry.register(
        f"runs:/{run_id}/model", run_id, params, {"accuracy": accuracy}, {}, test_hash="h", rescore=no_rescore
    )
