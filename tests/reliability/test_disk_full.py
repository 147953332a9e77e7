"""Disk full (issue 16): a checkpoint write, a model export and a DVC push that hit a full filesystem fail with a
clear error naming the path (exit 1, no traceback); what was there before is intact; once space is freed, the next
run completes (and resumes training from the checkpoint that was intact).

The full filesystem is a real one: a small tmpfs mounted over the project's models/ (and one for the DVC remote),
filled with a file at the moment the test wants. Mounting needs root (as in CI here); elsewhere the tests skip.
Slow tier.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.projects import make_project
from support.vcs import DVC

from trainflow.engine.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow  # ~1 min: seven trainflow processes

IRIS = {"data.source": "builtin:iris", "register.model_name": "iris", "train.progress": "false"}


class SmallDisk:
    """A tmpfs of `size` mounted at `path` (over what is there), which `fill` makes full and `free` empties again."""

    def __init__(self, path: Path, size: str) -> None:
        self.path = path
        self.filler = path / ".filler"
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")

    def fill(self) -> None:
        with open(self.filler, "ab", buffering=0) as f:
            for chunk in (1 << 16, 1 << 10, 1):  # to the last byte
                with contextlib.suppress(OSError):
                    while True:
                        f.write(b"\0" * chunk)

    def free(self) -> None:
        self.filler.unlink()

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=False)


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[SmallDisk]:
    disk = SmallDisk(path, size)
    try:
        yield disk
    finally:
        disk.unmount()


def trainflow(root: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root.parent / 'mlflow.db'}"}
    cmd = [sys.executable, "-m", "trainflow", *args]
    return subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    _, err = proc.communicate(timeout=600)
    return proc.returncode, err


def test_a_full_disk_stops_a_checkpoint_and_an_export_cleanly_and_the_run_after_completes(tmp_path: Path) -> None:
    root = make_project(tmp_path / "proj", {**IRIS, "train.epochs": 60, "train.batch_size": 8, "train.patience": 100})
    assert subprocess.run([DVC, "repro", "split"], cwd=root, capture_output=True).returncode == 0
    with small_disk(root / "models", "64m") as disk:
        # 1. The disk fills up while training writes its checkpoints.
        train = trainflow(root, "stage", "train")
        deadline = time.monotonic() + 120
        while not list((root / "models/checkpoints").glob("step-*")):
            assert train.poll() is None and time.monotonic() < deadline, finish(train)[1][-3000:]
            time.sleep(0.02)
        disk.fill()
        code, err = finish(train)
        assert code == 1 and "Traceback" not in err, err[-3000:]
        assert "could not be written, the filesystem is full (No space left on device" in err
        line = next(line for line in err.splitlines() if line.startswith("error: "))
        failed = Path(line.removeprefix("error: ").split(":")[0])
        assert failed.parent == root / "models/checkpoints" and failed.name.startswith("step-"), line
        intact = Path(line.split("The last complete checkpoint, ")[1].split(",")[0])
        assert "is intact: a rerun resumes from it" in line
        load_checkpoint(intact)  # whole: every tensor file reads
        assert not list((root / "models/checkpoints").glob(".*")), "a half-written checkpoint was left behind"
        disk.free()
        code, err = finish(trainflow(root, "stage", "train"))
        assert code == 0, err[-3000:]
        assert f"train: resumed from {intact} at update {int(intact.name[5:])}" in err  # the follow-up resumed

        # 2. The disk is full when the model is exported (a rerun resumes the finished run and only exports).
        before = {p.name: p.read_bytes() for p in (root / "models/final").iterdir()}
        disk.fill()
        code, err = finish(trainflow(root, "stage", "train"))
        assert code == 1 and "Traceback" not in err, err[-3000:]
        assert f"error: {root / 'models/final'}: could not be written, the filesystem is full" in err
        assert "The previous final is intact." in err
        assert {p.name: p.read_bytes() for p in (root / "models/final").iterdir()} == before
        assert sorted(p.name for p in (root / "models").iterdir()) == [".filler", "checkpoints", "final"]
        disk.free()
        code, err = finish(trainflow(root, "stage", "train"))
        assert code == 0, err[-3000:]
        assert (root / "models/final/model.safetensors").is_file()


def test_a_full_dvc_remote_fails_the_push_clearly_keeps_what_it_held_and_the_next_run_pushes(tmp_path: Path) -> None:
    root = make_project(tmp_path / "proj", {**IRIS, "train.epochs": 2})
    with small_disk(tmp_path / "remote", "16m") as disk:
        subprocess.run([DVC, "remote", "add", "-d", "-f", "full", str(disk.path)], cwd=root, check=True)
        assert subprocess.run([DVC, "repro", "split"], cwd=root, capture_output=True).returncode == 0
        assert subprocess.run([DVC, "push"], cwd=root, capture_output=True).returncode == 0
        held = {p: p.read_bytes() for p in disk.path.rglob("*") if p.is_file()}
        assert held
        assert subprocess.run([DVC, "repro"], cwd=root, capture_output=True).returncode == 0  # new outputs to push
        disk.fill()
        code, err = finish(trainflow(root, "run"))  # nothing to run: it pushes (deploy.push) and fails there
        assert code == 1 and "Traceback" not in err, err[-3000:]
        assert f"error: {disk.path}: could not be written, the filesystem is full (No space left on device" in err
        assert "DVC remote 'full' keeps what it held" in err and "then `dvc push` (or rerun `trainflow run`)" in err
        assert {p: p.read_bytes() for p in held} == held  # every object it held, whole
        assert not [p for p in disk.path.rglob("*.tmp")], "partial uploads were left in the remote"
        disk.free()
        code, err = finish(trainflow(root, "run"))  # the advice, followed
        assert code == 0, err[-3000:]
        status = subprocess.run([DVC, "status", "--cloud"], cwd=root, capture_output=True, text=True)
        assert "in sync" in status.stdout, status.stdout + status.stderr
