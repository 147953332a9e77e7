"""Signals to `trainflow run` at any moment: a terminal's Ctrl-C (SIGINT to the foreground process group), SIGTERM and
SIGUSR1 end it within 30 s with one line, no traceback, exit code 75 (checkpointed or preempted) or 130 (Ctrl-C
outside training), and the reruns end with an uninterrupted run's weights, bit for bit (flows/interrupts.py).

Prefect's local mode, with both kinds of PREFECT_HOME a user has: a fresh one (a new project's) and one holding earlier
runs (Prefect's default ~/.prefect; here the test's own, never the real one). The Ctrl-C used to reach Prefect's
temporary server too, which stopped while the run still had to record how it ended; its clients then retried it with
backoff, and the run ended long after with an httpx traceback and exit code 1.

Each run is a real process in a session of its own, signalled from outside (`os.killpg` for the process group, as a
terminal does). Random moments come from a seeded generator: the seed is in every assertion's message, and
TRAINFLOW_CHAOS_SEED replays it.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from support.projects import make_project
from support.servers import BIN
from support.servers import kill as kill_session
from support.signals import digest as weights

PARAMS = {"data.source": "builtin:iris", "register.model_name": "iris", "train.epochs": 3, "train.batch_size": 16,
          "train.progress": "false"}  # fmt: skip
WITHIN_S = 30  # the bound, from the signal to the end of the process (a loaded machine included)
ONE_LINE = re.compile(r"^(interrupted|preempted): .*$", re.MULTILINE)


@dataclass
class Ended:
    """How one `trainflow run` ended: its exit code, its output, and how long after the signal (None: none sent)."""

    returncode: int
    output: str
    after_signal_s: float | None
    what: str  # which signal when, for the assertions' messages


def trainflow_run(root: Path, home: Path, log: Path, extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`trainflow run` in local mode (its own temporary Prefect server) with PREFECT_HOME `home`, in a session of its
    own: its process group is the one a terminal would send Ctrl-C to."""
    env = {**os.environ, "PREFECT_HOME": str(home), "MLFLOW_TRACKING_URI": f"sqlite:///{root.parent / 'mlflow.db'}",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "600",  # a fresh home's first start, on a busy machine
           **(extra or {})}  # fmt: skip
    env.pop("PREFECT_API_URL", None)
    with open(log, "wb") as out:  # a file, not a pipe: nothing the test forgets to read can block the run
        return subprocess.Popen([str(BIN / "trainflow"), "run"], cwd=root, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def send(proc: subprocess.Popen[bytes], sig: signal.Signals, group: bool) -> None:
    """`sig` to the run's process group (as a terminal's Ctrl-C) or to its process alone (as a scheduler's)."""
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)


def finish(proc: subprocess.Popen[bytes], log: Path, signalled_at: float | None, what: str) -> Ended:
    """Wait for the run (900 s at most, a loaded machine's whole run; then it is killed and the test fails)."""
    try:
        proc.wait(timeout=900 if signalled_at is None else 120)
    except subprocess.TimeoutExpired:
        kill_session(proc)
    ended = time.monotonic()
    after = None if signalled_at is None else ended - signalled_at
    return Ended(proc.returncode, log.read_text(errors="replace"), after, what)


def servers_of(home: Path) -> list[psutil.Process]:
    """Prefect servers started with this PREFECT_HOME (a run's temporary server lives in a session of its own)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if "prefect.server.api.server" in " ".join(p.info["cmdline"] or ()) and (
                p.environ().get("PREFECT_HOME") == str(home)
            ):
                found.append(p)
    return found


def check_ended_as_documented(ended: Ended, sig: signal.Signals, home: Path) -> None:
    """Exit code 75 or 130 as documented, one line saying so, no traceback or Prefect error dump, within WITHIN_S of
    the signal, and no temporary server left behind."""
    said = f"{ended.what}; output:\n{ended.output[-3000:]}"
    [line] = [m.group(0) for m in ONE_LINE.finditer(ended.output)] or [None]  # exactly one, or this fails
    assert line is not None and len(ONE_LINE.findall(ended.output)) == 1, said
    if ended.returncode == 130:  # Ctrl-C outside training: nothing could checkpoint
        assert sig == signal.SIGINT and line.startswith("interrupted: Finished stages are recorded"), said
    else:
        assert ended.returncode == 75 and line.startswith("preempted: ") and f"{sig.name} received" in line, said
    for dump in ("Traceback", "httpx", "Crash detected", "Service 'EventsWorker' failed", "ERROR", "Exception"):
        assert dump not in ended.output, said
    assert ended.after_signal_s is not None and ended.after_signal_s < WITHIN_S, said
    gone, alive = psutil.wait_procs(servers_of(home), timeout=15)
    assert not alive, f"the run's temporary Prefect server outlived it: {alive}; {said}"


def flow_runs(home: Path) -> dict[str, str]:
    """Each flow run's state type in the PREFECT_HOME's database, read with sqlite3, not through Prefect."""
    if not (home / "prefect.db").exists():
        return {}
    with contextlib.closing(sqlite3.connect(home / "prefect.db")) as db:
        return dict(db.execute("SELECT id, state_type FROM flow_run"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A project before any run, and a copy of it after one uninterrupted run (its PREFECT_HOME, beside it, then
    holds an earlier run)."""
    where = tmp_path_factory.mktemp("uninterrupted")
    fresh = make_project(where / "fresh", PARAMS)
    whole = Path(shutil.copytree(fresh, where / "whole", symlinks=True))
    home = where / "prefect-home"
    home.mkdir()
    ended = finish(trainflow_run(whole, home, where / "whole.log"), where / "whole.log", None, "uninterrupted")
    assert ended.returncode == 0, ended.output[-3000:]
    yield fresh, whole


@dataclass
class Moment:
    """When to send the signal: `delay_s` after the run starts (`after` None) or after a line of its output, or, with
    `hold`, at update 9 of 21: the run holds still there (SIGSTOP at a failpoint), the signal is sent, and it goes on
    with the signal pending, so that it lands in training."""

    after: str | None = None
    delay_s: float = 0.0
    hold: bool = False

    def __str__(self) -> str:
        if self.hold:
            return "at update 9"
        return f"{self.delay_s:.1f} s after {self.after or 'the start'}"


INGEST = Moment("[trainflow] ingest: running")
UPDATE_9 = Moment(hold=True)


def anywhere(rng: random.Random, root: Path) -> Moment:
    """A random moment of the next run: in its start (imports, Prefect's server, the flow run's creation) or in one
    of the stages it will run (those DVC sees changed), up to 2 s after the stage began."""
    from tasks import dvc

    stages = dvc.changed_stages(root)
    after = rng.choice([None, *stages])
    if after is None:
        return Moment(None, rng.uniform(0, 8))
    return Moment(f"[trainflow] {after}: running", rng.uniform(0, 2))


@pytest.mark.slow
def test_signals_at_any_moment_of_trainflow_run_end_it_as_documented_and_the_reruns_end_bitwise_equal(
    tmp_path: Path, uninterrupted: tuple[Path, Path]
) -> None:
    """One project, stopped again and again, each rerun going on from what the last left: Ctrl-C as ingest starts
    (130) and at update 9 (75), then SIGTERM, SIGUSR1 and Ctrl-C at random moments; the last rerun finishes with the
    uninterrupted run's weights. The runs take turns between the two kinds of PREFECT_HOME: a fresh one (a new
    project's, its database made as the run starts) and the one the uninterrupted run was recorded in. Every flow run
    a stopped run started is recorded as ended, none left Running. A signal that comes once the run has finished (its
    summary printed, the interpreter tearing down) ends it at once with 0."""
    fresh, whole = uninterrupted
    root = Path(shutil.copytree(fresh, tmp_path / "proj", symlinks=True))
    # Not the global generator: the fixture's in-process training seeded it (train.seed), so every run drew the same
    # moments. TRAINFLOW_CHAOS_SEED replays a run's (as in tests/reliability/test_kill_anywhere.py).
    seed = int(os.environ.get("TRAINFLOW_CHAOS_SEED", random.SystemRandom().randrange(2**32)))
    rng = random.Random(seed)
    # (signal, to the process group or the process alone, when: None for a random moment of that run)
    plan = [(signal.SIGINT, True, INGEST), (signal.SIGINT, True, UPDATE_9), (signal.SIGTERM, False, None),
            (signal.SIGUSR1, False, None), (signal.SIGINT, True, None)]  # fmt: skip
    for n, (sig, group, planned) in enumerate(plan):
        home = whole.parent / "prefect-home" if n % 2 else tmp_path / f"prefect-home-{n}"
        home.mkdir(exist_ok=True)
        log, before = tmp_path / f"run-{n}.log", flow_runs(home)
        when = planned or anywhere(rng, root)
        what = f"run {n}: {sig.name} to the {'process group' if group else 'process'} {when} (seed {seed})"
        hold = {"TRAINFLOW_FAILPOINT": "update:9", "TRAINFLOW_FAILPOINT_SIGNAL": "SIGSTOP"} if when.hold else {}
        proc = trainflow_run(root, home, log, hold)
        try:
            signalled_at = signal_at(proc, log, sig, group, when)
            ended = finish(proc, log, signalled_at, what)
        finally:
            kill_session(proc)
        if signalled_at is None:  # it ended before the moment came: a finished run, nothing to check here
            assert ended.returncode == 0 and planned is None, f"{what}; output:\n{ended.output[-3000:]}"
            continue
        if ended.returncode == 0:  # it came once the run had finished (its teardown): at once, one line, nothing redone
            assert planned is None and f"{sig.name} received after the run finished" in ended.output, (
                f"{what}; output:\n{ended.output[-3000:]}"
            )
            continue
        check_ended_as_documented(ended, sig, home)
        if when is INGEST:
            assert ended.returncode == 130, ended.output[-3000:]
        if when is UPDATE_9:
            assert ended.returncode == 75, ended.output[-3000:]
            assert "preempted: train: SIGINT received: stopped after update" in ended.output, ended.output[-3000:]
        runs = flow_runs(home)
        left = {i: state for i, state in runs.items() if i not in before and state in ("RUNNING", "PENDING")}
        assert not left, f"{what}: flow runs left {left}; output:\n{ended.output[-3000:]}"
    last = finish(trainflow_run(root, home, tmp_path / "last.log"), tmp_path / "last.log", None, "the last rerun")
    assert last.returncode == 0, last.output[-3000:]
    assert weights(root) == weights(whole), f"seed {seed}"


def signal_at(proc: subprocess.Popen[bytes], log: Path, sig: signal.Signals, group: bool, when: Moment) -> float | None:
    """Send `sig` at `when`; returns when it was sent, None if the run ended first."""
    since = None if when.after else time.monotonic()
    while proc.poll() is None:
        if when.hold:
            if stopped(proc.pid):
                send(proc, sig, group)
                sent = time.monotonic()
                os.killpg(proc.pid, signal.SIGCONT)
                return sent
        elif since is None:
            assert when.after is not None
            if when.after in log.read_text(errors="replace"):
                since = time.monotonic()
        elif time.monotonic() - since >= when.delay_s:
            send(proc, sig, group)
            return time.monotonic()
        time.sleep(0.02)
    return None


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP): state T in /proc/PID/stat."""
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] == "T"
    return False
