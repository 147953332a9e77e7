"""A signal from outside at a chosen moment of `trainflow stage train`, for the preemption tests.

The moment is a failpoint (trainflow.core.io.failpoint) whose signal is SIGSTOP: the process that reaches it (the
stage's process, or rank N of a distributed run) stops itself there. The test then sends the signal as a scheduler or a
terminal would (to the stage's process, or to its process group, as Ctrl-C does) and lets the stopped process go on:
the signal is handled as if it had arrived at that very point. Linux only (it reads /proc)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trainflow.core.paths import Paths

BIN = Path(sys.executable).parent
ON_LINUX = sys.platform.startswith("linux")


@dataclass
class Ended:
    code: int
    stderr: str
    after_s: float  # from the signal to the end of the stage's process


def stopped_in(session: int) -> int | None:
    """A process of this session that is stopped (state T), if any."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if fields[0] == "T" and int(fields[3]) == session:
            return int(entry.name)
    return None


def stage_train(root: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`trainflow stage train` in root, in a session of its own (its process group is the stage's processes alone),
    stderr into root's sibling file <root>.stderr."""
    err = (root.parent / f"{root.name}.stderr").open("wb")
    return subprocess.Popen([str(BIN / "trainflow"), "stage", "train"], cwd=root, stdout=subprocess.DEVNULL,
                            stderr=err, env={**os.environ, **(env or {})}, start_new_session=True)  # fmt: skip


def signalled_at(root: Path, point: str, name: str, to: str, rank: str = "0", limit_s: float = 900) -> Ended:
    """Run the stage; when it reaches `point` ("<failpoint>:<n>"; in a distributed run, on rank `rank`, or in the
    launcher for points only it reaches), send signal `name` to `to`: "stage" (the process started, the launcher of a
    distributed run) or "group" (every process of the stage); then wait for the end."""
    proc = stage_train(root, {"TRAINFLOW_FAILPOINT": point, "TRAINFLOW_FAILPOINT_SIGNAL": "SIGSTOP",
                              "TRAINFLOW_FAILPOINT_RANK": rank})  # fmt: skip
    deadline = time.monotonic() + limit_s
    try:
        while (stopped := stopped_in(proc.pid)) is None:
            code = proc.poll()
            assert code is None, f"the stage ended ({code}) before {point}: {stderr_of(root)[-3000:]}"
            assert time.monotonic() < deadline, f"no stop at {point} in {limit_s:.0f} s"
            time.sleep(0.05)
        sent = time.monotonic()
        sig = signal.Signals[name]
        if to == "group":
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        os.kill(stopped, signal.SIGCONT)
        code = proc.wait(timeout=max(deadline - time.monotonic(), 60))
        return Ended(code, stderr_of(root), time.monotonic() - sent)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def stderr_of(root: Path) -> str:
    return (root.parent / f"{root.name}.stderr").read_text(errors="replace")


def snapshot(root: Path, *folders: str) -> dict[str, bytes]:
    """Every file under these folders of root, by relative path: what a stage may not have changed."""
    return {str(p.relative_to(root)): p.read_bytes() for f in folders for p in sorted((root / f).rglob("*"))
            if p.is_file()}  # fmt: skip


def digest(root: Path) -> str:
    return hashlib.sha256((Paths(root).final / "model.safetensors").read_bytes()).hexdigest()
