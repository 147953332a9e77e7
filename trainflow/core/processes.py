"""Which process made a run, and whether it still lives: for the runs a killed process left "running".

A run killed with SIGKILL (or whose machine went down) never reports its end: Prefect keeps its flow run Running and
MLflow its run RUNNING, forever. Each run records its workspace and its process (`workspace_tag`, `process_tag`); a
later run of the same workspace that finds one whose process is gone ends it as Crashed / KILLED, saying why
(flows/orphans.py, tracking.end_orphans).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def process_tag() -> str:
    """This process as `host:pid:start time`, which names it uniquely even when the OS reuses its pid later."""
    import psutil

    return f"{socket.gethostname()}:{os.getpid()}:{psutil.Process().create_time():.2f}"


def process_alive(tag: str) -> bool | None:
    """Whether the process a `process_tag` names is still running; None if it ran on another machine (or the tag is
    not one), where this machine cannot tell."""
    import psutil

    try:
        host, pid, started = tag.rsplit(":", 2)
        pid_, started_ = int(pid), float(started)
    except ValueError:
        return None
    if host != socket.gethostname():
        return None
    try:
        return abs(psutil.Process(pid_).create_time() - started_) < 1.0  # else: the pid now names another process
    except psutil.NoSuchProcess:
        return False


def workspace_tag(root: Path) -> str:
    """The workspace as `host:path`: runs of the same path on another machine are another workspace."""
    return f"{socket.gethostname()}:{root.resolve()}"
