"""trainflow.core.io: a file or folder is written whole or not at all (atomic_path, atomic_dir: their temp names,
the old copy moved aside, leftovers of dead processes removed), a full filesystem is named with the space left and
what was kept, JSON, Parquet and content hashes read and written as documented, and the failpoints the crash tests
kill processes at."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from support.raw_sources import as_dict, write

from trainflow.core.errors import DataError


def test_no_space_names_the_reason() -> None:
    from trainflow.core.io import no_space

    assert no_space(OSError(28, "x")) == "No space left on device"
    assert no_space(OSError(122, "x")) == "Disk quota exceeded"
    assert no_space(OSError(27, "x")) == "File too large"
    assert no_space(OSError(13, "Permission denied")) is None
    assert no_space(RuntimeError("I/O error: No space left on device (os error 28)")) == "No space left on device"
    assert no_space(RuntimeError("quota: Disk quota exceeded!")) == "Disk quota exceeded"
    assert no_space(ValueError("write: File too large")) == "File too large"
    assert no_space(RuntimeError("database or disk is full")) == "disk is full"
    assert no_space(OSError(2, "No space left on device")) == "No space left on device"  # by its text
    assert no_space(RuntimeError("anything else")) is None


def test_disk_full_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainflow.core.io
    from trainflow.core.errors import DiskFullError

    monkeypatch.setattr(trainflow.core.io, "free_mib", lambda path: 12.345)
    err = trainflow.core.io.disk_full(tmp_path / "f", OSError(28, "x"), "Kept.")
    assert isinstance(err, DiskFullError)
    assert str(err) == (
        f"{tmp_path / 'f'}: could not be written, the filesystem is full (No space left on device; 12.3 MiB free "
        "there). Kept. Free space there (or move the project to a bigger disk), then rerun."
    )
    other = trainflow.core.io.disk_full(tmp_path / "g", RuntimeError("odd"), "Kept.", "Do this.")
    assert (
        str(other)
        == f"{tmp_path / 'g'}: could not be written, the filesystem is full (odd; 12.3 MiB free there). Kept. Do this."
    )


def test_free_mib_of_a_path_not_made_yet(tmp_path: Path) -> None:
    import shutil

    from trainflow.core.io import free_mib

    got = free_mib(tmp_path / "a/b/c")
    assert got == pytest.approx(shutil.disk_usage(tmp_path).free / 2**20, rel=1e-3)


def test_full_filesystem_messages_of_atomic_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainflow.core.io
    from trainflow.core.errors import DiskFullError

    monkeypatch.setattr(trainflow.core.io, "free_mib", lambda path: 1.0)
    dest = tmp_path / "new.json"
    with pytest.raises(DiskFullError) as info, trainflow.core.io.atomic_path(dest):
        raise OSError(28, "full")
    assert str(info.value) == (
        f"{dest}: could not be written, the filesystem is full (No space left on device; 1.0 MiB free there). "
        f"Nothing was written at {dest}. Free space there (or move the project to a bigger disk), then rerun."
    )
    assert not dest.exists() and list(tmp_path.iterdir()) == []
    dest.write_text("old")
    with pytest.raises(DiskFullError) as info, trainflow.core.io.atomic_path(dest):
        raise OSError(122, "quota")
    assert str(info.value) == (
        f"{dest}: could not be written, the filesystem is full (Disk quota exceeded; 1.0 MiB free there). The "
        "previous new.json is intact. Free space there (or move the project to a bigger disk), then rerun."
    )
    assert dest.read_text() == "old"
    mine = DiskFullError("already clear")
    with pytest.raises(DiskFullError) as info, trainflow.core.io.atomic_dir(tmp_path / "d"):
        raise mine
    assert info.value is mine


def test_atomic_path_names_its_temp_file_and_keeps_special_mode_bits(tmp_path: Path) -> None:
    from trainflow.core.io import atomic_path

    dest = tmp_path / "out.json"
    with atomic_path(dest) as tmp:
        assert tmp.parent == tmp_path
        assert re.fullmatch(rf"\.out\.json\.{os.getpid()}\.[^.]+\.tmp", tmp.name), tmp.name
        tmp.write_text("1")
    dest.chmod(0o2640)
    with atomic_path(dest) as tmp:
        tmp.write_text("2")
    assert dest.stat().st_mode & 0o7777 == 0o2640 and dest.read_text() == "2"
    with pytest.raises(KeyError), atomic_path(tmp_path / "sub/deeper/f") as tmp:
        assert tmp.parent == tmp_path / "sub/deeper"  # its folder is made
        raise KeyError("x")
    assert list((tmp_path / "sub/deeper").iterdir()) == []


def test_atomic_dir_names_its_temp_dir_and_moves_the_old_one_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainflow.core.io

    with trainflow.core.io.atomic_dir(tmp_path / "out") as tmp:
        assert tmp.parent == tmp_path and tmp.is_dir() and list(tmp.iterdir()) == []
        assert re.fullmatch(rf"\.out\.{os.getpid()}\.[^.]+\.tmp", tmp.name), tmp.name
        (tmp / "sub").mkdir()
        (tmp / "sub/f").write_text("1")
    assert (tmp_path / "out/sub/f").read_text() == "1"
    monkeypatch.setattr(trainflow.core.io, "exchange", lambda a, b: False)
    moves: list[tuple[str, str]] = []
    real = os.replace

    def replace(a: Any, b: Any) -> None:
        moves.append((Path(a).name, Path(b).name))
        real(a, b)

    monkeypatch.setattr(os, "replace", replace)
    with trainflow.core.io.atomic_dir(tmp_path / "out") as tmp:
        (tmp / "g").write_text("2")
        name = tmp.name
    assert moves == [("out", f".out.old.{os.getpid()}"), (name, "out")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and (tmp_path / "out/g").read_text() == "2"


def test_fsync_dir_and_exchange_where_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    import trainflow.core.io

    with pytest.raises(FileNotFoundError):
        trainflow.core.io.fsync_dir(tmp_path / "missing")
    trainflow.core.io.fsync_dir(tmp_path)
    monkeypatch.setattr(trainflow.core.io, "FSYNC_DIRECTORIES", False)
    assert trainflow.core.io.fsync_dir(tmp_path / "missing") is None
    assert trainflow.core.io.exchange(tmp_path / "missing", tmp_path / "gone") is False
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a/x").write_text("A")
    monkeypatch.setattr(sys, "platform", "darwin")
    assert trainflow.core.io.exchange(tmp_path / "a", tmp_path / "b") is False
    assert (tmp_path / "a/x").read_text() == "A"


@pytest.mark.skipif(os.uname().sysname != "Linux", reason="renameat2 is Linux's")
def test_exchange_of_paths_relative_to_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainflow.core.io import exchange

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a/x").write_text("A")
    monkeypatch.chdir(tmp_path)
    assert exchange(Path("a"), Path("b")) is True
    assert (tmp_path / "b/x").read_text() == "A" and list((tmp_path / "a").iterdir()) == []


def test_remove_leftovers_in_detail(tmp_path: Path) -> None:
    import subprocess
    import sys

    from trainflow.core.io import remove_leftovers

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    dead = proc.pid
    remove_leftovers(tmp_path / "no/such/out")  # no folder: nothing to do
    (tmp_path / "out").mkdir()
    (tmp_path / "target").mkdir()
    (tmp_path / "target/keep").write_text("k")
    gone = [tmp_path / f".out.{dead}.a.tmp", tmp_path / f".out.{dead}.link.tmp", tmp_path / f".out.old.{dead}"]
    gone[0].write_text("a temp file")
    gone[1].symlink_to(tmp_path / "target")
    gone[2].mkdir()
    kept = [tmp_path / ".out.abc.tmp", tmp_path / f".out.{os.getpid()}.x.tmp", tmp_path / f".out.old.{os.getpid()}",
            tmp_path / ".out.1.tmp"]  # fmt: skip
    for path in kept:
        path.write_text("k")
    remove_leftovers(tmp_path / "out")
    assert not any(p.exists() or p.is_symlink() for p in gone)
    assert all(p.exists() for p in kept) and (tmp_path / "target/keep").read_text() == "k"
    assert (tmp_path / "out").is_dir()


def test_pid_alive() -> None:
    from trainflow.core.io import _pid_alive

    assert _pid_alive(os.getpid()) is True
    assert _pid_alive(2**22 + 12345) is False


def test_json_files(tmp_path: Path) -> None:
    from trainflow.core.io import read_json, write_json

    write_json(tmp_path / "a/x.json", {"b": [1, 2], "a": "é"})
    assert (tmp_path / "a/x.json").read_text() == '{\n  "a": "\\u00e9",\n  "b": [\n    1,\n    2\n  ]\n}\n'
    assert read_json(tmp_path / "a/x.json") == {"a": "é", "b": [1, 2]}


def test_read_parquet_errors(tmp_path: Path) -> None:
    from trainflow.core.io import read_parquet

    pd.DataFrame({"a": [1, 2]}).to_parquet(tmp_path / "ok.parquet")
    assert as_dict(read_parquet(tmp_path / "ok.parquet", "fix")) == {"a": [1, 2]}
    with pytest.raises(DataError) as info:
        read_parquet(tmp_path / "missing.parquet", "run it again")
    assert str(info.value) == f"{tmp_path / 'missing.parquet'} is missing; run it again"
    bad = write(tmp_path, "bad.parquet", b"PAR1 not really")
    try:
        pd.read_parquet(bad)
    except (pa.ArrowException, OSError, ValueError) as exc:
        detail = str(exc)
    with pytest.raises(DataError) as info:
        read_parquet(bad, "restore it")
    assert str(info.value) == f"{bad} cannot be read, it is corrupt or truncated ({detail}); restore it"


def test_content_hashes(tmp_path: Path) -> None:
    import hashlib

    from trainflow.core.io import sha256_files, sha256_json

    a = write(tmp_path, "a.bin", b"x" * ((1 << 20) + 5))
    b = write(tmp_path, "b.txt", b"hello")
    expected = hashlib.sha256(b"a.bin\0" + a.read_bytes() + b"b.txt\0hello").hexdigest()
    assert sha256_files([a, b]) == expected
    assert sha256_files([]) == hashlib.sha256().hexdigest()
    assert sha256_json({"b": 1, "a": [1, "x"]}) == hashlib.sha256(b'{"a":[1,"x"],"b":1}').hexdigest()


def failpoint_env(monkeypatch: pytest.MonkeyPatch, spec: str, **extra: str) -> list[tuple[int, int]]:
    import trainflow.core.io

    kills: list[tuple[int, int]] = []
    monkeypatch.setattr(trainflow.core.io, "FAILPOINT", spec)
    for name in ("RANK", "WORKER", "SIGNAL"):
        monkeypatch.setattr(trainflow.core.io, f"FAILPOINT_{name}", extra.get(name, ""))
    monkeypatch.setattr(trainflow.core.io, "_hits", {})
    monkeypatch.setattr(os, "kill", lambda pid, sig: kills.append((pid, sig)))
    return kills


def test_failpoint_kills_on_the_nth_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    import trainflow.core.io
    from trainflow.core.io import failpoint

    kills = failpoint_env(monkeypatch, "update:3")
    for _ in range(5):
        failpoint("update")
        failpoint("upd")
        failpoint("updates")
        failpoint("other")
    assert kills == [(os.getpid(), signal.SIGKILL)] and trainflow.core.io._hits == {"update": 5}
    kills = failpoint_env(monkeypatch, "")
    failpoint("update")
    assert kills == [] and trainflow.core.io._hits == {}
    kills = failpoint_env(monkeypatch, "update:1", SIGNAL="SIGUSR1")
    failpoint("update")
    assert kills == [(os.getpid(), signal.SIGUSR1)]
    kills = failpoint_env(monkeypatch, "update:1", SIGNAL="NOSUCH")
    failpoint("update")
    assert kills == [(os.getpid(), signal.SIGTERM)]


def test_failpoint_of_one_rank_or_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    import trainflow.core.io
    from trainflow.core.io import failpoint

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("TRAINFLOW_TUNE_WORKER", raising=False)
    kills = failpoint_env(monkeypatch, "update:1", RANK="1")
    failpoint("update")
    assert kills == [] and trainflow.core.io._hits == {}
    monkeypatch.setenv("RANK", "1")
    failpoint("update")
    assert kills == [(os.getpid(), signal.SIGKILL)]
    kills = failpoint_env(monkeypatch, "update:1", RANK="0")
    monkeypatch.delenv("RANK")
    failpoint("update")  # no RANK: rank 0
    assert kills == [(os.getpid(), signal.SIGKILL)]
    kills = failpoint_env(monkeypatch, "update:1", WORKER="2")
    failpoint("update")
    assert kills == [] and trainflow.core.io._hits == {}
    monkeypatch.setenv("TRAINFLOW_TUNE_WORKER", "2")
    failpoint("update")
    assert kills == [(os.getpid(), signal.SIGKILL)]
    kills = failpoint_env(monkeypatch, "update:1", WORKER="0")
    monkeypatch.delenv("TRAINFLOW_TUNE_WORKER")
    failpoint("update")
    assert kills == [(os.getpid(), signal.SIGKILL)]


def test_failpoint_with_a_delay_starts_a_daemon_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    import signal
    import threading

    from trainflow.core.io import failpoint

    timers: list[Any] = []

    class Timer:
        def __init__(self, interval: float, function: Any, args: tuple[Any, ...]) -> None:
            self.interval, self.function, self.args, self.daemon, self.started = interval, function, args, False, False
            timers.append(self)

        def start(self) -> None:
            self.started = True

    kills = failpoint_env(monkeypatch, "push:2@1.5")
    monkeypatch.setattr(threading, "Timer", Timer)
    failpoint("push")
    assert timers == []
    failpoint("push")
    assert kills == [] and len(timers) == 1
    t = timers[0]
    assert (t.interval, t.args, t.daemon, t.started) == (1.5, (os.getpid(), signal.SIGKILL), True, True)
    t.function(*t.args)
    assert kills == [(os.getpid(), signal.SIGKILL)]
