"""Lineage: a run is dirty when tracked files differ from the commit, but not because `dvc repro` rewrote dvc.lock; its
code is the commit's unless a file of code differs (params.yaml and DVC's pointers to data are recorded apart); DVC's
hash of the splits and the cache they are kept in are DVC's own (checked against `dvc commit`)."""

from __future__ import annotations

import hashlib
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from trainflow.registry.lineage import (
    cache_folder,
    code_changes,
    dvc_cache,
    dvc_dir_hash,
    environment,
    file_md5,
    git_commit,
)


def test_dirty_ignores_dvc_lock_but_not_code(tmp_path: Path) -> None:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for name in ("dvc.lock", "params.yaml"):
        (tmp_path / name).write_text("a\n")
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", "-A"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=tmp_path, check=True)
    commit, dirty = git_commit(tmp_path)
    assert len(commit) == 40 and not dirty
    (tmp_path / "dvc.lock").write_text("rewritten by dvc repro\n")
    assert git_commit(tmp_path) == (commit, False)
    (tmp_path / "params.yaml").write_text("b\n")
    assert git_commit(tmp_path) == (commit, True)


def test_outside_git(tmp_path: Path) -> None:
    assert git_commit(tmp_path) == ("unknown", False)


# --- code_changes: the code differs from the commit, params.yaml and DVC's pointers to data do not count ----------


def _repo(root: Path, files: dict[str, str]) -> None:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=root, check=True)


TRACKED = {
    "params.yaml": "seed: 0\n",
    "dvc.lock": "schema: '2.0'\n",
    "dvc.yaml": "stages: {}\n",
    ".dvc/config": "[core]\n",
    ".dvcignore": "\n",
    "data/raw/a.csv.dvc": "outs: []\n",
    "data/raw/.gitignore": "/a.csv\n",
    "README.md": "hi\n",
    "trainflow/__init__.py": "",
    "trainflow/models/net.py": "W = 1\n",
    "helpers/util.py": "X = 1\n",
}


def test_what_a_run_rewrites_and_what_is_recorded_apart_is_not_code(tmp_path: Path) -> None:
    """`-S` (params.yaml), `dvc repro` (dvc.lock), `data add`'s `dvc add` (FILE.dvc, .gitignore beside it) and `dvc
    remote add` (.dvc/config) leave the code the commit's; git_dirty still says the tree differs (params.yaml)."""
    _repo(tmp_path, TRACKED)
    assert code_changes(tmp_path, "trainflow/models") == []
    for name in ("params.yaml", "dvc.lock", ".dvc/config", ".dvcignore", "data/raw/a.csv.dvc", "data/raw/.gitignore"):
        (tmp_path / name).write_text("rewritten\n")
    (tmp_path / "data/raw/b.csv.dvc").write_text("outs: []\n")  # a new pointer, untracked
    assert code_changes(tmp_path, "trainflow/models") == []
    assert git_commit(tmp_path)[1] is True


def test_every_other_tracked_file_and_untracked_modules_the_stages_import_are_code(tmp_path: Path) -> None:
    _repo(tmp_path, TRACKED)
    (tmp_path / "helpers/util.py").write_text("X = 2\n")
    (tmp_path / "dvc.yaml").write_text("stages: {a: {cmd: x}}\n")
    (tmp_path / "trainflow/models/net.py").unlink()  # a deleted file too
    (tmp_path / "trainflow/new.py").write_text("")  # untracked, in the package
    (tmp_path / "mymodel.py").write_text("")  # untracked: the model.code of this run
    (tmp_path / "scratch.py").write_text("")  # untracked, imported by nothing the stages run
    (tmp_path / "trainflow/__pycache__").mkdir()
    (tmp_path / "trainflow/__pycache__/new.cpython-311.pyc").write_bytes(b"\0")  # bytecode: not code
    assert code_changes(tmp_path, "mymodel.py") == [
        "dvc.yaml",
        "helpers/util.py",
        "mymodel.py",
        "trainflow/models/net.py",
        "trainflow/new.py",
    ]
    assert code_changes(tmp_path, "../outside.py") == [
        "dvc.yaml",
        "helpers/util.py",
        "trainflow/models/net.py",
        "trainflow/new.py",
    ]


def test_code_changes_outside_git_are_unknown(tmp_path: Path) -> None:
    assert code_changes(tmp_path, "trainflow/models") is None


# --- DVC's hash of a directory, against DVC's own -------------------------------------------------------------------

# Names whose order differs by string and by path parts ("a.b" < "a/b" as text, not as parts), by case, non-ASCII
# and an empty file.
FILES = {"a.b": b"1", "a/b": b"2", "a/c/d.parquet": b"3" * 5000, "B.txt": b"", "\u00e9t\u00e9.json": b"{}"}


def _dvc_project(root: Path) -> Path:
    """A DVC project (no git) whose stage `split` outputs data/splits holding FILES (written outside DVC)."""
    from dvc.repo import Repo

    root.mkdir(parents=True)
    Repo.init(str(root), no_scm=True).close()
    (root / "dvc.yaml").write_text("stages:\n  split:\n    cmd: 'true'\n    outs:\n      - data/splits\n")
    for name, data in FILES.items():
        (root / "data/splits" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "data/splits" / name).write_bytes(data)
    return root


def _tree(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.relative_to(folder).as_posix(): (p.read_bytes(), p.stat().st_mode & 0o777)
            for p in folder.rglob("*") if p.is_file()}  # fmt: skip


def test_dvc_dir_hash_is_what_dvc_commit_records_and_cache_folder_stores_what_dvc_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dvc commit -f split` records data/splits' hash in dvc.lock and stores files and listing in the cache: the
    same hash, the same cache files (names, bytes, read-only), as dvc_dir_hash and cache_folder give."""
    import yaml
    from dvc.repo import Repo

    theirs = _dvc_project(tmp_path / "dvc")
    monkeypatch.chdir(theirs)  # DVC resolves a stage name in the current directory's dvc.yaml
    with Repo(str(theirs)) as repo:
        repo.commit("split", force=True)  # `dvc commit -f split`
    (out,) = yaml.safe_load((theirs / "dvc.lock").read_text())["stages"]["split"]["outs"]
    ours = _dvc_project(tmp_path / "ours")
    dir_hash, listing = dvc_dir_hash(ours / "data/splits")
    assert out["md5"].endswith(".dir") and dir_hash == out["md5"]
    assert cache_folder(ours, ours / "data/splits", dir_hash, listing) == len(FILES)
    assert _tree(dvc_cache(ours)) == _tree(dvc_cache(theirs))
    assert cache_folder(ours, ours / "data/splits", dir_hash, listing) == 0  # stored already: nothing copied
    # DVC checks the folder out of the cache cache_folder filled, by that hash
    (ours / "restored.dvc").write_text(f"outs:\n- md5: {dir_hash}\n  path: restored\n  hash: md5\n")
    monkeypatch.chdir(ours)
    with Repo(str(ours)) as repo:
        repo.checkout(targets=[str(ours / "restored.dvc")])  # `dvc checkout restored.dvc`
    assert {k: v[0] for k, v in _tree(ours / "restored").items()} == FILES


def test_cache_folder_outside_a_dvc_project_stores_nothing(tmp_path: Path) -> None:
    (tmp_path / "splits").mkdir()
    (tmp_path / "splits/a").write_bytes(b"a")
    assert cache_folder(tmp_path, tmp_path / "splits", *dvc_dir_hash(tmp_path / "splits")) == 0
    assert not (tmp_path / ".dvc").exists()


def test_file_md5_reads_files_larger_than_its_block(tmp_path: Path) -> None:
    data = bytes(range(256)) * 8193  # 2 MiB + 2 KiB: three blocks of 1 MiB
    (tmp_path / "f").write_bytes(data)
    assert file_md5(tmp_path / "f") == hashlib.md5(data).hexdigest()


# --- the environment ---------------------------------------------------------------------------------------------


def test_environment_names_versions_machine_device_and_threads() -> None:
    import numpy
    import torch

    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        None,
    )  # fmt: skip
    assert environment("cpu") == {
        "env.python": "{}.{}.{}".format(*sys.version_info[:3]),
        "env.torch": torch.__version__,
        "env.numpy": numpy.__version__,
        "env.platform": platform.platform(),
        "env.cpu": cpu or platform.processor() or platform.machine(),
        "env.device": "cpu",
        "env.threads": str(torch.get_num_threads()),
    }
