"""SIGKILL at a random update, or in the middle of writing a checkpoint; `resume: auto` must finish bit-identically,
also under fp16 with a GradScaler whose scale backs off and grows throughout the run, and on the device path."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.crash_runs import same_run

SCRIPT = Path(__file__).with_name("crash_run.py")
TOTAL_UPDATES = 4 * 13  # 4 epochs of ceil(203 / 16) windows


def train(ckpt: Path, out: Path, flags: str, failpoint: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ}
    env.pop("TRAINFLOW_FAILPOINT", None)
    if failpoint:
        env["TRAINFLOW_FAILPOINT"] = failpoint
    args = [sys.executable, str(SCRIPT), str(ckpt), str(out), *([flags] if flags else [])]
    return subprocess.run(args, env=env, capture_output=True, text=True)


# The uninterrupted runs of several flags, one after another in one interpreter: each run seeds and builds everything
# afresh (crash_run.main), so it ends as it would alone, and the interpreter starts (torch: seconds) once, not per
# flags.
UNINTERRUPTED = """
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[1])
from crash_run import main

for base, flags in zip(sys.argv[2::2], sys.argv[3::2]):
    main(Path(base) / "ckpt", Path(base) / "out", set(flags.split(",")) if flags else set())
"""


@pytest.fixture(scope="module")
def uninterrupted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The uninterrupted run's outputs for the given flags: run once for every flags this session's tests of this
    module use, shared by the tests."""
    wanted = sorted({item.callspec.params["flags"] for item in request.session.items if item.module is request.module})
    done = {flags: tmp_path_factory.mktemp("full") for flags in wanted}
    env = {k: v for k, v in os.environ.items() if k != "TRAINFLOW_FAILPOINT"}
    args = [str(SCRIPT.parent)]
    for flags, base in done.items():
        args += [str(base), flags]
    run = subprocess.run([sys.executable, "-c", UNINTERRUPTED, *args], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr

    def get(flags: str) -> Path:
        return done[flags] / "out"

    return get


# README line 2 keeps a kill in an fp32 update and one in an fp16 checkpoint write; the others run in the slow tier.
@pytest.mark.parametrize(
    ("flags", "seed"),
    [
        ("", 0),
        pytest.param("", 1, marks=pytest.mark.slow),
        pytest.param("fp16", 3, marks=pytest.mark.slow),
        pytest.param("fp16,device", 4, marks=pytest.mark.slow),
    ],
)
def test_sigkill_at_a_random_update_then_resume_is_bit_identical(
    uninterrupted: Any, tmp_path: Path, flags: str, seed: int
) -> None:
    update = random.Random(seed).randint(2, TOTAL_UPDATES - 1)
    crashed = train(tmp_path / "ckpt", tmp_path / "out", flags, failpoint=f"update:{update}")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert not (tmp_path / "out").exists()
    # Checkpoints are written in the background: one requested just before the kill may not have landed.
    landed = list((tmp_path / "ckpt").glob("step-*"))
    assert landed or update < 6
    resumed = train(tmp_path / "ckpt", tmp_path / "out", flags)
    assert resumed.returncode == 0, resumed.stderr
    assert ("train: resumed from" in resumed.stderr) == bool(landed)
    assert same_run(uninterrupted(flags), tmp_path / "out")


@pytest.mark.parametrize(
    ("flags", "nth"),
    [pytest.param("", 1, marks=pytest.mark.slow), pytest.param("", 4, marks=pytest.mark.slow), ("fp16,device", 6)],
)
def test_sigkill_while_writing_a_checkpoint_then_resume_is_bit_identical(
    uninterrupted: Any, tmp_path: Path, flags: str, nth: int
) -> None:
    crashed = train(tmp_path / "ckpt", tmp_path / "out", flags, failpoint=f"checkpoint_write:{nth}")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    leftovers = [p.name for p in (tmp_path / "ckpt").iterdir() if p.name.endswith(".tmp")]
    assert leftovers, "the kill should have left a half-written temp checkpoint"
    resumed = train(tmp_path / "ckpt", tmp_path / "out", flags)
    assert resumed.returncode == 0, resumed.stderr
    assert same_run(uninterrupted(flags), tmp_path / "out")
    assert not [p for p in (tmp_path / "ckpt").iterdir() if p.name.endswith(".tmp")]  # cleaned up
