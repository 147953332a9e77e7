"""Every command sets the quiet, offline-safe defaults of the services it drives (Prefect, MLflow), each unless the
environment sets it already."""

from __future__ import annotations

import os

import pytest

from trainflow import cli


def test_the_quiet_service_defaults_are_set_unless_the_environment_sets_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key in cli.ENV_DEFAULTS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("PREFECT_LOGGING_LEVEL", "DEBUG")
    monkeypatch.setattr(cli, "_dispatch", lambda args: 0)
    assert cli.main(["run"]) == 0
    assert {k: os.environ[k] for k in cli.ENV_DEFAULTS} == {
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
        "PREFECT_LOGGING_LEVEL": "DEBUG",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "DO_NOT_TRACK": "1",
    }
