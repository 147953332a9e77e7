"""Preemption (issue 28): a signal stops training after the update it arrived in, with a checkpoint and exit code 75,
and the rerun ends with the weights of an uninterrupted run, bit for bit; train.max_time does the same on a clock;
a second signal ends the process at once. The Watch's own rules: the signals it gives back once params.yaml is read,
and a launcher's ranks that get a signal while they start. (A signal at any moment of the stage:
test_preempt_anywhere.py; two processes, and `trainflow run` on a Prefect flow: the slow tier,
tests/flows/test_preempt_flow.py.)"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support.projects import make_project
from support.signals import ON_LINUX, digest, signalled_at, snapshot, stage_train, stderr_of

from trainflow.core.errors import PREEMPTED
from trainflow.core.io import read_json
from trainflow.core.paths import Paths
from trainflow.params import load_params
from trainflow.stages import run_stage

BIN = Path(sys.executable).parent
UPDATES = 3 * 7  # 3 epochs of 7 updates: 105 train rows of iris in windows of 16


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A split project, and the weights an uninterrupted training of it ends with."""
    root = make_project(tmp_path_factory.mktemp("preempt") / "proj", {
        "data.source": "builtin:iris", "train.epochs": 3, "train.batch_size": 16, "train.progress": "false",
        "train.log_every": 2})  # fmt: skip
    paths = Paths(root)
    for stage in ("ingest", "split"):
        run_stage(stage, load_params(paths.params), paths)
    whole = root.parent / "whole"
    shutil.copytree(root, whole)
    # In this process: the stage `trainflow stage train` runs, without a process's start-up (seconds of imports); the
    # CLI's runs below end with its weights bit for bit, or those tests fail.
    run_stage("train", load_params(Paths(whole).params), Paths(whole))
    return root, digest(whole)


def copy(reference: tuple[Path, str], tmp_path: Path) -> Path:
    return Path(shutil.copytree(reference[0], tmp_path / "proj"))


def train(root: Path, env: dict[str, str] | None = None, expect: int = 0) -> str:
    proc = subprocess.run([str(BIN / "trainflow"), "stage", "train"], cwd=root, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)  # fmt: skip
    assert proc.returncode == expect, proc.stderr[-3000:]
    return proc.stderr


# The slow tier (README line 2 has the 2-rank case, tests/engine/test_preempt_ranks.py, and update:3 of
# test_preempt_anywhere.py's matrix is the same path at a fixed update). One project stopped three times, by each
# signal once: every rerun but the last is itself stopped, so each resume is checked by where the next stop lands, and
# the last ends the training (a rerun per signal, each training the whole way, checked nothing more).
@pytest.mark.slow
@pytest.mark.timeout(1200)  # four runs of the stage
def test_signals_at_random_updates_checkpoint_there_and_each_rerun_resumes_there_the_last_bitwise_equal(
    reference: tuple[Path, str], tmp_path: Path
) -> None:
    root = copy(reference, tmp_path)
    # Updates 6, 14, 19 (a draw that stops mid-epoch, at an epoch's end and in the last epoch)
    stops = sorted(random.Random(21).sample(range(1, UPDATES), 3))
    resumed = 0
    for name, at in zip(["SIGTERM", "SIGUSR1", "SIGINT"], stops):
        # The failpoint counts this run's updates: those after the one it resumed from.
        hold = {"TRAINFLOW_FAILPOINT": f"update:{at - resumed}", "TRAINFLOW_FAILPOINT_SIGNAL": name}
        err = train(root, hold, expect=PREEMPTED)
        assert f"preempted: train: {name} received: stopped after update {at} of {UPDATES}" in err, (stops, err[-2000:])
        assert (Paths(root).checkpoints / f"step-{at:09d}").is_dir()  # within the update the signal arrived in
        assert not (Paths(root).final / "model.safetensors").exists()
        resumed = at
    train(root)
    assert read_json(Paths(root).train_run)["resumed_from_update"] == stops[-1]
    assert digest(root) == reference[1], f"the reruns after stops at updates {stops} trained other weights"


def mlflow_statuses() -> list[str]:
    """The status of every MLflow run this test's store holds (MLFLOW_TRACKING_URI: the test's own)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    ids = [e.experiment_id for e in client.search_experiments()]
    return [r.info.status for r in client.search_runs(ids)] if ids else []


# The moments a signal reaches the stage from outside, in the default tier (one process; every signal at every moment,
# and two processes: test_preempt_anywhere.py, slow). Before training: exit 75, nothing written, so a rerun trains as
# if this run had never been (from scratch here); in training: test_signals_at_random_updates_... above.
@pytest.mark.skipif(not ON_LINUX, reason="finds the stopped process in /proc")
@pytest.mark.parametrize(
    ("point", "name", "to"),
    [
        # started, params read, no data read yet
        pytest.param("train-setup:1", "SIGTERM", "stage", marks=pytest.mark.slow),
        ("train-fit:1", "SIGINT", "group"),  # set up, MLflow's run started; a terminal's Ctrl-C (the process group)
    ],
)
def test_a_signal_before_training_ends_the_stage_with_75_and_nothing_written(
    reference: tuple[Path, str], tmp_path: Path, point: str, name: str, to: str
) -> None:
    root = copy(reference, tmp_path)
    before = snapshot(root, "data", "models", "reports")
    ended = signalled_at(root, point, name, to)
    assert ended.code == PREEMPTED, ended.stderr[-3000:]
    assert f"preempted: train: {name} received before " in ended.stderr, ended.stderr[-3000:]
    assert "Traceback" not in ended.stderr
    assert ended.after_s < 30, f"{ended.after_s:.1f} s from the signal to the end"
    assert snapshot(root, "data", "models", "reports") == before
    assert "RUNNING" not in mlflow_statuses()  # a run started is ended (KILLED), not left open


@pytest.mark.skipif(not ON_LINUX, reason="finds the stopped process in /proc")
@pytest.mark.slow  # and in test_preempt_anywhere.py's matrix (slow too): after the last update, 2 points x 3 signals
def test_a_signal_after_the_last_update_ends_the_stage_with_0_its_outputs_written(
    reference: tuple[Path, str], tmp_path: Path
) -> None:
    """Between the export and the MLflow logging of the model: the stage writes what is left of its outputs and leaves
    the model's MLflow logging to register (as when the tracking server is down), so it ends in seconds."""
    root = copy(reference, tmp_path)
    ended = signalled_at(root, "train-log:1", "SIGUSR1", "stage")
    assert ended.code == 0, ended.stderr[-3000:]
    assert "train: SIGUSR1 received after the last update: models/final and the reports are written" in ended.stderr
    assert "Traceback" not in ended.stderr
    assert ended.after_s < 30, f"{ended.after_s:.1f} s from the signal to the end"
    assert digest(root) == reference[1]
    assert read_json(Paths(root).train_run)["model_uri"] is None  # register logs it


def test_a_signal_while_waiting_for_the_workspace_ends_the_stage_at_once_with_nothing_written(
    reference: tuple[Path, str], tmp_path: Path
) -> None:
    """Before the stage holds the workspace nothing is written, and it may wait there for another run for hours: a
    signal ends it at once."""
    from filelock import FileLock

    from trainflow.core.workspace import lock_file

    root = copy(reference, tmp_path)
    before = snapshot(root, "data", "models", "reports")
    with FileLock(str(lock_file(root))):  # another run holds the workspace
        proc = stage_train(root)
        deadline = time.monotonic() + 300
        while "waiting for the workspace" not in stderr_of(root):
            assert proc.poll() is None and time.monotonic() < deadline, stderr_of(root)[-3000:]
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=30)
    err = stderr_of(root)
    assert code == PREEMPTED, err[-3000:]
    assert "preempted: SIGTERM received before train started: nothing written; rerun it" in err
    assert snapshot(root, "data", "models", "reports") == before


def test_max_time_stops_each_run_and_the_reruns_finish_the_training_bitwise_equal(
    reference: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clock that moves 1 s per reading (the Watch reads it at the start and after each update): train.max_time 4.5s
    stops a run after its 5th update, where the clock reads 5 s, every time, whatever this machine's speed."""
    from trainflow.core.errors import Preempted
    from trainflow.engine import preempt
    from trainflow.params import write_overrides

    root = copy(reference, tmp_path)
    paths = Paths(root)
    write_overrides(paths.params, ["train.max_time=4.5s"])
    ticks = iter(range(10**6))
    monkeypatch.setattr(preempt.time, "monotonic", lambda: float(next(ticks)))
    stops = []
    for _ in range(UPDATES):
        try:
            run_stage("train", load_params(paths.params), paths)
            break
        except Preempted as exc:
            assert "train.max_time (4.5 s) reached after 5.0 s: stopped after update" in str(exc)
            stops.append(int(str(exc).split("stopped after update ")[1].split()[0]))
    assert stops == list(range(5, UPDATES, 5)), stops  # 5 updates per run, resumed where the last one stopped
    assert digest(root) == reference[1]


def test_a_second_signal_ends_the_process_at_once(tmp_path: Path) -> None:
    """The first signal is noted (the checkpoint waits for the update's end), and so is the same signal again within a
    second (a launcher forwarding it); a second signal after that is the signal's own effect."""
    script = textwrap.dedent("""
        import os, signal, sys, time
        from trainflow.engine.distributed import Group
        from trainflow.engine.preempt import Watch
        with Watch(["SIGTERM"], Group()) as watch:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # the same preemption twice (forwarded): still noted only
            time.sleep(1.2)
            print("noted:", watch.due(), flush=True)
            os.kill(os.getpid(), signal.SIGTERM)  # a second one, later: at once
            time.sleep(5)
            print("still running", flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.stdout == "noted: SIGTERM received\n", proc.stdout + proc.stderr
    assert proc.returncode == -signal.SIGTERM


def test_handlers_are_put_back_after_training_and_empty_signals_leave_them_alone() -> None:
    from trainflow.engine.distributed import Group
    from trainflow.engine.preempt import Watch

    before = signal.getsignal(signal.SIGUSR1)
    with Watch(["SIGUSR1"], Group()):
        assert signal.getsignal(signal.SIGUSR1) is not before
    assert signal.getsignal(signal.SIGUSR1) is before
    with Watch([], Group()) as watch:
        assert signal.getsignal(signal.SIGUSR1) is before and watch.due() is None


def test_a_signal_noted_before_params_yaml_was_read_takes_its_own_effect_if_it_is_not_one_to_catch() -> None:
    """The CLI catches train.preempt_signals' default before it reads params.yaml; a signal the params leave out was
    never the stage's to catch: once they are read it does what it would have done (SIGUSR1: end the process)."""
    script = textwrap.dedent("""
        import os, signal, time
        from trainflow.engine.preempt import Watch
        with Watch(["SIGTERM", "SIGUSR1"]) as watch:
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.2)
            print("noted:", watch.caught.name, flush=True)
            watch.catch(["SIGTERM"])  # train.preempt_signals: [SIGTERM]
            time.sleep(5)
            print("still running", flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.stdout == "noted: SIGUSR1\n", proc.stdout + proc.stderr
    assert proc.returncode == -signal.SIGUSR1


LAUNCHER = """
import multiprocessing, os, signal, sys, time
from trainflow.engine.preempt import Watch

def rank(started):
    time.sleep(1.0)  # importing: the signal comes meanwhile, before this rank's Watch is entered
    with Watch(["SIGTERM"]) as watch:
        time.sleep(0.3)
        print(f"rank: {watch.caught.name if watch.caught else 'nothing'} noted", flush=True)

if __name__ == "__main__":
    with Watch(["SIGTERM"]) as watch, watch.passing_on():
        p = multiprocessing.get_context("spawn").Process(target=rank, args=(None,))
        p.start()
        os.kill(os.getpid(), signal.SIGTERM)  # to the launcher, while its rank starts
        while p.is_alive():  # as torch's launcher waits: a poll every so often (the handler runs in between)
            time.sleep(0.05)
    print(f"launcher: {watch.caught.name} noted; rank exit code {p.exitcode}", flush=True)
"""


def test_a_launcher_passes_a_signal_on_to_a_rank_that_is_still_starting(tmp_path: Path) -> None:
    """The rank starts with the signals blocked: the one passed on while it imports waits for its Watch (not the
    default action, which would kill it before its checkpoint)."""
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.stdout == "rank: SIGTERM noted\nlauncher: SIGTERM noted; rank exit code 0\n", proc.stdout + proc.stderr
    assert proc.returncode == 0


def test_max_time_takes_durations_and_refuses_what_is_not_one(tmp_path: Path) -> None:
    from trainflow.core.errors import ParamsError
    from trainflow.params import TrainParams

    assert [TrainParams(max_time=v).max_time for v in ("20s", "45m", "1h30m", "1d", 90)] == [20, 2700, 5400, 86400, 90]
    params = tmp_path / "params.yaml"
    shutil.copy(Path(__file__).resolve().parents[2] / "params.yaml", params)
    with pytest.raises(ParamsError) as err:
        load_params(params, ["train.max_time=soon", "train.preempt_signals=[SIGTERM, SIGKILL]"])
    assert sorted(p for p, _ in err.value.problems) == ["train.max_time", "train.preempt_signals"]
    assert "cannot be caught" in str(err.value)
