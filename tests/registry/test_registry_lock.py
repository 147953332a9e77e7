"""The lock a champion decision runs under (trainflow.registry.lock): a file beside a local store; for a shared store,
a registered model the registry holds, taken by creating it (exactly one creator wins), released by deleting it, and
broken only when its holder's heartbeat has stopped. Against a SQLite store in tmp_path, with threads for the holders
(the concurrent processes on a real server are in test_concurrent_promotions.py)."""

from __future__ import annotations

import hashlib
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from trainflow import tracking
from trainflow.core.errors import ServiceError, UserError
from trainflow.registry import lock, registry


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("sqlite:////abs/dir/x.db", "/abs/dir/x.db.registry.lock"),
        ("sqlite:///rel%20dir/x.db", "rel dir/x.db.registry.lock"),
        ("file:///store/ml%20runs", "/store/ml runs/.registry.lock"),
        ("/plain/path", "/plain/path/.registry.lock"),
    ],
)
def test_the_lock_sits_beside_a_local_store(uri: str, expected: str) -> None:
    assert lock.lock_path(uri) == Path(expected)


@pytest.mark.parametrize("uri", ["sqlite://", "sqlite:///:memory:"])
def test_an_in_memory_store_locks_in_the_temp_directory(uri: str) -> None:
    digest = hashlib.sha256(uri.encode()).hexdigest()[:16]
    assert lock.lock_path(uri) == Path(tempfile.gettempdir()) / f"trainflow-registry-{digest}.lock"


@pytest.mark.parametrize(
    ("uri", "held_by"),
    [
        ("sqlite:////abs/x.db", "file"),
        ("file:///store", "file"),
        ("/plain/path", "file"),
        ("http://mlflow:5000", "registry"),
        ("https://mlflow.example", "registry"),
        ("postgresql://u@db/mlflow", "registry"),
    ],
)
def test_a_shared_store_is_locked_by_the_registry_and_a_local_one_by_a_file(
    uri: str, held_by: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    taken: list[str] = []

    class File:
        def __init__(self, path: Path) -> None:
            taken.append("file")

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr("filelock.FileLock", File)
    monkeypatch.setattr(lock, "held_by_registry", lambda name: _recording(taken, name))
    monkeypatch.setattr(lock, "lock_path", lambda _uri: tmp_path / "x.lock")
    with lock.registry_lock(uri, "iris"):
        pass
    assert taken == [held_by if held_by == "file" else "registry iris"]


class _recording:
    def __init__(self, taken: list[str], name: str) -> None:
        taken.append(f"registry {name}")

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.fixture
def store(tmp_path: Path) -> Any:
    from mlflow.tracking import MlflowClient

    tracking.configure(tmp_path)
    return MlflowClient()


def models(client: Any) -> dict[str, dict[str, str]]:
    return {m.name: dict(m.tags) for m in client.search_registered_models()}


def test_holding_the_lock_is_a_registered_model_deleted_on_release(store: Any) -> None:
    with lock.held_by_registry("iris"):
        held = models(store)
        assert list(held) == ["iris.trainflow-lock"]
        assert held["iris.trainflow-lock"]["heartbeat"] == "0"
        assert " pid " in held["iris.trainflow-lock"]["holder"]
    assert models(store) == {}
    with pytest.raises(RuntimeError), lock.held_by_registry("iris"):  # released when the decision fails too
        raise RuntimeError("the decision failed")
    assert models(store) == {}


def _in_thread(name: str, entered: list[str], what: str, hold_s: float = 0.0, **kwargs: Any) -> threading.Thread:
    def take() -> None:
        with lock.held_by_registry(name, **kwargs):
            entered.append(what)
            time.sleep(hold_s)

    thread = threading.Thread(target=take)
    thread.start()
    return thread


def test_a_second_decision_waits_while_the_holder_beats_and_enters_when_it_releases(store: Any) -> None:
    """The waiter's stale limit (0.4 s) is shorter than the hold (1.2 s): only the heartbeat (every 0.05 s) keeps
    it from breaking a lock whose holder is alive."""
    entered: list[str] = []
    holder = _in_thread("iris", entered, "holder", hold_s=1.2, heartbeat_s=0.05)
    while not entered:
        time.sleep(0.01)
    waiter = _in_thread("iris", entered, "waiter", stale_s=0.4)
    time.sleep(0.9)
    assert entered == ["holder"]  # still waiting, 0.9 s on
    holder.join()
    waiter.join(10)
    assert entered == ["holder", "waiter"]
    assert models(store) == {}


def test_locks_of_two_models_do_not_wait_for_each_other(store: Any) -> None:
    entered: list[str] = []
    with lock.held_by_registry("iris"):
        _in_thread("penguins", entered, "penguins").join(10)
    assert entered == ["penguins"]


def test_a_lock_left_by_a_holder_that_died_is_broken_once_its_heartbeat_stops(store: Any) -> None:
    """A holder killed mid-decision leaves its lock (nothing deletes it); the next decision takes it over after
    stale_s without a heartbeat, not before."""
    store.create_registered_model("iris.trainflow-lock", tags={"holder": "gone pid 1 (x)", "heartbeat": "7"})
    started = time.monotonic()
    with lock.held_by_registry("iris", stale_s=0.5):
        waited = time.monotonic() - started
        assert models(store)["iris.trainflow-lock"]["holder"] != "gone pid 1 (x)"
    assert 0.5 <= waited < 5
    assert models(store) == {}


def test_the_lock_is_no_model_for_models_list(store: Any) -> None:
    store.create_registered_model("iris")
    with lock.held_by_registry("iris"):
        assert [m["name"] for m in registry.registered_models(store)] == ["iris"]


class _Refusing:
    """A registry client whose every create is refused (error_code), as a server with access control answers."""

    def __init__(self, error_code: str) -> None:
        from mlflow.protos import databricks_pb2

        self.error_code = getattr(databricks_pb2, error_code)

    def create_registered_model(self, *args: Any, **kwargs: Any) -> None:
        from mlflow.exceptions import MlflowException

        raise MlflowException("refused", error_code=self.error_code)


def test_a_refused_lock_says_what_permission_is_missing_and_that_nothing_was_decided(store: Any) -> None:
    with pytest.raises(UserError) as refused:
        lock._take(_Refusing("PERMISSION_DENIED"), "iris.trainflow-lock", "me", 1.0)
    assert "taking 'iris.trainflow-lock'" in str(refused.value)
    assert "permission to create registered models" in str(refused.value)
    assert "Nothing was decided; the champion alias is as it was." in str(refused.value)
    with pytest.raises(ServiceError, match="Rerun `trainflow stage register` once the registry answers"):
        lock._take(_Refusing("TEMPORARILY_UNAVAILABLE"), "iris.trainflow-lock", "me", 1.0)


def test_a_lock_released_while_the_store_refuses_our_create_is_taken_at_the_next_try() -> None:
    """MLflow's SQL store, refusing a create on the unique name, reads the model back to say "already exists"; when
    its holder deleted it in between, the answer is "does not exist" (seen on Postgres under four writers): the lock
    is free, so the create is tried again, not reported as a registry failure."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST

    calls: list[str] = []

    class Racing:
        def create_registered_model(self, name: str, **kwargs: Any) -> None:
            calls.append("create")
            if len(calls) == 1:
                raise MlflowException(f"Registered Model with name={name} not found", RESOURCE_DOES_NOT_EXIST)

        def get_registered_model(self, name: str) -> Any:
            calls.append("get")
            raise MlflowException(f"Registered Model with name={name} not found", RESOURCE_DOES_NOT_EXIST)

    lock._take(Racing(), "iris.trainflow-lock", "me", 1.0)
    assert calls == ["create", "get", "create"]
