"""Preemption: a signal (train.preempt_signals) or the time budget (train.max_time) stops training at the next update
boundary, after a checkpoint, with exit code PREEMPTED, so the next run (a retry, the next schedule, a requeue)
resumes from that checkpoint bit for bit.

The signal handler only notes the signal; the trainer asks `due()` after each update, where the weights, optimizer
and data position are whole. A second signal, more than ECHO_S after the first, ends the process at once (the
signal's default action), for a user who does not want to wait for the checkpoint.

Several ranks stop after the same update: each update, they take the maximum of their flags over a CPU (gloo) group,
a host-to-host exchange of one integer that never waits for the device, so a signal any rank received is acted on by
all within one update.

Signals are caught in the main thread only (Python's rule); elsewhere the budget still applies, and a note says so.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from types import FrameType, TracebackType
from typing import Any

import torch

from trainflow.engine.distributed import Group
from trainflow.errors import PREEMPTED, Preempted

__all__ = ["PREEMPTED", "PREEMPTED_MARK", "Preempted", "Watch"]

# Written beside the checkpoints by a preempted run (removed by the next): {"update", "why", "at"}. A job script
# reads it where a launcher between it and trainflow turns exit code 75 into its own (torchrun exits 1).
PREEMPTED_MARK = "preempted.json"

# A signal this soon after the first is the same preemption reaching the process twice (a launcher such as torchrun
# or a job script forwards what the scheduler also sent it): noted, not "a second signal".
ECHO_S = 1.0


class Watch:
    """Around fit(): catches the signals, keeps the deadline, and says when to stop (the same update on every rank)."""

    def __init__(self, signals: list[str], max_time_s: float | None, group: Group) -> None:
        self.signals = [signal.Signals[name] for name in signals]
        self.max_time_s = max_time_s
        self.group = group
        self.caught: signal.Signals | None = None
        self._caught_at = 0.0
        self._deadline: float | None = None
        self._previous: dict[signal.Signals, Any] = {}
        self._cpu_group: Any = None

    def __enter__(self) -> Watch:
        if self.max_time_s is not None:
            self._deadline = time.monotonic() + self.max_time_s
        if self.signals and threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._note)
        elif self.signals:
            print("train: not in the main thread, so train.preempt_signals cannot be caught here (train.max_time "
                  "still applies)", file=sys.stderr)  # fmt: skip
        if self.group.distributed:
            import torch.distributed as dist

            # The flags travel on the CPU: with nccl, a gloo group beside it (made by every rank, here, together).
            gloo = dist.get_backend() == "gloo"
            self._cpu_group = None if gloo else dist.new_group(backend="gloo")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _note(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.caught is not None and now - self._caught_at > ECHO_S:  # a second: the signal's own effect at once
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self.caught is None:
            self.caught, self._caught_at = signal.Signals(signum), now

    def _reason(self) -> str | None:
        if self.caught is not None:
            return f"{self.caught.name} received"
        if self._deadline is not None and (now := time.monotonic()) >= self._deadline:
            assert self.max_time_s is not None
            trained = now - self._deadline + self.max_time_s
            return f"train.max_time ({self.max_time_s:g} s) reached after {trained:.1f} s"
        return None

    def due(self) -> str | None:
        """Why to stop after this update, or None; every rank gets the same answer."""
        reason = self._reason()
        if not self.group.distributed:
            return reason
        import torch.distributed as dist

        flag = torch.tensor([1 if reason else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._cpu_group)
        if not flag.item():
            return None
        return reason or "another rank was told to stop"
