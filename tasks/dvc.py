"""DVC bookkeeping for stages run outside `dvc repro`: ask whether a stage changed, record its outputs after.

DVC owns change detection; the flow asks it instead of guessing. DVC allows one process per workspace, so these run
in the flow's own process, one at a time, never from parallel tasks. DVC resolves some paths against the current
directory, so each call runs from the project root.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

logging.getLogger("dvc").setLevel(logging.WARNING)  # DVC's per-stage INFO lines would repeat the flow's own


def changed(root: Path, stage: str) -> bool:
    """True when DVC sees a changed dep, param or out of `stage` (or no record of it yet)."""
    from dvc.repo import Repo

    with contextlib.chdir(root), Repo(str(root)) as repo:
        return bool(repo.status(targets=[stage]))


def commit(root: Path, stage: str) -> None:
    """Record the outputs the stage just wrote in dvc.lock and the cache, as `dvc commit -f STAGE` does."""
    from dvc.repo import Repo

    with contextlib.chdir(root), Repo(str(root)) as repo:
        repo.commit(stage, force=True)
