"""Atomic writes and content hashes. A crash or an error never leaves a half-written output behind."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainflow.core.errors import DataError, DiskFullError

# Windows cannot open a directory to fsync it (os.open fails); NTFS journals renames itself.
FSYNC_DIRECTORIES = os.name != "nt"


def fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable (where directories can be fsynced)."""
    if not FSYNC_DIRECTORIES:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one atomic step (Linux renameat2 RENAME_EXCHANGE); False where that is not available
    (other systems, old kernels or libc, file systems that refuse it), so the caller falls back to two renames."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


_UMASK = os.umask(0o022)  # read once, at import (os.umask can only read by setting)
os.umask(_UMASK)


NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # full filesystem, quota, file-size limit (ulimit -f)


def no_space(exc: BaseException) -> str | None:
    """Why a write found no room ("No space left on device", ...), if that is what `exc` says: an OSError, or the same
    error wrapped in a library's own exception (safetensors: "I/O error: No space left on device (os error 28)";
    SQLite: "database or disk is full"); None for any other error."""
    if isinstance(exc, OSError) and exc.errno in NO_SPACE:
        return os.strerror(exc.errno)
    text = str(exc)
    return next((os.strerror(code) for code in NO_SPACE if os.strerror(code) in text), None) or (
        "disk is full" if "disk is full" in text else None
    )


def free_mib(path: Path) -> float:
    """Free space on the filesystem holding `path` (or its nearest existing parent), in MiB."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free / 2**20


def disk_full(
    path: Path,
    exc: BaseException,
    intact: str,
    fix: str = "Free space there (or move the project to a bigger disk), then rerun.",
) -> DiskFullError:
    """The error for a write of `path` that found no room; `intact` says what is still as it was, `fix` what to do."""
    reason = no_space(exc) or str(exc)
    return DiskFullError(
        f"{path}: could not be written, the filesystem is full ({reason}; {free_mib(path):.1f} MiB free there). "
        f"{intact} {fix}"
    )


@contextlib.contextmanager
def _no_space_is_clear(dest: Path) -> Iterator[None]:
    """Turn a full filesystem while writing `dest` into a DiskFullError that says the old `dest` is intact."""
    existed = dest.exists()
    try:
        yield
    except DiskFullError:
        raise
    except Exception as exc:
        if not no_space(exc):
            raise
        intact = f"The previous {dest.name} is intact." if existed else f"Nothing was written at {dest}."
        raise disk_full(dest, exc, intact) from exc


def _temp_prefix(dest: Path) -> str:
    """Temp files and dirs of writes to `dest` are named `.<name>.<pid>.<random>.tmp`: hidden, beside `dest` (so the
    rename is atomic), and naming the process that writes them."""
    return f".{dest.name}.{os.getpid()}."


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # another user's process, or a platform that cannot tell: leave its files alone
    return True


def remove_leftovers(dest: Path) -> None:
    """Remove what writes to `dest` by processes that died mid-write (SIGKILL, a lost machine) left beside it: their
    temp files and dirs, and the old copy of a directory moved aside; a live writer's are left alone. Without this,
    every kill during an ingest left a whole copy of the data behind, forever. An old copy moved aside when `dest` is
    missing (killed between atomic_dir's two renames) is the last whole output: it is moved back instead."""
    if not dest.parent.is_dir():
        return
    for leftover in dest.parent.glob(f".{dest.name}.*"):
        owner = leftover.name[len(dest.name) + 2 :].removeprefix("old.").split(".")[0]
        if not owner.isdigit() or int(owner) == os.getpid() or _pid_alive(int(owner)):
            continue
        if leftover.name.startswith(f".{dest.name}.old.") and not dest.exists():
            os.replace(leftover, dest)
        elif leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(dest: Path) -> Iterator[Path]:
    """Yield a temp path beside `dest`; on success fsync it and rename it over `dest`, on error remove it.

    The file keeps `dest`'s permissions (a new one gets the usual 0o666 minus the umask), not mkstemp's 0o600. A full
    filesystem is a DiskFullError naming `dest`, which is left as it was."""
    with _no_space_is_clear(dest):
        dest.parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(dest)
        fd, tmp_name = tempfile.mkstemp(prefix=_temp_prefix(dest), suffix=".tmp", dir=dest.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            os.chmod(tmp, dest.stat().st_mode & 0o7777 if dest.exists() else 0o666 & ~_UMASK)
            yield tmp
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            failpoint(f"rename-{dest.name}")
            os.replace(tmp, dest)
            fsync_dir(dest.parent)
        finally:
            tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_dir(dest: Path) -> Iterator[Path]:
    """Yield an empty temp directory beside `dest`; on success fsync its files and swap it in for `dest`. A full
    filesystem is a DiskFullError naming `dest`, which is left as it was."""
    with _no_space_is_clear(dest):
        dest.parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(dest)
        tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(dest), suffix=".tmp", dir=dest.parent))
        try:
            yield tmp
            for p in tmp.rglob("*"):
                if p.is_file():
                    with open(p, "rb+") as f:
                        os.fsync(f.fileno())
            fsync_dir(tmp)
            failpoint(f"rename-{dest.name}")
            if dest.exists() and exchange(tmp, dest):
                fsync_dir(dest.parent)  # dest is the new directory, tmp the old one (removed below)
            else:
                old = None
                if dest.exists():
                    # rename() cannot replace a non-empty directory: move the old one aside first, drop it after. (A
                    # crash between the two renames leaves dest missing: only where `exchange` is not available.)
                    old = dest.with_name(f".{dest.name}.old.{os.getpid()}")
                    shutil.rmtree(old, ignore_errors=True)
                    os.replace(dest, old)
                os.replace(tmp, dest)
                fsync_dir(dest.parent)
                if old is not None:
                    shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def write_json(path: Path, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def read_parquet(path: Path, repair: str) -> Any:
    """A Parquet file a stage wrote (a pandas DataFrame). One that cannot be read (truncated, overwritten, half a
    download) is a DataError naming it and `repair`, the commands that restore it."""
    import pandas as pd
    import pyarrow as pa

    try:
        return pd.read_parquet(path)
    except FileNotFoundError:
        raise DataError(f"{path} is missing; {repair}") from None
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DataError(f"{path} cannot be read, it is corrupt or truncated ({exc}); {repair}") from None


def sha256_files(paths: list[Path]) -> str:
    """One hash over the names and bytes of `paths`, in the given order."""
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0")
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


FAILPOINT = os.environ.get("TRAINFLOW_FAILPOINT", "")  # read once: failpoint() runs on every update
FAILPOINT_RANK = os.environ.get("TRAINFLOW_FAILPOINT_RANK", "")
FAILPOINT_WORKER = os.environ.get("TRAINFLOW_FAILPOINT_WORKER", "")
FAILPOINT_SIGNAL = os.environ.get("TRAINFLOW_FAILPOINT_SIGNAL", "")


def failpoint(name: str) -> None:
    """Fault injection for the crash tests: TRAINFLOW_FAILPOINT=<name>:<n> SIGKILLs this process on the n-th hit
    (with TRAINFLOW_FAILPOINT_RANK=<r>, only rank r of a distributed run; with TRAINFLOW_FAILPOINT_WORKER=<w>, only
    worker w of `trainflow tune`). `<name>:<n>@<seconds>` kills it that long after the n-th hit instead, while the work
    after the point goes on: a kill somewhere inside that work (a DVC commit or push, a registry write). With
    TRAINFLOW_FAILPOINT_SIGNAL=<SIGNAME> it sends that signal instead of SIGKILL (a preemption: SIGTERM, SIGUSR1).

    Points: `update` (after each training update), `checkpoint_write` (in the middle of a checkpoint), `rename-<name>`
    (an atomic write's temp file or directory is complete, not yet renamed into place), `commit-<stage>` (a stage of
    the training flow is done, DVC has not recorded it yet), `push` (the flow's DVC push begins), `register` (the
    registry decision begins), `spill-chunk` (a chunk of a streamed ingest is in its spill)."""
    spec = FAILPOINT
    if not spec or not spec.startswith(name + ":"):
        return
    if FAILPOINT_RANK and os.environ.get("RANK", "0") != FAILPOINT_RANK:  # distributed: only that rank
        return
    if FAILPOINT_WORKER and os.environ.get("TRAINFLOW_TUNE_WORKER", "0") != FAILPOINT_WORKER:  # a sweep: that worker
        return
    _hits[name] = _hits.get(name, 0) + 1
    count, _, delay = spec[len(name) + 1 :].partition("@")
    if _hits[name] != int(count):
        return
    kill = getattr(signal, FAILPOINT_SIGNAL or "SIGKILL", signal.SIGTERM)  # Windows: SIGTERM is TerminateProcess
    if delay:
        import threading

        timer = threading.Timer(float(delay), os.kill, (os.getpid(), kill))
        timer.daemon = True  # a process that ends first is not killed
        timer.start()
    else:
        os.kill(os.getpid(), kill)
        if kill == getattr(signal, "SIGSTOP", None):
            # Held here until a test sends its signal and SIGCONT. The kernel may hand that signal to another thread,
            # whose C handler only flags it for the main thread: a moment's pause lets Python run the handler here,
            # at the point the test chose, not some lines later.
            import time

            time.sleep(0.2)


_hits: dict[str, int] = {}
