"""Retries of the tasks that touch the outside world: a transient error is retried with backoff, a UserError is not,
and train is never retried blindly (a rerun resumes from its checkpoint instead)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import pytest

from trainflow.core.errors import DataError, UserError

pytestmark = pytest.mark.slow

OUTSIDE_WORLD_TASKS = [
    ("tasks.ingest", "ingest", "run"),
    ("tasks.register", "register", "run"),
    ("tasks.push", "push", "dvc"),
]


def failing(times: int, exc: Exception) -> tuple[Callable[..., dict[str, Any]], list[int]]:
    """A stand-in for the stage call that raises `exc` the first `times` calls, then succeeds; counts the calls."""
    calls: list[int] = []

    def call(*args: Any) -> dict[str, Any]:
        calls.append(1)
        if len(calls) <= times:
            raise exc
        return {"ok": True}

    return call, calls


def run_in_flow(
    module: str, task_name: str, patched: str, stand_in: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> Any:
    from prefect import flow

    mod = importlib.import_module(module)
    if patched == "dvc":  # tasks.push calls tasks.dvc.push
        monkeypatch.setattr(mod.dvc, "push", stand_in)
    else:
        monkeypatch.setattr(mod, patched, stand_in)
    the_task = getattr(mod, task_name)

    @flow
    def one_task() -> Any:
        return the_task("/nowhere", "remote") if task_name == "push" else the_task("/nowhere")

    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):  # saves ~1 s per flow
        return one_task()


def test_retry_condition_retries_anything_but_a_user_error() -> None:
    from prefect.states import Failed

    from tasks.retry import retry_unless_user_error

    assert retry_unless_user_error(None, None, Failed(data=OSError("connection reset")))
    assert retry_unless_user_error(None, None, Failed(data=RuntimeError("server said 503")))
    assert not retry_unless_user_error(None, None, Failed(data=DataError("data/raw/x.csv: line 3: not a number")))


def test_retry_policy_is_declared_on_the_outside_world_tasks_only() -> None:
    from prefect.tasks import exponential_backoff

    from tasks.evaluate import evaluate
    from tasks.ingest import ingest
    from tasks.push import push
    from tasks.register import register
    from tasks.retry import retry_unless_user_error
    from tasks.split import split
    from tasks.train import train

    for t in (ingest, register, push):
        assert t.retries == 3 and t.retry_condition_fn is retry_unless_user_error
        assert t.retry_delay_seconds == [0, 0, 0]  # TRAINFLOW_RETRY_DELAY_S=0 in tests
    assert exponential_backoff(backoff_factor=10)(3) == [10, 20, 40]  # the delays outside tests
    for t in (split, train, evaluate):
        assert t.retries == 0


@pytest.mark.parametrize(("module", "task_name", "patched"), OUTSIDE_WORLD_TASKS)
def test_a_transient_error_is_retried(
    module: str, task_name: str, patched: str, prefect_server: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in, calls = failing(2, OSError("connection reset by peer"))
    result = run_in_flow(module, task_name, patched, stand_in, monkeypatch)
    assert len(calls) == 3
    assert result == ({"remote": "remote", "files_pushed": {"ok": True}} if task_name == "push" else {"ok": True})


def test_retries_are_bounded(prefect_server: None, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in, calls = failing(99, OSError("still down"))
    with pytest.raises(OSError, match="still down"):
        run_in_flow("tasks.ingest", "ingest", "run", stand_in, monkeypatch)
    assert len(calls) == 4  # the first try and 3 retries


@pytest.mark.parametrize(("module", "task_name", "patched"), OUTSIDE_WORLD_TASKS)
def test_a_user_error_is_not_retried(
    module: str, task_name: str, patched: str, prefect_server: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in, calls = failing(99, DataError("data/raw/missing.csv does not exist"))
    with pytest.raises(UserError, match="missing.csv"):
        run_in_flow(module, task_name, patched, stand_in, monkeypatch)
    assert len(calls) == 1
