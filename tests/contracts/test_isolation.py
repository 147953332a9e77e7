"""What tests/conftest.py promises every test, checked by a test that breaks it and the next one (a file's tests run
in order, on one worker): an MLflow store of its own, whatever an earlier test pointed mlflow at."""

from __future__ import annotations

import os

import mlflow


def test_a_test_points_mlflow_at_a_server_that_then_goes_away() -> None:
    mlflow.set_tracking_uri("http://127.0.0.1:9")  # as tests/reliability/chaos.py does with its workspace's server


def test_the_next_test_still_gets_its_own_store() -> None:
    assert mlflow.get_tracking_uri() == os.environ["MLFLOW_TRACKING_URI"]
    assert mlflow.get_tracking_uri().startswith("sqlite:///")
