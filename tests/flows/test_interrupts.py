"""flows/interrupts.py on its own, in a small process standing in for `trainflow run` (a second or two each): the one
line and exit code per signal, an echo within a second ignored, a second signal ending the process at once, and the
deadline ending a run that is stuck recording how it ended (as Prefect's clients were, retrying a gone server).

The end-to-end cases, a real `trainflow run` signalled from outside: tests/flows/test_interrupt_run.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The run: inside `handled()`, it says "ready" and waits for a signal. STUCK makes it catch the Interrupted and hang
# (what Prefect did, retrying a server that was gone), AFTER_STAGE has the stage note a signal and finish. IN_DEL says
# "ready" inside a `__del__`, where a raised exception is dropped; SET_NAME inside a descriptor's `__set_name__`, where
# Python wraps it; PREFECT under Prefect's own SIGTERM handler; SWALLOWED swallows it, then goes on to the next stage.
RUN = textwrap.dedent(
    """
    import contextlib, os, signal, sys, time
    from functools import partial
    from flows import interrupts
    from trainflow.engine.preempt import watching
    interrupts.DEADLINE_S = float(os.environ.get("DEADLINE_S", "20"))

    class Dropped:
        def __del__(self):
            print("ready", flush=True)
            time.sleep(2)

    class Slow:  # a descriptor: Python calls __set_name__ as the class that holds one is created
        def __set_name__(self, owner, name):
            print("ready", flush=True)
            time.sleep(2)

    if os.environ.get("PREFECT"):
        from prefect.utilities.engine import capture_sigterm as prefects
    else:
        prefects = contextlib.nullcontext
    try:  # as trainflow.cli._main around `handled()`
        with interrupts.handled():
            try:
                with prefects():
                    if os.environ.get("IN_DEL"):
                        Dropped()  # dropped at once: __del__ runs here, in the main thread
                    elif os.environ.get("SET_NAME"):  # as a module being imported defines a dataclass
                        class Holder:
                            field = Slow()
                    else:
                        print("ready", flush=True)
                if os.environ.get("AFTER_STAGE"):  # as tasks/train.py: the stage's Watch notes it after the last update
                    finished = partial(interrupts.stop_after_stage, stage="train")
                    with prefects(), watching(["SIGTERM"], finished=finished):
                        os.kill(os.getpid(), signal.SIGTERM)
                    interrupts.between_stages()
                if os.environ.get("SWALLOWED"):  # a stage's code swallows it; the flow records the stage
                    with contextlib.suppress(BaseException):
                        time.sleep(60)
                    interrupts.between_stages()
                time.sleep(60)
            except interrupts.Interrupted:
                if os.environ.get("STUCK"):
                    time.sleep(60)
                raise
    except interrupts.Interrupted as exc:
        print(exc.message, file=sys.stderr)
        sys.exit(exc.exit_code)
    """
)


# `trainflow run` itself, its stages replaced by a wait: the CLI's way out of a stopped run. Abandoned is what a stop
# leaves half-made (a progress callback of fsspec's, whose __del__ failed once the stop's traceback was freed).
# FINISHED: the run finishes at once and the interpreter's teardown takes its time (an atexit callback waits there).
CLI = textwrap.dedent(
    """
    import atexit, os, sys, time
    from trainflow import cli
    class Abandoned:
        def __del__(self):
            raise AttributeError("'function' object has no attribute 'close'")

    def stages(args):
        if os.environ.get("FINISHED"):
            atexit.register(lambda: (print("ready", flush=True), time.sleep(60)))
            return 0
        abandoned = Abandoned()  # freed with the traceback of the stop
        print("ready", flush=True)
        time.sleep(60)

    cli._dispatch = stages
    sys.argv = ["trainflow", "run"]
    sys.exit(cli.main())
    """
)


def start(**env: str) -> subprocess.Popen[str]:
    run = CLI if env.pop("CLI", None) else RUN
    proc = subprocess.Popen([sys.executable, "-c", run], cwd=REPO, env={**os.environ, **env}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def ended(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
    return proc.returncode, err


RERUN = "Finished stages are recorded; rerun `trainflow run` to continue\n"


@pytest.mark.parametrize(
    ("sig", "code", "line"),
    [
        (signal.SIGINT, 130, f"interrupted: {RERUN}"),
        (signal.SIGTERM, 75, f"preempted: SIGTERM received: the stage in progress is redone. {RERUN}"),
        (signal.SIGUSR1, 75, f"preempted: SIGUSR1 received: the stage in progress is redone. {RERUN}"),
    ],
)
def test_each_stop_signal_outside_training_has_its_line_and_exit_code(
    sig: signal.Signals, code: int, line: str
) -> None:
    proc = start()
    os.killpg(proc.pid, sig)
    assert ended(proc) == (code, line)


@pytest.mark.parametrize("prefects", [False, True], ids=["alone", "under-prefects-sigterm-handler"])
def test_a_signal_the_stage_finished_anyway_stops_the_run_at_the_next_stage_with_75(prefects: bool) -> None:
    """Not raised again where the train task's Watch ends (Prefect's handler would turn it into a traceback)."""
    said = f"preempted: SIGTERM received after train's last update: train finished and is recorded. {RERUN}"
    assert ended(start(AFTER_STAGE="1", **({"PREFECT": "1"} if prefects else {}))) == (75, said)


def test_the_same_signal_within_a_second_is_an_echo_and_a_later_one_ends_the_process_at_once() -> None:
    proc = start(STUCK="1")
    os.killpg(proc.pid, signal.SIGTERM)
    time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)  # an echo (a job script forwarding what the scheduler sent): ignored
    time.sleep(1.5)
    assert proc.poll() is None  # still recording how the run ended
    again = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # a second signal: at once
    code, err = ended(proc)
    assert time.monotonic() - again < 5
    assert (code, err) == (75, f"trainflow run: SIGINT again: stopped at once. {RERUN}")


def test_a_run_stuck_recording_its_end_is_ended_by_the_deadline_with_the_signal_s_code() -> None:
    proc = start(STUCK="1", DEADLINE_S="2")
    signalled = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    code, err = ended(proc)
    assert 2 <= time.monotonic() - signalled < 10
    said = "trainflow run: still recording how the run ended 2 s after SIGINT (is Prefect's server gone?): stopped "
    assert (code, err) == (130, f"{said}without it. {RERUN}")


@pytest.mark.parametrize("prefects", [False, True], ids=["ours", "prefect-s-sigterm-handler"])
def test_a_stop_raised_where_python_drops_exceptions_is_delivered_again(prefects: bool) -> None:
    """The signal comes while the main thread runs a `__del__` (the garbage collector runs weakref callbacks and
    `__del__`s wherever it is): the handler's exception there is dropped with an "Exception ignored" traceback, and a
    run once went on to its end after a SIGTERM. Also under Prefect's SIGTERM handler (TerminationSignal), as in a
    flow."""
    proc = start(IN_DEL="1", **({"PREFECT": "1"} if prefects else {}))
    os.killpg(proc.pid, signal.SIGTERM)
    assert ended(proc) == (75, f"preempted: SIGTERM received: the stage in progress is redone. {RERUN}")


def test_a_stop_raised_inside_a_descriptor_s_set_name_ends_the_run_by_the_signal_not_python_s_runtime_error() -> None:
    """SIGTERM while a module was importing (a dataclass field's `__set_name__` in OpenTelemetry, under Prefect): Python
    3.11 re-raises it as "RuntimeError: Error calling __set_name__", and the run ended with a traceback, exit 1."""
    proc = start(SET_NAME="1")
    os.kill(proc.pid, signal.SIGTERM)
    assert ended(proc) == (75, f"preempted: SIGTERM received: the stage in progress is redone. {RERUN}")


def test_a_stopped_run_ends_with_its_line_alone_not_with_what_freeing_the_abandoned_work_prints() -> None:
    proc = start(CLI="1")
    os.killpg(proc.pid, signal.SIGINT)
    assert ended(proc) == (130, f"interrupted: {RERUN}")


def test_a_stop_that_a_stage_swallowed_is_raised_again_where_the_flow_goes_on_to_the_next_stage() -> None:
    proc = start(SWALLOWED="1")
    os.killpg(proc.pid, signal.SIGINT)
    assert ended(proc) == (130, f"interrupted: {RERUN}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1], ids=lambda sig: sig.name)
def test_a_signal_after_the_run_finished_ends_the_process_at_once_with_0_not_by_the_signal_s_default(
    sig: signal.Signals,
) -> None:
    """A scheduler's SIGUSR1 while a finished run's interpreter tore down (seconds, with torch, MLflow and Prefect
    loaded) killed it by SIGUSR1's default action (exit -10) once its summary was printed."""
    proc = start(CLI="1", FINISHED="1")
    os.kill(proc.pid, sig)
    assert ended(proc) == (0, f"trainflow run: {sig.name} received after the run finished: exited at once\n")
