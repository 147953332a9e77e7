"""Atomic writes and content hashes. A crash or an error never leaves a half-written output behind."""

from __future__ import annotations

import contextlib
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

from trainflow.errors import DataError

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


@contextlib.contextmanager
def atomic_path(dest: Path) -> Iterator[Path]:
    """Yield a temp path beside `dest`; on success fsync it and rename it over `dest`, on error remove it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
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
    """Yield an empty temp directory beside `dest`; on success fsync its files and swap it in for `dest`."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
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


def failpoint(name: str) -> None:
    """Fault injection for the crash tests: TRAINFLOW_FAILPOINT=<name>:<n> SIGKILLs this process on the n-th hit
    (with TRAINFLOW_FAILPOINT_RANK=<r>, only rank r of a distributed run; with TRAINFLOW_FAILPOINT_WORKER=<w>, only
    worker w of `trainflow tune`).

    Points: `update` (after each training update), `checkpoint_write` (in the middle of a checkpoint), `rename-<name>`
    (an atomic write's temp file or directory is complete, not yet renamed into place)."""
    spec = FAILPOINT
    if not spec or not spec.startswith(name + ":"):
        return
    if FAILPOINT_RANK and os.environ.get("RANK", "0") != FAILPOINT_RANK:  # distributed: only that rank
        return
    if FAILPOINT_WORKER and os.environ.get("TRAINFLOW_TUNE_WORKER", "0") != FAILPOINT_WORKER:  # a sweep: that worker
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == int(spec.rsplit(":", 1)[1]):
        os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))  # Windows: SIGTERM is TerminateProcess


_hits: dict[str, int] = {}
