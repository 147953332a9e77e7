"""Atomic directory writes: the old directory is replaced in one step (no moment without it) where the system can
swap two directories, by two renames elsewhere; nothing is left behind either way."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import trainflow.io
from trainflow.io import atomic_dir, exchange


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
        monkeypatch.setattr(trainflow.io, "exchange", lambda a, b: False)
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
