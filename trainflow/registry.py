"""Model registry: a new version with lineage tags, and the champion gate."""

from __future__ import annotations

from typing import Any

from trainflow.params import RegisterParams

MINIMIZE = {"log_loss", "rmse", "mae"}  # gate metrics where lower is better; every other one is higher-is-better
CHAMPION = "champion"


def beats(new: float, old: float | None, metric: str, min_delta: float) -> bool:
    if old is None:
        return True
    return new < old - min_delta if metric in MINIMIZE else new > old + min_delta


def gate_metric(params: RegisterParams, metrics: dict[str, float]) -> str:
    """register.gate_metric, resolved: auto = accuracy (classification) or r2 (regression)."""
    gate = params.gate_metric
    if gate == "auto":
        gate = "accuracy" if "accuracy" in metrics else "r2"
    if gate not in metrics:
        from trainflow.errors import ParamsError

        raise ParamsError(
            "params.yaml",
            [("register.gate_metric", f"{gate} is not measured for this task; the metrics are {sorted(metrics)}")],
        )
    return gate


def register(model_uri: str, params: RegisterParams, metrics: dict[str, float], tags: dict[str, str]) -> dict[str, Any]:
    """Create a version of `params.model_name` from `model_uri`; move `champion` to it only if it beats the champion."""
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    name = params.model_name
    all_tags = {**tags, **{f"metric.{k}": repr(float(v)) for k, v in metrics.items()}}
    version = mlflow.register_model(model_uri, name, tags=all_tags).version

    try:
        current = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        current = None
    gate = gate_metric(params, metrics)
    old = float(current.tags[f"metric.{gate}"]) if current and f"metric.{gate}" in current.tags else None
    new = float(metrics[gate])
    promoted = beats(new, old, gate, params.min_delta)
    if promoted:
        client.set_registered_model_alias(name, CHAMPION, version)
    return {
        "model_name": name,
        "version": int(version),
        "model_uri": f"models:/{name}/{version}",
        "gate_metric": gate,
        "value": new,
        "previous_champion": int(current.version) if current else None,
        "previous_value": old,
        "champion": promoted,
        "champion_version": int(version) if promoted else (int(current.version) if current else None),
        "tags": tags,
    }
