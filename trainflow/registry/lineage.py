"""Lineage facts for a run: git commit, whether the code is the commit's, DVC's hash of the data (and a copy of it in
DVC's cache), the resolved params, the environment it ran in."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from trainflow.core.io import sha256_json

# Tracked files that are not code: what a run itself rewrites, and what is recorded apart from the commit. params.yaml
# (`-S` and `tune --apply` rewrite it, as `dvc exp run -S` does; the resolved params are a tag of the version),
# dvc.lock (`dvc repro` and the flow's commits), DVC's pointers to data and its own settings (`data add` runs `dvc
# add`, which writes FILE.dvc and a .gitignore beside it; `dvc remote add` writes .dvc/config; the data trained on is
# recorded by its hash). Every other tracked file counts as code: a false "changed" costs a commit, a false "same"
# a verification that proves nothing.
NOT_CODE = ("params.yaml", "dvc.lock", "**/*.dvc", "**/.gitignore", ".dvcignore", ".dvc/**")


def git_commit(root: Path) -> tuple[str, bool]:
    """(commit, dirty): dirty if a tracked file differs from the commit. dvc.lock does not count: `dvc repro` rewrites
    it during the very run being registered. ("unknown", False) outside a git repository."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)dvc.lock"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return commit, bool(status.strip())
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False


def code_changes(root: Path, model_code: str) -> list[str] | None:
    """The files of the code that differ from HEAD, sorted ([] when the code is the commit's): tracked files but
    NOT_CODE changed (or deleted), and files git does not track (nor ignores) in trainflow/ or model.code, which the
    stages import but the commit lacks. None outside a git repository (or before its first commit)."""
    spec = [".", *(f":(exclude,glob){p}" for p in NOT_CODE)]
    owned = [p for p in ("trainflow", model_code) if _inside(root, p)]
    bytecode = [":(exclude,glob)**/__pycache__/**", ":(exclude,glob)**/*.pyc"]  # written by importing, not code
    try:
        changed = subprocess.run(
            ["git", "diff", "--name-only", "-z", "HEAD", "--", *spec], cwd=root, capture_output=True, check=True
        ).stdout
        untracked = subprocess.run(
            ["git", "ls-files", "-z", "--others", "--exclude-standard", "--", *owned, *bytecode],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    names = {n.decode(errors="replace") for n in (changed + untracked).split(b"\0") if n}
    return sorted(names)


def _inside(root: Path, rel: str) -> bool:
    """Whether `rel` (relative to root, or absolute) names something inside root: git answers only about those."""
    return (root / rel).resolve().is_relative_to(root.resolve())


def file_md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def dvc_dir_hash(folder: Path) -> tuple[str, list[dict[str, str]]]:
    """(hash, listing) of `folder` as DVC hashes a directory output (the md5 dvc.lock records for it after `dvc
    commit` or `dvc repro`): the md5 of each file, listed as {"md5", "relpath"} sorted by relative path, and the md5
    of that listing as JSON, with ".dir" after it. Computed from the files present, whoever wrote them. Reads every
    byte of every file (DVC keeps a database of hashes by mtime to skip that; this does not)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
    listing = sorted(
        ({"md5": file_md5(p), "relpath": p.relative_to(folder).as_posix()} for p in files),
        key=lambda e: e["relpath"],
    )
    digest = hashlib.md5(json.dumps(listing, sort_keys=True).encode(), usedforsecurity=False)
    return digest.hexdigest() + ".dir", listing


def dvc_cache(root: Path) -> Path:
    """Where DVC 3 keeps the project's md5-addressed files (its default cache directory)."""
    return root / ".dvc" / "cache" / "files" / "md5"


def cache_folder(root: Path, folder: Path, dir_hash: str, listing: list[dict[str, str]]) -> int:
    """Put `folder`'s files and its listing (dvc_dir_hash) into the project's DVC cache where they are missing, laid
    out as DVC lays them out (md5[:2]/md5[2:], read-only), so that `trainflow verify` finds the data a version was
    trained on after the workspace has moved on, also when no `dvc commit` stored it (the stage driver never does).
    What DVC (or an earlier call) stored already is not copied again: under `dvc repro` and `trainflow run` this
    copies nothing, after `trainflow stage` it costs one copy of the folder. Nothing outside a DVC project. The
    number of files copied."""
    if not (root / ".dvc").is_dir():
        return 0
    cache = dvc_cache(root)
    copied = 0
    for entry in listing:
        if _store(cache, entry["md5"], lambda tmp, e=entry: shutil.copyfile(folder / e["relpath"], tmp)):
            copied += 1
    text = json.dumps(listing, sort_keys=True).encode()
    _store(cache, dir_hash, lambda tmp: tmp.write_bytes(text))
    return copied


def _store(cache: Path, md5: str, write: Any) -> bool:
    """Write cache/md5[:2]/md5[2:] by `write(tmp)` unless it is there; read-only, renamed into place whole (a reader
    never sees half a file). Whether it was written."""
    dest = cache / md5[:2] / md5[2:]
    if dest.is_file():
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{dest.name[:8]}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.chmod(tmp, 0o444)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return True


def params_hash(params: dict[str, Any]) -> str:
    return sha256_json(params)[:16]


def params_record(params: dict[str, Any]) -> str:
    """The resolved params as the text params_hash hashes (compact JSON, keys sorted): the version's `params` tag."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


def environment(device: str) -> dict[str, str]:
    """What besides data, code and params decides the trained bits, as `env.*` tags: the interpreter, torch and
    numpy versions, the OS and CPU (its instruction set picks the kernels), the device trained on (`device`, as
    training.json has it; a GPU's name where one is visible) and torch's intra-op threads (how sums are split)."""
    import numpy
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        device = f"{device} ({torch.cuda.get_device_name()})"
    return {
        "env.python": platform.python_version(),
        "env.torch": str(torch.__version__),
        "env.numpy": numpy.__version__,
        "env.platform": platform.platform(),
        "env.cpu": cpu_name(),
        "env.device": device,
        "env.threads": str(torch.get_num_threads()),
    }


def cpu_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what platform knows of it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"
