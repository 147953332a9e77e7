"""DVC bookkeeping for stages run outside `dvc repro`: ask whether a stage changed, record its outputs after.

DVC owns change detection; the flow asks it instead of guessing. DVC allows one process per workspace, so these run
in the flow's own process, one at a time, never from parallel tasks. DVC resolves some paths against the current
directory, so each call runs from the project root.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def _repo(root: Path):  # type: ignore[no-untyped-def]
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo

    from trainflow.errors import UserError

    # Importing dvc sets its logger to INFO; its per-stage "Updating lock file" lines would repeat the flow's own.
    logging.getLogger("dvc").setLevel(logging.WARNING)
    try:
        return Repo(str(root))
    except NotDvcRepoError:
        raise UserError(f"{root} is not a DVC project (no .dvc/ directory); run `dvc init` there first") from None


@contextlib.contextmanager
def _open(root: Path) -> Iterator[Any]:
    """The DVC repo of `root`, used from the root. A dvc.yaml or dvc.lock that DVC cannot parse (edited by hand, a
    merge conflict) is a UserError naming the file, where, and how to repair it."""
    from dvc.utils.strictyaml import YAMLSyntaxError, YAMLValidationError

    from trainflow.errors import UserError

    try:
        with contextlib.chdir(root), _repo(root) as repo:
            yield repo
    except (YAMLSyntaxError, YAMLValidationError) as exc:
        name = getattr(exc, "relpath", "") or getattr(exc, "path", "") or "dvc.yaml"
        cause = exc.exc.__cause__ or exc.exc
        mark = getattr(cause, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(cause, "problem", None) or str(cause).splitlines()[0]
        fix = (
            "restore the committed one with `git checkout -- dvc.lock`, or delete it (the next `trainflow run` or "
            "`dvc repro` runs every stage again and writes it)"
            if Path(name).name == "dvc.lock"
            else f"fix it, or restore the committed one with `git checkout -- {name}`"
        )
        raise UserError(f"{root / name}: DVC cannot read it ({what}{where}); {fix}") from None


def _waiting(root: Path, call: Callable[[Any], T]) -> T:
    """`call(repo)`, waiting while another DVC process (`dvc repro`, `dvc push`) holds DVC's locks instead of
    failing: DVC takes them before it changes anything, so trying again is safe. It cannot deadlock: a stage that
    `dvc repro` runs never waits for trainflow's workspace lock (trainflow.workspace)."""
    from dvc.lock import LockError  # DVC's repo lock and its rwlock (dvc.rwlock raises it too)

    said = False
    while True:
        try:
            with _open(root) as repo:
                return call(repo)
        except LockError:
            if not said:
                print(f"[trainflow] waiting for DVC: another dvc command is using {root}", file=sys.stderr, flush=True)
                said = True
            time.sleep(1.0)


def changed(root: Path, stage: str) -> bool:
    """True when DVC sees a changed dep, param or out of `stage` (or no record of it yet)."""
    return _waiting(root, lambda repo: bool(repo.status(targets=[stage])))


def changed_stages(root: Path) -> list[str]:
    """The stages DVC sees as changed (one `dvc status` for the whole pipeline)."""
    return _waiting(root, lambda repo: sorted(repo.status()))


def commit(root: Path, stage: str) -> None:
    """Record the outputs the stage just wrote in dvc.lock and the cache, as `dvc commit -f STAGE` does."""
    _waiting(root, lambda repo: repo.commit(stage, force=True))


def default_remote(root: Path) -> str | None:
    """The name of DVC's default remote (`dvc remote default`), or None when none is configured."""
    with _open(root) as repo:
        name = repo.config["core"].get("remote")
    return str(name) if name else None


def push(root: Path, remote: str) -> int:
    """Upload every output recorded in dvc.lock to `remote`, as `dvc push -r REMOTE` does; returns the files sent."""
    with _open(root) as repo:
        return int(repo.push(remote=remote))
