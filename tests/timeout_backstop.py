"""pytest-timeout's "thread" method, carried out by faulthandler's watchdog: it ends a test hung holding the GIL too.

pytest-timeout (pyproject: `timeout`, `timeout_method = "thread"`; a test's own `@pytest.mark.timeout(N)` wins) sets
each test's limit. Its own thread method ends a test from a Python thread, which needs the GIL: a process hung in C++
with the GIL held (a destructor joining a thread that waits for the GIL) never lets it run, and the test hangs for
good. Under xdist its stack dump goes to the worker's stdout, which nobody reads. faulthandler's watchdog is a C
thread that needs no GIL: at the limit it prints every thread's Python stack to the session's stderr and exits the
process (under xdist, the worker: the test is reported as crashed, and a new worker takes the tests left). What the
test printed is not shown.

The watchdog is one per process: a process forked during a test inherits it armed but without its thread, and must
not arm its own (faulthandler would wait for the missing thread forever).
"""

from __future__ import annotations

import faulthandler
import os
import sys
from typing import Any

import pytest

_STDERR = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    # The terminal's stderr, taken while pytest's capture is off: during a test, fd 2 is a capture file that an
    # exiting process never prints.
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, ValueError):  # an xdist worker's sys.stderr may be no file
        fd = 2
    config.stash[_STDERR] = os.dup(fd)


def pytest_unconfigure(config: pytest.Config) -> None:
    faulthandler.cancel_dump_traceback_later()
    os.close(config.stash[_STDERR])


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # optional: without pytest-timeout there is no limit
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    import pytest_timeout

    if settings.method != "thread":
        return None  # pytest-timeout's signal method, as asked
    if not settings.disable_debugger_detection and pytest_timeout.is_debugging():
        return True  # under a debugger: no limit (as pytest-timeout does)
    faulthandler.dump_traceback_later(float(settings.timeout), exit=True, file=item.config.stash[_STDERR])
    return True  # in place of pytest-timeout's own timer


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> None:
    faulthandler.cancel_dump_traceback_later()  # pytest-timeout's own then cancels its signal timer, if any


def pytest_enter_pdb() -> None:
    faulthandler.cancel_dump_traceback_later()  # someone is debugging: no limit (as pytest-timeout does)
