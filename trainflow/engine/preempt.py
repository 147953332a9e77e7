"""Preemption: a signal (train.preempt_signals) or the time budget (train.max_time) stops the train stage with exit
code PREEMPTED, so the next run (a retry, the next schedule, a requeue) resumes from its checkpoint bit for bit.

One Watch catches the signals for the whole stage: `trainflow stage train` enters it before it imports or reads
anything (with train.preempt_signals' default until params.yaml is read, then `catch` narrows it), a rank as it
starts, and the stage itself where nothing entered one (`watching`: the Prefect task, a test). Its handler only notes
the signal, never raises into whatever code it interrupts (an MLflow call, a file write); what the stage does with it
depends on where it is:
- before the CLI holds the workspace (nothing written yet; it may be waiting for another run): the process ends at
  once, exit PREEMPTED (`nothing_written`);
- before training: the stage stops at its next check (`stop_before`, between its steps), with nothing written;
- in training: the trainer asks `due_after_update()` after each update, where the weights, optimizer and data
  position are whole, checkpoints there and stops;
- after the last update: the stage finishes its export and MLflow logging and exits 0: its outputs are whole, there
  is nothing to resume.
A second signal, more than ECHO_S after the first, ends the process at once (the signal's default action), for a user
who does not want to wait for the checkpoint.

Several ranks stop after the same update: they take the maximum of their flags over a CPU (gloo) group, a
host-to-host exchange of two integers that never waits for the device. In training they do so every N updates, N
chosen at each exchange for about CHECK_S seconds between exchanges (`due_after_update`), so a signal any rank
received is acted on by all within about CHECK_S, or one update where updates take longer. The launcher of
train.world_size > 1 (`distributed.launch`) passes a signal on to its ranks (`passing_on`) and exits with their code;
the ranks start with the signals blocked, so one that comes while they are still importing waits for their handler
instead of killing them.

Signals are caught in the main thread only (Python's rule); elsewhere the budget still applies, and a note says so.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from trainflow.core.errors import PREEMPTED, Preempted

if TYPE_CHECKING:  # torch loads lazily: the CLI enters a Watch before anything heavy is imported
    from trainflow.engine.distributed import Group

__all__ = ["DEFAULT_SIGNALS", "PREEMPTED", "PREEMPTED_MARK", "Preempted", "Watch", "current", "watching"]

# Written beside the checkpoints by a preempted run (removed by the next): {"update", "why", "at"}. A job script
# reads it where a launcher between it and trainflow turns exit code 75 into its own (torchrun exits 1).
PREEMPTED_MARK = "preempted.json"

# A signal this soon after the first is the same preemption reaching the process twice (a launcher such as torchrun
# or a job script forwards what the scheduler also sent it): noted, not "a second signal".
ECHO_S = 1.0

# How often several ranks exchange their stop flags in training, in seconds of training (due_after_update): a round
# trip between the ranks per update costs a small model a large share of its update, and a preemption's grace period
# is seconds. TRAINFLOW_PREEMPT_CHECK_S=0 exchanges after every update (the tests that stop at a given update).
CHECK_S = float(os.environ.get("TRAINFLOW_PREEMPT_CHECK_S", "0.25"))
MAX_EVERY = 1000  # updates between exchanges at most, however fast they are

# train.preempt_signals' default: what the CLI catches before it has read params.yaml.
DEFAULT_SIGNALS = ["SIGTERM", "SIGINT", "SIGUSR1"]

# Set by a launcher that noted a signal, for the ranks it starts after that: they start with it noted.
PASSED_ON = "TRAINFLOW_PREEMPTED"

_entered: list[Watch] = []  # the Watches entered in this process, innermost last


def current() -> Watch | None:
    """The Watch this process entered last, if any."""
    return _entered[-1] if _entered else None


@contextlib.contextmanager
def watching(signals: list[str], finished: Callable[[signal.Signals], object] = signal.raise_signal) -> Iterator[Watch]:
    """The train stage's Watch: the one this process entered at its start (the CLI's, a rank's), from now on catching
    `signals` (train.preempt_signals); else one entered here, for the block (the Prefect task's train stage). A signal
    that one noted after the last update, when the stage ended with its outputs, is then passed to `finished`: by
    default it takes the effect it has outside the stage, so whoever runs it (a flow) stops as it would have."""
    if (watch := current()) is not None:
        watch.catch(signals)
        yield watch
        return
    with Watch(signals) as watch:
        yield watch
    if watch.caught is not None:
        finished(watch.caught)


class Watch:
    """Catches the signals while entered, keeps train.max_time's deadline once `start_clock` is called (fit), and says
    when to stop (`due`: the same answer on every rank)."""

    def __init__(self, signals: list[str], group: Group | None = None, held: bool = False) -> None:
        self.signals = [signal.Signals[name] for name in signals]
        # Held to the process's end (the CLI's, a rank's): its handlers stay after the block, so a signal in the
        # process's teardown is noted too, not a traceback (KeyboardInterrupt in an atexit hook) or another exit code.
        self.held = held
        self.group = group  # None: one process (or the ranks' group, not up yet: `join`)
        self.caught: signal.Signals | None = None
        self._caught_at = 0.0
        self.max_time_s: float | None = None
        self._deadline: float | None = None
        self._previous: dict[signal.Signals, Any] = {}
        self._installed = False  # handlers in place (entered in the main thread)
        self._cpu_group: Any = None
        # due_after_update's cadence: exchange the flags every `_every` updates (the same on every rank)
        self._every, self._since, self._exchanged_at = 1, 0, 0.0  # (start_clock starts it)
        # True while nothing is written (the CLI before it holds the workspace): a signal ends the process at once.
        self.nothing_written = False
        self._ranks: Callable[[], list[int]] | None = None  # a launcher's: the processes a signal is passed on to

    def __enter__(self) -> Watch:
        self._installed = threading.current_thread() is threading.main_thread()
        if self.signals and self._installed:
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._note)
            # A rank starts with the signals blocked (`passing_on`): one that came meanwhile reaches _note now, and so
            # does one its launcher had noted before starting it.
            if told := os.environ.get(PASSED_ON):
                self.caught, self._caught_at = signal.Signals[told], time.monotonic()
            if hasattr(signal, "pthread_sigmask"):
                signal.pthread_sigmask(signal.SIG_UNBLOCK, self.signals)
        elif self.signals:
            print("train: not in the main thread, so train.preempt_signals cannot be caught here (train.max_time "
                  "still applies)", file=sys.stderr)  # fmt: skip
        if self.group is not None:
            self.join(self.group)
        _entered.append(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        _entered.remove(self)
        self.nothing_written = False  # the process ends with the code it chose
        if self.held:
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        self._installed = False

    def catch(self, names: list[str]) -> None:
        """Catch these signals from now on (train.preempt_signals, once read). The others get their handlers back, and
        one of them already noted takes its own effect now, as if it had never been caught."""
        wanted = [signal.Signals[name] for name in names]
        if not self._installed:  # not the main thread: nothing was installed, nothing to change
            self.signals = wanted
            return
        for sig in [s for s in self.signals if s not in wanted]:
            signal.signal(sig, self._previous.pop(sig))
        for sig in [s for s in wanted if s not in self.signals]:
            self._previous[sig] = signal.signal(sig, self._note)
        self.signals = wanted
        if self.caught is not None and self.caught not in wanted:
            late, self.caught = self.caught, None
            signal.raise_signal(late)  # its own handler: the default action, or KeyboardInterrupt for SIGINT

    def join(self, group: Group) -> None:
        """Once the ranks' process group is up, on every rank together: the flags travel on the CPU (with nccl, a gloo
        group beside it, made here)."""
        self.group = group
        if group.distributed and self._cpu_group is None:
            import torch.distributed as dist

            self._cpu_group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")

    def start_clock(self, max_time_s: float | None) -> None:
        """train.max_time counts from here (fit's start), and due_after_update's cadence starts anew."""
        now = time.monotonic()  # one reading (tests count them)
        self.max_time_s = max_time_s
        self._deadline = None if max_time_s is None else now + max_time_s
        self._every, self._since, self._exchanged_at = 1, 0, now

    def _note(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.caught is not None and now - self._caught_at > ECHO_S:  # a second: the signal's own effect at once
            self._pass_on(signum)
            signal.signal(signum, signal.SIG_DFL)
            if hasattr(signal, "pthread_sigmask"):  # a launcher's main thread blocks it (passing_on)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
            os.kill(os.getpid(), signum)
            return
        if self.caught is not None:
            return
        self.caught, self._caught_at = signal.Signals(signum), now
        if self.nothing_written:  # os.write, not print: this may interrupt a print to stderr
            os.write(2, f"preempted: {self.caught.name} received before train started: nothing written; rerun it "
                        f"(exit code {PREEMPTED}: preempted, resumable)\n".encode())  # fmt: skip
            os._exit(PREEMPTED)
        self._pass_on(signum)

    def _pass_on(self, signum: int) -> None:
        if self._ranks is None:
            return
        os.environ[PASSED_ON] = signal.Signals(signum).name  # for a rank started after this
        for pid in self._ranks():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    @contextlib.contextmanager
    def passing_on(self) -> Iterator[None]:
        """Around a launcher's run of its ranks, processes it starts (multiprocessing's children), in the main thread:
        a signal it catches is passed on to each rank. The ranks start with the signals blocked (a process inherits
        the mask of the thread that starts it), so one that comes while they import waits for their Watch, which
        unblocks them; meanwhile this thread blocks them too, and a thread started before does not: the kernel hands
        them to it, and _note runs here, as Python runs every handler."""
        if not (self._installed and self.signals) or not hasattr(signal, "pthread_sigmask"):
            yield
            return
        from multiprocessing import resource_tracker

        # Started now: its first start blocks SIGINT and SIGTERM around itself, then unblocks them in the calling
        # thread, which would let the ranks start unblocked.
        resource_tracker.ensure_running()
        done = threading.Event()
        receiver = threading.Thread(target=done.wait, name="trainflow-signals", daemon=True)
        receiver.start()
        before = signal.pthread_sigmask(signal.SIG_BLOCK, self.signals)
        self._ranks = lambda: [p.pid for p in multiprocessing.active_children() if p.pid is not None]
        if self.caught is not None:  # noted since the launcher last asked: the ranks start told
            os.environ[PASSED_ON] = self.caught.name
        try:
            yield
        finally:
            self._ranks = None
            os.environ.pop(PASSED_ON, None)
            signal.pthread_sigmask(signal.SIG_SETMASK, before)  # one that came since the ranks ended: noted now
            done.set()

    def _reason(self) -> str | None:
        if self.caught is not None:
            return f"{self.caught.name} received"
        if self._deadline is not None and (now := time.monotonic()) >= self._deadline:
            assert self.max_time_s is not None
            trained = now - self._deadline + self.max_time_s
            return f"train.max_time ({self.max_time_s:g} s) reached after {trained:.1f} s"
        return None

    def due(self) -> str | None:
        """Why to stop here, or None; every rank gets the same answer (each must ask, at the same point)."""
        reason = self._reason()
        if self.group is None or not self.group.distributed:
            return reason
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if reason else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._cpu_group)
        if not flag.item():
            return None
        return reason or "another rank was told to stop"

    def due_after_update(self) -> str | None:
        """`due` for the training loop, which asks after every update. One process: the answer now. Several: the ranks
        exchange their flags every N updates, N chosen at each exchange (the largest any rank proposes) so that
        exchanges come about every CHECK_S seconds of training; in between the answer is None on every rank. So all
        ranks stop after the same update, about CHECK_S after the signal (an update later, when updates are slower),
        and a small model does not pay a round trip between the ranks per update (benchmarks/distributed.md)."""
        if self.group is None or not self.group.distributed:
            return self._reason()
        self._since += 1
        if self._since < self._every:
            return None
        import torch
        import torch.distributed as dist

        reason = self._reason()
        now = time.monotonic()
        per_update = (now - self._exchanged_at) / self._since
        proposal = max(1, min(MAX_EVERY, int(CHECK_S / per_update))) if per_update > 0 else 1
        flag = torch.tensor([1 if reason else 0, proposal], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._cpu_group)
        self._every, self._since, self._exchanged_at = int(flag[1]), 0, time.monotonic()
        if not flag[0]:
            return None
        return reason or "another rank was told to stop"

    def stop_before(self, what: str, mark: Path | None = None) -> None:
        """Stop (Preempted) if a signal came, before `what` begins, with nothing of it written; every rank asks here
        and all stop together. `mark`: where rank 0 writes PREEMPTED_MARK, for a job script behind a launcher."""
        why = self.due()
        if why is None:
            return
        if mark is not None and (self.group is None or self.group.is_main):
            from trainflow.core.io import write_json

            write_json(mark, {"update": None, "why": why, "at": time.time()})
        if self.group is not None:
            self.group.barrier()  # no rank ends (and has its launcher stop the others) before the mark is written
        raise Preempted(
            f"train: {why} before {what}: stopped with nothing of it written; rerun to continue (from the newest "
            f"checkpoint, if there is one; exit code {PREEMPTED}: preempted, resumable)"
        )
