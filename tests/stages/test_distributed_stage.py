"""`trainflow stage train` with train.world_size: 2 — the stage starts the ranks itself; a killed rank stops the run
within seconds (exit 1, never a hang) and rerunning resumes to the same weights, bit for bit, as a run never killed.
And the whole pipeline on two processes, through both drivers. (Slow tier: each launch spawns two fresh processes.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file
from support.projects import make_project

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
# iris: 97 train rows in windows of 8 x 2 ranks = 16: 6 whole windows and one of 1 row (rank 1's shard is empty).
SETTINGS = {
    "data.source": "builtin:iris",
    "register.model_name": "iris",
    "train.epochs": 3,
    "train.progress": "false",
    "train.batch_size": 8,
    "train.world_size": 2,
    "train.checkpoint_every": 4,
    "train.eval_every": 5,
}


def stage(root: Path, name: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "trainflow"), "stage", name],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}", **env},
    )


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project whose splits are made (in this process: the stage driver's own subprocesses are not what these tests
    check), for each test to copy."""
    from trainflow.core.paths import Paths
    from trainflow.params import load_params
    from trainflow.stages import run_stage

    root = make_project(tmp_path_factory.mktemp("split") / "p", SETTINGS)
    paths = Paths(root)
    for s in ("ingest", "split"):
        run_stage(s, load_params(paths.params), paths)
    return root


def project(split: Path, dest: Path) -> Path:
    return Path(shutil.copytree(split, dest))


def weights(root: Path) -> dict[str, bytes]:
    return {k: v.numpy().tobytes() for k, v in load_file(root / "models/final/model.safetensors").items()}


@pytest.fixture(scope="module")
def uninterrupted(split: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = project(split, tmp_path_factory.mktemp("whole") / "p")
    done = stage(root, "train")
    assert done.returncode == 0, done.stderr
    assert "starting 2 processes" in done.stderr
    training = json.loads((root / "models/final/training.json").read_text())
    assert training["world_size"] == 2 and training["updates"] == 3 * 7
    return root


@pytest.mark.parametrize(
    ("failpoint", "rank"),
    [("update:10", "1"), ("checkpoint_write:3", "0")],  # mid-epoch 2, on rank 1; writing a checkpoint, on rank 0
)
def test_a_killed_rank_stops_the_run_and_a_rerun_resumes_bit_identically(
    split: Path, uninterrupted: Path, tmp_path: Path, failpoint: str, rank: str
) -> None:
    root = project(split, tmp_path / "p")
    started = time.monotonic()
    # A rank left waiting on its dead peer would wait out the collective timeout: 600 s here, so a bound far above
    # the run's own time (about 20 s on 2 busy cores, spawning the ranks included) still tells a stop from a hang.
    killed = stage(
        root, "train", TRAINFLOW_FAILPOINT=failpoint, TRAINFLOW_FAILPOINT_RANK=rank, TRAINFLOW_COLLECTIVE_TIMEOUT="600"
    )
    assert killed.returncode == 1, killed.stderr[-3000:]
    elapsed = time.monotonic() - started
    print(f"killed run: {elapsed:.1f} s")
    assert elapsed < 120
    assert f"rank {rank} of the distributed run was killed by SIGKILL" in killed.stderr
    assert not (root / "models/final").exists()

    resumed = stage(root, "train")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    run = json.loads((root / "reports/train_run.json").read_text())  # how the run went (not part of the model)
    assert run["resumed_from_update"] is not None and run["resumed_from_update"] > 0
    assert weights(root) == weights(uninterrupted)


def test_the_pipeline_on_two_processes_through_both_drivers(tmp_path: Path) -> None:
    """`trainflow run -S train.world_size=2` and then `dvc repro` after a change: both end with `dvc status` clean."""
    root = make_project(tmp_path / "p", {k: v for k, v in SETTINGS.items() if k != "train.world_size"})
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}
    env["PATH"] = f"{BIN}:{env['PATH']}"  # dvc repro runs `trainflow stage ...` through the shell
    run = subprocess.run(
        [str(BIN / "trainflow"), "run", "-S", "train.world_size=2"], cwd=root, capture_output=True, text=True, env=env
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads((root / "models/final/training.json").read_text())["world_size"] == 2
    status = subprocess.run([str(BIN / "dvc"), "status"], cwd=root, capture_output=True, text=True, env=env)
    assert "up to date" in status.stdout, status.stdout

    subprocess.run([str(BIN / "trainflow"), "params", "check"], cwd=root, check=True, env=env, capture_output=True)
    from trainflow.params import write_overrides

    write_overrides(root / "params.yaml", ["train.epochs=4"])
    repro = subprocess.run([str(BIN / "dvc"), "repro"], cwd=root, capture_output=True, text=True, env=env)
    assert repro.returncode == 0, repro.stdout[-2000:] + repro.stderr[-3000:]
    assert "starting 2 processes" in repro.stderr + repro.stdout
    training = json.loads((root / "models/final/training.json").read_text())
    assert training["world_size"] == 2 and training["epochs"] == 4
    status = subprocess.run([str(BIN / "dvc"), "status"], cwd=root, capture_output=True, text=True, env=env)
    assert "up to date" in status.stdout, status.stdout
