"""One pipeline run per workspace at a time: `trainflow run`, `trainflow stage` and the training flow (a scheduled
deployment run included) hold a workspace lock while they write outputs, DVC records or the registry.

A second run waits, saying for whom (pid, command, since when). A stage that `dvc repro` runs does not wait: DVC
holds its locks meanwhile, and the run it would wait for needs them to record its stages, so the stage exits at once
with an error saying what holds the workspace and to rerun `dvc repro` after it. The run, for its part, waits for
DVC's locks (tasks/dvc.py), so `dvc repro` stops at its next stage and the run goes on. The lock is a file lock
(released by the OS when its process dies, so a killed run never leaves it held); child processes of the holder
(distributed ranks, DVC calls) inherit it through the environment.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from trainflow.core.errors import UserError
from trainflow.core.io import read_json, write_json

HELD = "TRAINFLOW_WORKSPACE"  # set to the workspace root while this process (tree) holds its lock


def lock_file(root: Path) -> Path:
    """In .dvc/tmp (DVC's own scratch, git-ignored) in a DVC project, else beside params.yaml."""
    dvc = root / ".dvc"
    return dvc / "tmp" / "trainflow-workspace.lock" if dvc.is_dir() else root / ".trainflow-workspace.lock"


def holder(root: Path) -> str:
    """Who holds the workspace, as recorded by the holder (or "another process" if it wrote nothing readable)."""
    try:
        who = read_json(lock_file(root).with_suffix(".json"))
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(who["since"])))
        return f"`{who['command']}` (pid {who['pid']}, since {started})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


@contextlib.contextmanager
def hold(root: Path, command: str) -> Iterator[None]:
    """Hold the workspace of `root` for `command` (e.g. "trainflow run"); see the module doc."""
    from filelock import FileLock, Timeout

    root = root.resolve()
    if os.environ.get(HELD) == str(root) or os.environ.get("RANK", "0") != "0":
        yield  # held by this process or its parent; or a rank other than 0 of a distributed run (rank 0 holds it)
        return
    path = lock_file(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path), thread_local=False)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        who = holder(root)
        if os.environ.get("DVC_STAGE"):
            raise UserError(
                f"{command}: the workspace {root} is in use by {who}; `dvc repro` cannot run this stage meanwhile. "
                "Wait for it to end, then rerun `dvc repro` (or use `trainflow run`, which waits its turn)"
            ) from None
        print(f"[trainflow] waiting for the workspace {root}: it is in use by {who}", file=sys.stderr, flush=True)
        lock.acquire()
    try:
        write_json(path.with_suffix(".json"), {"pid": os.getpid(), "command": command, "since": time.time()})
        os.environ[HELD] = str(root)
        yield
    finally:
        os.environ.pop(HELD, None)
        lock.release()
