"""The modules that moved into the layers (core, artifacts, registry, ...) keep their old import paths for users' own
code for one release, and the project itself never uses those paths (lint bans the imports; this also catches them
in strings, such as `monkeypatch.setattr("trainflow.predict.load", ...)`, which would patch nothing we run)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

from trainflow._moved import MOVED

REPO = Path(__file__).resolve().parents[2]


def as_path(dotted: str) -> Path:
    return REPO / (dotted.replace(".", "/") + ".py")


def test_every_old_import_path_is_the_moved_module_with_a_deprecation_warning() -> None:
    for old, new in MOVED.items():
        assert as_path(new).is_file() and not as_path(old).exists(), (old, new)
    # A fresh interpreter, in which no old name has been imported yet (one for all: each costs seconds of imports).
    code = (
        "import importlib, json, sys, warnings\n"
        "from trainflow._moved import MOVED\n"
        "out = {}\n"
        "for old, new in MOVED.items():\n"
        "    assert old not in sys.modules, old\n"
        "    with warnings.catch_warnings(record=True) as seen:\n"
        "        warnings.simplefilter('always')\n"
        "        module = importlib.import_module(old)\n"
        "    said = [str(w.message) for w in seen if w.category is DeprecationWarning and old in str(w.message)]\n"
        "    out[old] = [module is importlib.import_module(new), module.__file__, said]\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert got == {
        old: [True, str(as_path(new)), [f"{old} is now {new}; the old name stops working in trainflow 0.3"]]
        for old, new in MOVED.items()
    }


def test_from_trainflow_import_an_old_name_gives_the_moved_module() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from trainflow import why  # noqa: TID251 - the old path, on purpose
    from trainflow.registry import changes

    assert why is changes


def test_no_file_of_the_project_names_an_old_module_path() -> None:
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    old = "|".join(re.escape(m) for m in sorted(MOVED, key=len, reverse=True))
    # a module reference: imported, or an attribute of it named (a tag name such as "trainflow.why" is neither)
    named = re.compile(rf"(?:from\s+({old})\s+import|import\s+({old})\b|\b({old})\.[A-Za-z_])")
    # BENCHMARKS.md and the benchmarks' pages and history (benchmarks/) are a log: a measurement names the modules as
    # they were when it was made.
    allowed = {
        "trainflow/_moved.py",
        "pyproject.toml",
        "CHANGELOG.md",
        "BENCHMARKS.md",
        "tests/contracts/test_moved_modules.py",
    }
    allowed_folders = ("benchmarks/",)
    found = [
        f"{name}:{n}: {line.strip()}"
        for name in listed
        if name.endswith((".py", ".md", ".yaml", ".toml", ".sh"))
        and name not in allowed
        and not name.startswith(allowed_folders)
        and (REPO / name).is_file()
        for n, line in enumerate((REPO / name).read_text(errors="replace").splitlines(), 1)
        if named.search(line)
    ]
    assert not found, "\n".join(found)
