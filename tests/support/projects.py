"""Temp projects holding this checkout's pipeline, and the data and runs the tests build them from."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]


def _forget_set_tracking_uri() -> None:
    """Drop what `mlflow.set_tracking_uri` left in this worker (trainflow.tracking.configure in an in-process stage,
    a chaos check pointing at its server): it outranks MLFLOW_TRACKING_URI, so a later test's client would reach an
    earlier test's store, or its stopped server. Only when mlflow is imported already: importing it costs seconds."""
    utils = sys.modules.get("mlflow.tracking._tracking_service.utils")
    if utils is not None:
        utils._tracking_uri = None  # type: ignore[attr-defined]


# Files a project needs for DVC to run the pipeline: its definition and the library code stages depend on (as in
# this working copy: the code under test), and its defaults (as committed: see `committed`).
PROJECT_FILES = ("dvc.yaml", ".dvcignore", ".dvc/.gitignore", "trainflow")
DEFAULTS = ("params.yaml", ".dvc/config", "data/raw")


@functools.cache
def committed(rel: str, root: Path = REPO) -> dict[str, bytes]:
    """The files at `rel` (a file or a folder) as the last commit of `root` has them, by path under `root`.

    What a user changes by following the README (params.yaml after `-S` overrides, their own data in data/raw, a DVC
    remote in .dvc/config) is their working state, which no test may build on: tests start from the committed
    defaults. Outside a git checkout of its own (an unpacked archive, mutmut's copy in mutants/), the files on disk."""
    git = ["git", "-C", str(root)]
    top = subprocess.run([*git, "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root.resolve():
        on_disk = [root / rel] if (root / rel).is_file() else sorted(p for p in (root / rel).rglob("*") if p.is_file())
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in on_disk}
    names = subprocess.run([*git, "ls-tree", "-r", "--name-only", "HEAD", "--", rel], capture_output=True, text=True)
    return {
        name: subprocess.run([*git, "show", f"HEAD:{name}"], capture_output=True, check=True).stdout
        for name in names.stdout.splitlines()
    }


def model_run(client: Any, experiment: str, where: Path) -> str:
    """A run holding a stand-in model (a directory with an MLmodel file: what register_model looks for)."""
    run_id = str(client.create_run(experiment).info.run_id)
    model = where / run_id / "model"
    model.mkdir(parents=True)
    (model / "MLmodel").write_text("flavors: {}\n")
    client.log_artifacts(run_id, str(model), "model")
    return run_id


def make_project(dest: Path, params: dict[str, object] | None = None) -> Path:
    """A fresh git + DVC project in `dest` holding this repo's pipeline, optionally with params overrides."""
    dest.mkdir(parents=True, exist_ok=True)
    for rel in PROJECT_FILES:
        src = REPO / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    (dest / "data/raw").mkdir(parents=True)  # where a test's own data goes
    for rel in DEFAULTS:
        for name, content in committed(rel).items():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes(content)
    if params:
        from trainflow.params import write_overrides

        write_overrides(dest / "params.yaml", [f"{k}={v}" for k, v in params.items()])
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=dest, check=True)
    subprocess.run([*git, "add", "-A"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=dest, check=True)
    return dest


FAST = {"train.epochs": 4, "train.progress": "false", "train.batch_size": 16}


def blobs(n: int = 240, classes: int = 3, features: int = 4, seed: int = 0, separation: float = 6.0) -> pd.DataFrame:
    """Gaussian blobs; with the default separation any working classifier scores near 1.0 on them, with ~1 they
    overlap, so a model makes mistakes (and macro and micro averages differ)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    centers = rng.normal(0, separation, (classes, features))
    x = centers[y] + rng.normal(0, 1, (n, features))
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(features)])
    frame["label"] = np.array(["a", "b", "c", "d", "e"])[y]
    return frame


def split_project(root: Path, settings: dict[str, object]) -> Path:
    """make_project's project with its splits made and committed to DVC in this process (as `dvc repro split` would:
    a `trainflow` command then finds nothing to ingest or split) and its MLflow database created: what a module
    fixture prepares once for its tests to copy, so that none pays for ingest, split or MLflow's migrations."""
    from mlflow.tracking import MlflowClient

    from tasks import dvc
    from trainflow.core.paths import Paths
    from trainflow.params import load_params
    from trainflow.stages import run_stage

    make_project(root, settings)
    paths = Paths(root)
    for stage in ("ingest", "split"):
        run_stage(stage, load_params(paths.params), paths)
        dvc.commit(root, stage)
    MlflowClient(f"sqlite:///{root / 'mlflow.db'}").search_experiments()
    return root


def run_blobs_once(base: Path, empty_store: Path, data: pd.DataFrame) -> Path:
    """csv_project's project on `data`, run through every stage in-process once, in base/work/proj, and kept as
    base/pristine with its MLflow store as base/mlflow.db: what a module fixture builds for `fresh_copy` to hand out.
    A whole run is seconds; a module's tests that start from a finished run share one."""
    from trainflow.core.paths import Paths
    from trainflow.params import load_params
    from trainflow.stages import STAGES, run_stage

    root = make_project(
        base / "work" / "proj",
        {"data.source": "data/raw/blobs.csv", "data.target": "label", "register.model_name": "blobs", **FAST},
    )
    data.to_csv(root / "data/raw/blobs.csv", index=False)
    shutil.copyfile(empty_store, base / "mlflow.db")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{base / 'mlflow.db'}")
        paths = Paths(root)
        for stage in STAGES:
            run_stage(stage, load_params(paths.params), paths)
    _forget_set_tracking_uri()
    shutil.copytree(root, base / "pristine", symlinks=True)
    return base


def fresh_copy(base: Path) -> Path:
    """A fresh copy of run_blobs_once's project, and of its MLflow store as the running test's (MLFLOW_TRACKING_URI).
    The copy goes back to the path it ran at, since the store holds absolute artifact paths under it: so a module's
    tests that use it must run one after another (as they do: --dist loadfile keeps a file on one worker)."""
    work = base / "work"
    shutil.rmtree(work)
    shutil.copytree(base / "pristine", work / "proj", symlinks=True)
    shutil.copyfile(base / "mlflow.db", os.environ["MLFLOW_TRACKING_URI"].removeprefix("sqlite:///"))
    return work / "proj"


def retrain(root: Path, seed: int) -> None:
    """A new training run, as after new data or params: the same model, trained from another seed (new weights)."""
    from trainflow.core.paths import Paths
    from trainflow.params import load_params, write_overrides
    from trainflow.stages import run_stage

    paths = Paths(root)
    write_overrides(paths.params, [f"seed={seed}"])
    for stage in ("train", "evaluate"):
        run_stage(stage, load_params(paths.params), paths)
