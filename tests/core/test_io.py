"""Atomic directory writes: the old directory is replaced in one step (no moment without it) where the system can
swap two directories, by two renames elsewhere; nothing is left behind either way."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

import trainflow.core.io
from trainflow.core.errors import DiskFullError
from trainflow.core.io import atomic_dir, atomic_path, exchange


def contents(d: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in d.iterdir()}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="renameat2 is Linux's")
def test_exchange_swaps_two_directories(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x").write_text("A")
    (tmp_path / "b" / "y").write_text("B")
    assert exchange(tmp_path / "a", tmp_path / "b")
    assert contents(tmp_path / "a") == {"y": "B"} and contents(tmp_path / "b") == {"x": "A"}


@pytest.mark.parametrize("swap", [True, False], ids=["exchange", "two-renames"])
def test_atomic_dir_replaces_a_directory_and_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swap: bool
) -> None:
    if not swap:
        monkeypatch.setattr(trainflow.core.io, "exchange", lambda a, b: False)
    for version in ("1", "2", "3"):
        with atomic_dir(tmp_path / "out") as tmp:
            (tmp / "f").write_text(version)
            (tmp / version).write_text("only in this version")
    assert contents(tmp_path / "out") == {"f": "3", "3": "only in this version"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_failed_write_leaves_the_old_directory(tmp_path: Path) -> None:
    with atomic_dir(tmp_path / "out") as tmp:
        (tmp / "f").write_text("old")
    with pytest.raises(RuntimeError), atomic_dir(tmp_path / "out") as tmp:
        (tmp / "f").write_text("new, half")
        raise RuntimeError("the stage failed")
    assert contents(tmp_path / "out") == {"f": "old"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("write", ["atomic_dir", "atomic_path"])
def test_what_a_killed_write_left_behind_goes_with_the_next_write_and_a_live_writers_stays(
    tmp_path: Path, write: str
) -> None:
    """A SIGKILLed write leaves its temp copy beside the output (a whole copy of the data, for an ingest); the next
    write of that output removes it, and never the temp file of a writer that is still alive."""
    dead, alive = dead_pid(), os.getppid()
    left = [tmp_path / f".out.{dead}.abc123.tmp"]
    if write == "atomic_dir":
        (tmp_path / "out").mkdir()  # in place: an old copy moved aside is garbage
        left.append(tmp_path / f".out.old.{dead}")
    kept = [tmp_path / f".out.{alive}.def456.tmp", tmp_path / ".other.1.tmp", tmp_path / f".outer.{dead}.x.tmp"]
    for path in [*left, *kept]:
        path.mkdir()
        (path / "data").write_text("a copy")
    if write == "atomic_dir":
        with atomic_dir(tmp_path / "out") as tmp:
            (tmp / "f").write_text("new")
    else:
        with atomic_path(tmp_path / "out") as tmp:
            tmp.write_text("new")
    assert not any(p.exists() for p in left)
    assert all(p.exists() for p in kept)


def test_a_full_filesystem_is_a_clear_error_that_keeps_the_old_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with atomic_dir(tmp_path / "out") as tmp:
        (tmp / "f").write_text("old")
    with pytest.raises(DiskFullError) as err, atomic_dir(tmp_path / "out") as tmp:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp / "f"))
    assert str(err.value).startswith(f"{tmp_path / 'out'}: could not be written, the filesystem is full")
    assert "The previous out is intact." in str(err.value) and err.value.exit_code == 1
    assert contents(tmp_path / "out") == {"f": "old"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    # Libraries wrap the OS error in their own (safetensors: a SafetensorError holding "StorageFull").
    with pytest.raises(DiskFullError, match="Nothing was written at"), atomic_path(tmp_path / "new.json"):
        raise RuntimeError('IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })')
    with pytest.raises(ValueError, match="not about space"), atomic_path(tmp_path / "new.json"):
        raise ValueError("not about space")


def test_an_atomic_write_keeps_the_files_permissions(tmp_path: Path) -> None:
    dest = tmp_path / "f"
    with atomic_path(dest) as tmp:
        tmp.write_text("1")
    mask = os.umask(0)
    os.umask(mask)
    assert dest.stat().st_mode & 0o777 == 0o666 & ~mask  # not mkstemp's 0o600
    dest.chmod(0o640)
    with atomic_path(dest) as tmp:
        tmp.write_text("2")
    assert dest.stat().st_mode & 0o777 == 0o640


def test_an_old_directory_moved_aside_by_a_killed_write_comes_back_when_the_output_is_missing(tmp_path: Path) -> None:
    """Where directories cannot be swapped in one step, a write killed between its two renames leaves the old output
    moved aside and none in place: the next write of it starts from the old one, not from nothing."""
    old = tmp_path / f".out.old.{dead_pid()}"
    old.mkdir()
    (old / "f").write_text("old")
    trainflow.core.io.remove_leftovers(tmp_path / "out")
    assert contents(tmp_path / "out") == {"f": "old"} and not old.exists()
