"""Signals to `trainflow run`: SIGINT (a terminal's Ctrl-C), SIGTERM and SIGUSR1 (a scheduler's preemption) end the
run at any moment within seconds, with one line on stderr and a documented exit code, and a rerun continues.

- During training the train stage catches them itself (train.preempt_signals): a checkpoint after the current
  update, then Preempted, exit code 75 (trainflow.engine.preempt); the rerun resumes from that checkpoint.
- Anywhere else (Prefect starting, ingest, split, evaluate, register, DVC's bookkeeping) the handler here raises
  Interrupted, a KeyboardInterrupt: the stage in progress is abandoned (stages write to temp files and rename them, so
  nothing is half-written), Prefect records the task and flow run as Crashed, and the rerun runs that stage again.
  Exit code 130 for SIGINT (nothing was running that could checkpoint; the shell's code for Ctrl-C), 75 for SIGTERM
  and SIGUSR1 (a preemption: a job script requeues on 75, as after a preempted training).
- Once the run is stopping, what is left (Prefect recording how the run ended, its services flushing their queues)
  has a deadline. Prefect's clients retry a server that does not answer, with exponential backoff, per call: a server
  killed with the run's whole cgroup (systemd, `scancel`) would hold the exit far longer than anyone waits after
  Ctrl-C, and end it with a traceback. Past DEADLINE_S the process ends without it, with the same code (the next
  run of the workspace sets a flow run left Running to Crashed: flows/orphans.py).
- The same signal again within ECHO_S is the same interruption reaching the process twice (a job script forwarding
  what the scheduler also sent): ignored. Later, a second signal ends the process at once.
- A signal's exception can be lost: Python runs a handler wherever the main thread is, also inside a weakref callback
  or a `__del__` that the garbage collector runs, where an exception is "ignored" (printed as a traceback and
  dropped). A run then went on to its end as if never signalled. Such an exception (Interrupted, or Prefect's
  TerminationSignal) is caught by the unraisable hook here and delivered again at the main thread's next step, and
  every stage boundary raises it again (`between_stages`) should code swallow it.

During a flow, Prefect swaps its own SIGTERM handler in (TerminationSignal); once it has recorded the crash it puts
the handler here back and sends SIGTERM again, which then raises Interrupted.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from trainflow.core.errors import PREEMPTED

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
INTERRUPTED = 130  # 128 + SIGINT: what a shell shows for a program stopped by Ctrl-C
ECHO_S = 1.0
DEADLINE_S = 20.0  # from the first signal (or the checkpoint of a preempted training) to the end of the process
RERUN = "Finished stages are recorded; rerun `trainflow run` to continue"
AGAIN_S = 0.05  # a dropped stop is delivered again this much later (`_swallowed`)


class Interrupted(KeyboardInterrupt):
    """A stop signal ended the run outside training: `message` is the CLI's one line, `exit_code` its exit code."""

    def __init__(self, sig: signal.Signals, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.signal = sig
        self.exit_code = exit_code
        self.message = message


class _Stopping:
    """One run's stop: the exit code once it is stopping, since when, and the deadline's timer; a signal a stage noted
    and finished anyway (`stop_after_stage`)."""

    def __init__(self) -> None:
        self.exit_code: int | None = None
        self.since = 0.0
        self.timer: threading.Timer | None = None
        self.after_stage: tuple[signal.Signals, str] | None = None
        self.owed: Interrupted | None = None  # the stop raised, until the run has ended by it
        self.again = False  # the next call of the handler delivers `owed` again (`_swallowed`)

    def begin(self, exit_code: int, why: str) -> None:
        self.exit_code, self.since = exit_code, time.monotonic()
        message = (
            f"trainflow run: still recording how the run ended {DEADLINE_S:g} s after {why} (is Prefect's server "
            f"gone?): stopped without it. {RERUN}"
        )
        self.timer = threading.Timer(DEADLINE_S, end_now, (exit_code, message))
        self.timer.daemon = True  # a run that ends in time is not held by it
        self.timer.start()

    def left_s(self) -> float:
        return max(0.0, DEADLINE_S - (time.monotonic() - self.since))


_run: _Stopping | None = None  # the run this process is (inside `handled`)


@contextlib.contextmanager
def handled(held: bool = False) -> Iterator[None]:
    """Around `trainflow run`: the stop signals raise Interrupted (see the module's docstring). When the block ends
    stopping, Prefect's services get what is left of the deadline to flush, or the process ends at once.

    `held`: this process is the command (not a caller, such as a test). When its run has finished, the stop signals
    do not go back to their defaults: the interpreter's teardown with torch, MLflow and Prefect loaded takes seconds,
    and SIGUSR1's default action in them killed a finished run (exit -10, after its summary). A signal then ends the
    process at once, exit 0, one line: the work is done and recorded."""
    global _run
    if threading.current_thread() is not threading.main_thread() or _run is not None:
        yield
        return
    run = _run = _Stopping()
    previous = {sig: signal.signal(sig, _on_signal) for sig in SIGNALS}
    unraisable, sys.unraisablehook = sys.unraisablehook, functools.partial(_swallowed, sys.unraisablehook)
    finished = False
    try:
        yield
        finished = True
    except Exception as exc:
        stop = _stop_in(exc)
        if stop is None:
            raise
        raise _copy(stop) from exc
    finally:
        if run.exit_code is not None:
            # The process is ending: the handlers stay, so that an echo is still ignored and a second signal still
            # ends it at once, with one line, while the CLI says why and the interpreter tears down.
            _finish(run)
        else:
            for sig, handler in previous.items():
                signal.signal(sig, _after_the_run if finished and held else handler)
            sys.unraisablehook = unraisable
            _run = None


def stopping(exit_code: int, why: str) -> None:
    """The run is ending early (a training preempted and checkpointed): from here on, the deadline applies. Outside
    `handled` (a deployment's flow run, a test) nothing happens."""
    if _run is not None and _run.exit_code is None:
        _run.begin(exit_code, why)


def stop_after_stage(sig: signal.Signals, stage: str) -> None:
    """`stage` noted `sig` and finished anyway (the train stage, signalled after its last update, exports instead of
    leaving nothing to resume): in `trainflow run` (`handled`), the run stops once the stage is recorded
    (`between_stages`); in any other flow run (a deployment's) the signal takes its own effect now (Prefect's
    handler: the flow run crashes after the stage, as it would have before it)."""
    if _run is None:
        signal.raise_signal(sig)
    elif _run.exit_code is None:
        _run.after_stage = (sig, stage)


def between_stages() -> None:
    """Where the flow has recorded a stage: stop here if the run is stopping. A signal came while the stage finished
    anyway (`stop_after_stage`): exit 75. A stop already raised is raised again: code in the stage swallowed it."""
    run = _run
    if run is None:
        return
    if run.exit_code is None and run.after_stage is not None:
        sig, stage = run.after_stage
        run.begin(PREEMPTED, sig.name)
        said = f"{sig.name} received after {stage}'s last update: {stage} finished and is recorded"
        run.owed = Interrupted(sig, PREEMPTED, f"preempted: {said}. {RERUN}")
    if run.owed is not None:
        raise _copy(run.owed)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    run = _run
    if run is None:  # only installed while there is a run
        return
    sig = signal.Signals(signum)
    if run.again and run.owed is not None:  # the stop raised before was lost: this delivers it
        run.again = False
        raise _copy(run.owed)
    if run.exit_code is None:
        if sig == signal.SIGINT:  # a user's Ctrl-C: the shell's code, what was in progress is redone
            exit_code, message = INTERRUPTED, f"interrupted: {RERUN}"
        else:  # a preemption: exit 75 whatever was running, as after a preempted training
            exit_code, message = PREEMPTED, f"preempted: {sig.name} received: the stage in progress is redone. {RERUN}"
        run.begin(exit_code, sig.name)
        run.owed = Interrupted(sig, exit_code, message)
        raise _copy(run.owed)
    if time.monotonic() - run.since > ECHO_S:
        end_now(run.exit_code, f"trainflow run: {sig.name} again: stopped at once. {RERUN}")


def _after_the_run(signum: int, frame: FrameType | None) -> None:
    """A stop signal after the run finished (`handled(held=True)`): nothing is left to stop or redo."""
    end_now(0, f"trainflow run: {signal.Signals(signum).name} received after the run finished: exited at once")


def _stop_in(exc: BaseException) -> Interrupted | None:
    """The stop that `exc` was raised in the wake of, if any: Python wraps an exception raised inside a descriptor's
    `__set_name__` (a class being created while a module imports) in a RuntimeError, and libraries re-raise what they
    catch as their own errors; the run still ends by the signal, with its line and code, not a traceback."""
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        if isinstance(at, Interrupted):
            return at
        seen.add(id(at))
        at = at.__cause__ or at.__context__
    return None


def _copy(owed: Interrupted) -> Interrupted:
    """A new exception for each raise: one that was swallowed carries that place's traceback."""
    return Interrupted(owed.signal, owed.exit_code, owed.message)


def _swallowed(default: Callable[[Any], None], unraisable: Any) -> None:
    """sys.unraisablehook during a run: the exception of a stop signal that Python could only drop (raised inside a
    weakref callback or a `__del__`) is delivered again instead of being printed. Ours is raised again by
    `_on_signal`; Prefect's TerminationSignal (its SIGTERM handler during a flow) by Prefect's handler, which that
    signal reaches again. Anything else goes to the hook as before.

    Sent again to the main thread from another, a moment later: the main thread acts on a pending signal at its next
    step, which would be here, in the hook, where an exception is dropped again; and a real signal (not
    `_thread.interrupt_main`) also ends a wait the main thread may be in by then."""
    exc, run = unraisable.exc_value, _run
    prefects = type(exc).__name__ == "TerminationSignal" and isinstance(getattr(exc, "signal", None), int)
    if run is None or not (isinstance(exc, Interrupted) or prefects):
        default(unraisable)
        return
    run.again = isinstance(exc, Interrupted)
    later = threading.Timer(AGAIN_S, signal.pthread_kill, (threading.main_thread().ident, int(exc.signal)))
    later.daemon = True
    later.start()


def _finish(run: _Stopping) -> None:
    """Flush Prefect's services (events, logs) and stop its temporary server within what is left of the deadline:
    what would otherwise hold the interpreter's exit is done here, where it can be bounded."""
    assert run.exit_code is not None
    try:
        # Looked up, not imported: a signal can come before Prefect is imported (or while it is).
        worker = getattr(sys.modules.get("prefect.events.worker"), "EventsWorker", None)
        if worker is not None:  # Prefect's queue services share one registry of instances: the log worker's too
            drained = worker.drain_all(timeout=run.left_s(), at_exit=False)
            if isinstance(drained, tuple) and drained[1]:  # (done, not done)
                end_now(run.exit_code, f"trainflow run: Prefect could not flush its events (is its server gone?): "
                                       f"stopped without them. {RERUN}")  # fmt: skip
        server = getattr(sys.modules.get("prefect.server.api.server"), "SubprocessASGIServer", None)
        for instance in list(server._instances.values()) if server is not None else []:  # local mode
            instance.stop()  # SIGTERM, then SIGKILL after 5 s
    except Exception as exc:  # noqa: BLE001 - a traceback now would bury the one line: end as the deadline would
        end_now(run.exit_code, f"trainflow run: could not stop Prefect's services ({exc!r}). {RERUN}")
    if run.timer is not None:
        run.timer.cancel()
    # The interpreter's teardown then runs full collections over everything imported (torch, MLflow, Prefect, DVC):
    # seconds of CPU, many more on a busy machine. Frozen, that heap is freed by reference counts alone; the cycles
    # left are the process's last garbage, and its files are closed by now (outputs are written and renamed).
    gc.freeze()


def end_now(exit_code: int, message: str) -> None:
    """End the process at once with `exit_code`, after one line on stderr; no interpreter teardown, nothing left to do
    is worth waiting for (the temporary server goes with this process: flows/local_server.py). Called from the
    deadline's thread too, so the line is written to the descriptor, past Python's buffers and their locks."""
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
    with contextlib.suppress(OSError):
        os.write(2, f"{message}\n".encode())
    os._exit(exit_code)
