"""DVC bookkeeping for stages run outside `dvc repro`: ask whether a stage changed, record its outputs after.

DVC owns change detection; the flow asks it instead of guessing. DVC allows one process per workspace, so these run
in the flow's own process, one at a time, never from parallel tasks. DVC resolves some paths against the current
directory, so each call runs from the project root.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def _atomic_dump(original: Callable[..., Any]) -> Callable[..., Any]:
    """DVC's writer of its YAML files (`_dump_data`), made atomic for local files.

    DVC rewrites dvc.lock in place: it opens the file for writing, which empties it, then serialises the YAML into it
    (tens of milliseconds for a pipeline's lock). A run killed in between left dvc.lock truncated, and every later
    `trainflow run` or `dvc repro` failed on it. Here the YAML goes to a temp file beside it, which is fsynced and
    renamed over: a reader sees the old lock file or the new one.
    """
    from trainflow.core.io import atomic_path

    def dump(path: Any, data: Any, dumper: Any, fs: Any = None, **dumper_args: Any) -> Any:
        if fs is not None and getattr(fs, "protocol", None) != "local":
            return original(path, data, dumper, fs=fs, **dumper_args)
        with atomic_path(Path(path)) as tmp, open(tmp, "w", encoding="utf-8") as fd:
            dumper(data, fd, **dumper_args)

    dump.atomic = True  # type: ignore[attr-defined]
    return dump


def _install_atomic_dumps() -> None:
    """Route DVC's writes of dvc.lock (and dvc.yaml, .dvc files) in this process through `_atomic_dump`."""
    from dvc.utils.serialize import _common, _yaml

    for module in (_common, _yaml):  # _yaml imported the function by name: both names are used
        if not getattr(module._dump_data, "atomic", False):
            module._dump_data = _atomic_dump(module._dump_data)


def _repo(root: Path):  # type: ignore[no-untyped-def]
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo

    from trainflow.core.errors import UserError

    _install_atomic_dumps()
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

    from trainflow.core.errors import UserError

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
    `dvc repro` runs never waits for trainflow's workspace lock (trainflow.core.workspace). A corrupt rwlock file is
    repaired first (`_remove_corrupt_rwlock`)."""
    from dvc.lock import LockError  # DVC's repo lock and its rwlock (dvc.rwlock raises it too)
    from dvc.rwlock import RWLockFileCorruptedError, RWLockFileFormatError

    said = corrupt = repaired = False
    while True:
        try:
            if corrupt and not repaired:
                _remove_corrupt_rwlock(root)  # LockError while a DVC command runs: wait for it, as for any other
                repaired = True
            with _open(root) as repo:
                return call(repo)
        except LockError:
            if not said:
                print(f"[trainflow] waiting for DVC: another dvc command is using {root}", file=sys.stderr, flush=True)
                said = True
            time.sleep(1.0)
        except (RWLockFileCorruptedError, RWLockFileFormatError):
            if repaired:  # corrupt again, after the repair: not ours to fix twice
                raise
            corrupt = True


def _remove_corrupt_rwlock(root: Path) -> None:
    """Remove DVC's rwlock file if it does not parse.

    DVC rewrites .dvc/tmp/rwlock in place (open "w", then dump) at the start and end of every stage operation, so a
    DVC call killed in between leaves it empty or cut short, and every DVC command after it failed ("Unable to read
    RWLock-file"), `trainflow run` and `dvc repro` alike. The file only records which running DVC commands read or
    write which outputs, so it can go once none runs: this holds DVC's repo lock, which each of them holds while it
    runs (`dvc repro` for its whole run), and raises LockError while one does."""
    path = root / ".dvc" / "tmp" / "rwlock"
    with contextlib.chdir(root), _repo(root) as repo, repo.lock:
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            pass
        except ValueError:  # also a decoding error
            path.unlink()
            print(f"[trainflow] {path} was corrupt (a dvc command was killed while writing it): removed", flush=True)


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
    """Upload every output recorded in dvc.lock to `remote`, as `dvc push -r REMOTE` does; returns the files sent.

    A remote whose filesystem is full is a DiskFullError naming it (DVC itself says only "N files failed to upload"
    and logs why per file); the partial uploads it left behind are removed, so freeing space is all it takes."""
    from dvc.exceptions import UploadError

    from trainflow.core.io import disk_full, failpoint, no_space

    failpoint("push")
    with _open(root) as repo:
        url = str(repo.config["remote"][remote]["url"])
    with _failed_transfers() as failures:
        started = time.time()
        try:
            return int(_waiting(root, lambda repo: repo.push(remote=remote)))
        except UploadError as exc:
            full = next((f for f in failures if no_space(f)), None)
            if full is None:
                raise
            if "://" not in url:  # a local remote: DVC's temp files of the uploads that failed stay behind otherwise
                _remove_partial_uploads(Path(url), started)
            intact = (
                f"DVC remote {remote!r} keeps what it held, and nothing is lost here: the outputs are in the workspace "
                f"and the DVC cache ({exc})."
            )
            fix = "Free space on the remote, then `dvc push` (or rerun `trainflow run`)."
            raise disk_full(Path(url), full, intact, fix) from exc


@contextlib.contextmanager
def _failed_transfers() -> Iterator[list[BaseException]]:
    """The errors DVC logs (and does not raise) for each file it failed to upload, while the block runs."""
    failures: list[BaseException] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.exc_info and record.exc_info[1] is not None:
                failures.append(record.exc_info[1])

    handler = Collect(logging.ERROR)
    loggers = [logging.getLogger(name) for name in ("dvc", "dvc_data", "dvc_objects")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield failures
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def _remove_partial_uploads(remote: Path, since: float) -> None:
    """Remove the temp files (`.<token>.tmp`) that uploads begun after `since` left in a local remote."""
    for tmp in remote.rglob(".*.tmp"):
        with contextlib.suppress(OSError):
            if tmp.stat().st_mtime >= since - 1:
                tmp.unlink()
