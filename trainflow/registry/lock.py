"""The lock a champion decision runs under, so that two decisions about one model never interleave: each reads the
champion, decides against it and moves the alias before the next one reads.

Where the store is a local file (a SQLite database, a file store), every process that uses it sees that file: an OS
file lock beside it (released when the process dies, so never stale). Any other store (a tracking server, a database
URL) is shared by processes on several machines, which share nothing else: the lock is held by the registry itself,
as a registered model named `<model>.trainflow-lock` (LOCK_SUFFIX), created to take the lock and deleted to release it.
Creating a registered model whose name exists fails in every MLflow store (a unique key in the database behind a
server), so of several processes creating it at once exactly one succeeds: a compare-and-set the registry performs,
wherever its clients run, and through a proxying server with access control (its creator may delete it).

A holder that dies (a kill, a lost machine) cannot delete it. The holder counts a heartbeat into the lock's tag
every HEARTBEAT_S; a waiter that sees the count unchanged for STALE_S on its own clock (clocks of different machines
are never compared) breaks the lock and takes it. Breaking is the one step that is not atomic: two waiters breaking the
same dead lock within one round trip could both go on. It happens only after a holder died.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import random
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from trainflow.core import outage
from trainflow.core.errors import ServiceError, UserError

log = logging.getLogger(__name__)

LOCK_SUFFIX = ".trainflow-lock"
HOLDER_TAG, BEAT_TAG = "holder", "heartbeat"
HEARTBEAT_S = 5.0  # a holder's heartbeat: one tag write per 5 s while a decision runs (re-scoring can take minutes)
STALE_S = 60.0  # no heartbeat seen for this long: the holder is gone (12 beats missed, a server's restart outlasted)


def is_lock(name: str) -> bool:
    """Whether registered model `name` is a registry lock, not a model (`trainflow models list` leaves it out)."""
    return name.endswith(LOCK_SUFFIX)


def lock_path(tracking_uri: str) -> Path:
    """Where decisions against a local store serialise: beside a SQLite store or inside a file store (for an
    in-memory SQLite store, which no other machine can use, a file in this machine's temp directory)."""
    parsed = urlparse(tracking_uri)
    if parsed.scheme == "sqlite" and parsed.path not in ("", "/", "/:memory:"):
        db = Path(unquote(parsed.path[1:]))  # sqlite:////abs/x.db is /abs/x.db, sqlite:///x.db is x.db (SQLAlchemy)
        return db.with_name(db.name + ".registry.lock")
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path or tracking_uri)) / ".registry.lock"
    digest = hashlib.sha256(tracking_uri.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"trainflow-registry-{digest}.lock"


@contextlib.contextmanager
def registry_lock(tracking_uri: str, name: str) -> Iterator[None]:
    """Hold the lock for decisions about registered model `name` in the store at `tracking_uri` (see the module)."""
    if urlparse(tracking_uri).scheme in ("", "file", "sqlite"):
        from filelock import FileLock

        path = lock_path(tracking_uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(path):
            yield
        return
    with held_by_registry(name):
        yield


@contextlib.contextmanager
def held_by_registry(name: str, stale_s: float = STALE_S, heartbeat_s: float = HEARTBEAT_S) -> Iterator[None]:
    """The lock of model `name` as a registered model in the current tracking store, while the block runs."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    lock = name + LOCK_SUFFIX
    me = f"{socket.gethostname()} pid {os.getpid()} ({uuid.uuid4().hex[:8]})"
    _take(client, lock, me, stale_s)
    stop = threading.Event()
    beat = threading.Thread(target=_beat, args=(client, lock, stop, heartbeat_s), daemon=True)
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join()
        _release(client, lock, me)


def _take(client: Any, lock: str, me: str, stale_s: float) -> None:
    """Create the lock model (the compare-and-set); while another holds it, wait, and break it once its heartbeat
    has not moved for `stale_s`."""
    from mlflow.exceptions import MlflowException

    seen: tuple[str, str] | None = None  # the holder's (holder, heartbeat) last seen, and since when (our clock)
    since = time.monotonic()
    delay, said = 0.02, False
    while True:
        try:
            client.create_registered_model(lock, tags={HOLDER_TAG: me, BEAT_TAG: "0"}, description=_DESCRIPTION)
            return
        except MlflowException as exc:
            # Held: "already exists". Or "does not exist": MLflow's SQL store, refused by the unique key, reads the
            # model back to say so, and finds it gone when its holder released it in between.
            if exc.error_code not in ("RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST"):
                raise _failed("taking", lock, exc) from exc
        held = _holder(client, lock)
        if held is None:  # released between our create and our look: try again at once
            continue
        if held != seen:
            seen, since = held, time.monotonic()
        elif time.monotonic() - since > stale_s:
            log.warning("registry: breaking %s, left by %s (no heartbeat for %.0f s)", lock, held[0], stale_s)
            _delete(client, lock, "breaking the lock left by a holder that stopped")
            seen, since = None, time.monotonic()
            continue
        if not said:
            log.warning("registry: waiting for %s, held by %s (another champion decision)", lock, held[0])
            said = True
        time.sleep(delay * (0.5 + random.random()))  # jittered: waiters spread out instead of retrying in step
        delay = min(delay * 2, 1.0)


def _holder(client: Any, lock: str) -> tuple[str, str] | None:
    from mlflow.exceptions import MlflowException

    try:
        tags = client.get_registered_model(lock).tags
    except MlflowException as exc:
        if outage.not_found(exc):
            return None
        raise _failed("reading", lock, exc) from exc
    return tags.get(HOLDER_TAG, "?"), tags.get(BEAT_TAG, "")


def _beat(client: Any, lock: str, stop: threading.Event, every_s: float) -> None:
    """Count heartbeats into the lock's tag until `stop`; a beat that fails is retried at the next (a waiter breaks
    the lock only after STALE_S without one)."""
    n = 0
    while not stop.wait(every_s):
        n += 1
        with contextlib.suppress(Exception):
            client.set_registered_model_tag(lock, BEAT_TAG, str(n))


def _release(client: Any, lock: str, me: str) -> None:
    held = _holder(client, lock)
    if held is None or held[0] != me:  # broken while we held it: our heartbeats did not reach the registry
        log.warning("registry: %s was taken from this process while it decided (held by %s now)", lock, held)
        return
    _delete(client, lock, "releasing the lock")


def _delete(client: Any, lock: str, what: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.delete_registered_model(lock)
    except MlflowException as exc:
        if outage.not_found(exc):
            return
        raise _failed(what, lock, exc) from exc


def _failed(what: str, lock: str, exc: BaseException) -> Exception:
    import mlflow

    if getattr(exc, "error_code", "") == "PERMISSION_DENIED":
        return UserError(
            f"register: {what} {lock!r} in the registry at {mlflow.get_tracking_uri()} was refused ({exc}). Champion "
            f"decisions take this lock by creating and deleting that registered model: the user needs permission to "
            "create registered models and to delete the lock it created; an admin deletes a lock left by another user "
            f"(`MlflowClient().delete_registered_model({lock!r})`). Nothing was decided; the champion alias is as it "
            "was."
        )
    return ServiceError(
        f"register: {what} {lock!r} in the registry at {mlflow.get_tracking_uri()} failed ({type(exc).__name__}: "
        f"{exc}). Nothing was decided; the champion alias is as it was. Rerun `trainflow stage register` once the "
        "registry answers."
    )


_DESCRIPTION = (
    "Held by trainflow while it decides whether a new version becomes champion; deleted when the decision ends. "
    "Not a model: `trainflow models list` leaves it out."
)
