"""Progress on stderr that suits where stderr goes: a tqdm bar on a terminal; in a log (piped, or redirected to a file)
one plain line every tenth of the way. A bar redraws itself with carriage returns several times a second, which a log
keeps as text: the bars would bury the piped log of even a short run."""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Protocol, TextIO

STEPS = 10  # plain lines per run: one each tenth of the total, and one at the end


class Progress(Protocol):
    """What the trainer and the sweep use of a bar; tqdm's bar has it, and so does PlainProgress."""

    n: int

    def update(self, n: int = 1) -> Any: ...
    def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **values: Any) -> None: ...
    def close(self) -> None: ...


def progress(total: int, *, desc: str, unit: str, initial: int = 0, enabled: bool = True) -> Progress:
    """A tqdm bar when stderr is a terminal, else PlainProgress; silent when not `enabled` (train.progress: false, or a
    rank other than 0)."""
    if enabled and _is_terminal(sys.stderr):
        from tqdm.auto import tqdm

        bar: Progress = tqdm(total=total, initial=initial, unit=unit, desc=desc, file=sys.stderr, dynamic_ncols=True)
        return bar
    return PlainProgress(total, desc=desc, unit=unit, initial=initial, stream=sys.stderr if enabled else None)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False


class PlainProgress:
    """Progress as sparse lines for logs: "train: 300/1000 upd (30%), 41.2 upd/s, loss=0.4123, lr=1.00e-03", when the
    count passes each tenth of `total`, and at close() if the last line did not show the final count. `stream` None:
    silent."""

    def __init__(self, total: int, *, desc: str, unit: str, initial: int = 0, stream: TextIO | None) -> None:
        self.n, self.total, self.desc, self.unit, self.stream = initial, total, desc, unit, stream
        self._step = max(1, math.ceil(total / STEPS)) if total > 0 else 0
        self._next = self._after(initial)
        self._said = initial  # the count the last line showed: a run resumed at the end says nothing more
        self._start, self._start_n = time.monotonic(), initial
        self._postfix: dict[str, str] = {}

    def _after(self, n: int) -> int:
        return (n // self._step + 1) * self._step if self._step else math.inf  # type: ignore[return-value]

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.n >= self._next:
            self._say()
            self._next = self._after(self.n)

    def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **values: Any) -> None:
        self._postfix = {str(k): str(v) for k, v in {**(ordered_dict or {}), **values}.items()}

    def close(self) -> None:
        if self.n != self._said:
            self._say()

    def _say(self) -> None:
        self._said = self.n
        if self.stream is None:
            return
        parts = [f"{self.desc}: {self.n}/{self.total} {self.unit}"]
        if self.total > 0:
            parts[0] += f" ({100 * self.n / self.total:.0f}%)"
        elapsed = time.monotonic() - self._start
        if elapsed > 0 and self.n > self._start_n:
            parts.append(f"{(self.n - self._start_n) / elapsed:.3g} {self.unit}/s")
        parts += [f"{k}={v}" for k, v in self._postfix.items()]
        self.stream.write(", ".join(parts) + "\n")
        self.stream.flush()
