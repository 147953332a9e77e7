"""SIGKILL at a random update, or in the middle of writing a checkpoint, on the GPU with `train.deterministic: true`;
`resume: auto` must finish bit-identically to a run never killed: the weights, every evaluation, the applied update
count and the GradScaler's state. tests/engine/test_crash_resume.py runs the same on the CPU."""

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

SCRIPT = Path(__file__).with_name("cuda_crash_run.py")
TOTAL_UPDATES = 4 * 13  # 4 epochs of ceil(203 / 16) windows


def train(ckpt: Path, out: Path, flags: str, failpoint: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ}
    env.pop("TRAINFLOW_FAILPOINT", None)
    if failpoint:
        env["TRAINFLOW_FAILPOINT"] = failpoint
    args = [sys.executable, str(SCRIPT), str(ckpt), str(out), *([flags] if flags else [])]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The uninterrupted run's outputs for the given flags (one run per flags, shared by the tests)."""
    done: dict[str, Path] = {}

    def get(flags: str) -> Path:
        if flags not in done:
            base = tmp_path_factory.mktemp("full")
            run = train(base / "ckpt", base / "out", flags)
            assert run.returncode == 0, run.stderr
            done[flags] = base / "out"
        return done[flags]

    return get


@pytest.mark.parametrize(("flags", "seed"), [("", 0), ("fp16", 3), ("text", 5)])
def test_sigkill_at_a_random_update_then_resume_is_bit_identical_on_the_gpu(
    uninterrupted: Any, tmp_path: Path, flags: str, seed: int
) -> None:
    update = random.Random(seed).randint(2, TOTAL_UPDATES - 1)
    crashed = train(tmp_path / "ckpt", tmp_path / "out", flags, failpoint=f"update:{update}")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert not (tmp_path / "out").exists()
    landed = list((tmp_path / "ckpt").glob("step-*"))  # written in the background: the last may not have landed
    assert landed or update < 6
    resumed = train(tmp_path / "ckpt", tmp_path / "out", flags)
    assert resumed.returncode == 0, resumed.stderr
    assert ("train: resumed from" in resumed.stderr) == bool(landed)
    assert same_run(uninterrupted(flags), tmp_path / "out")


@pytest.mark.parametrize(("flags", "nth"), [("fp16", 4), ("text", 6)])
def test_sigkill_while_writing_a_checkpoint_then_resume_is_bit_identical_on_the_gpu(
    uninterrupted: Any, tmp_path: Path, flags: str, nth: int
) -> None:
    crashed = train(tmp_path / "ckpt", tmp_path / "out", flags, failpoint=f"checkpoint_write:{nth}")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert [p.name for p in (tmp_path / "ckpt").iterdir() if p.name.endswith(".tmp")], "no half-written checkpoint"
    resumed = train(tmp_path / "ckpt", tmp_path / "out", flags)
    assert resumed.returncode == 0, resumed.stderr
    assert same_run(uninterrupted(flags), tmp_path / "out")
