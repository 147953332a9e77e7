"""trainflow imports where POSIX-only modules do not exist (Windows); its atomic writes skip what Windows cannot do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import trainflow.core.io
from trainflow.core.io import atomic_dir, fsync_dir

REPO = Path(__file__).resolve().parents[2]
POSIX_ONLY = ("fcntl", "termios", "tty", "pty", "pwd", "grp", "resource", "syslog")


def test_every_module_imports_without_posix_only_modules() -> None:
    code = f"""
import importlib, json, pkgutil, sys
for name in {POSIX_ONLY!r}:
    sys.modules[name] = None  # `import fcntl` now raises ImportError, as on Windows
failed = {{}}
for top in ("trainflow", "tasks", "flows"):
    package = importlib.import_module(top)
    for info in pkgutil.walk_packages(package.__path__, top + "."):
        if not info.name.endswith("__main__"):
            try:
                importlib.import_module(info.name)
            except ImportError as exc:
                failed[info.name] = str(exc)
print(json.dumps(failed))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == {}


def test_directory_fsync_is_skipped_where_directories_cannot_be_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_directories(path: object, flags: int, *args: object) -> int:
        raise PermissionError(13, "Permission denied", str(path))  # what os.open of a directory does on Windows

    monkeypatch.setattr(trainflow.core.io, "FSYNC_DIRECTORIES", False)  # its value on Windows ...
    monkeypatch.setattr(os, "open", no_directories)  # ... where this is what opening a directory does
    fsync_dir(tmp_path)
    with atomic_dir(tmp_path / "out") as tmp:
        (tmp / "file.txt").write_text("x")
    assert (tmp_path / "out" / "file.txt").read_text() == "x"
