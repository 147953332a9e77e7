"""Every test has a time limit, and a test past it fails with every thread's stack, whether or not it holds the GIL.

A pytest session on two xdist workers, with the project's pytest settings, pytest-timeout and
tests/timeout_backstop.py (as tests/conftest.py loads it), runs a test that waits forever in C holding the GIL (as a
process hung in a C++ destructor does) and one that sleeps: each is stopped at its limit, reported as failed, and its
stack printed. Slow tier: two pytest sessions' workers start, hang and restart (~25 s of a worker here).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

HANGS = """
import ctypes
import time

import pytest


def test_every_test_has_a_limit(request):
    assert float(request.config.getini("timeout")) > 0
    assert request.config.getini("timeout_method") == "thread"


@pytest.mark.timeout(2)
def test_waits_holding_the_gil():
    mutex = ctypes.create_string_buffer(64)  # a pthread mutex, statically initialised (zeros)
    libc = ctypes.PyDLL(None)  # a PyDLL call keeps the GIL
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)  # locked already, by this thread: waits forever


@pytest.mark.timeout(5)
def test_sleeps():
    time.sleep(600)
"""


def test_a_test_past_its_limit_fails_with_its_stack_even_holding_the_gil(tmp_path: Path) -> None:
    (tmp_path / "test_hangs.py").write_text(HANGS)
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["timeout_backstop"]\n')
    cmd = [sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path),
           "-p", "xdist.plugin", "-p", "pytest_timeout", "-p", "no:cacheprovider", "-n", "2", "-q",
           str(tmp_path / "test_hangs.py")]  # fmt: skip
    # Only the plugins this needs (hypothesis's and hydra's take seconds to import, in every worker)
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests"), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the workers too
        out, err = proc.communicate()
        raise AssertionError(
            f"the session never ended: a hung test was not stopped\n{out[-3000:]}\n{err[-3000:]}"
        ) from None
    took = time.monotonic() - start
    assert proc.returncode == 1, out[-3000:]
    assert "1 passed" in out and "2 failed" in out, out[-3000:]
    # The limits differ (2 s, 5 s) so that the two workers' stack dumps, written to one stderr, do not interleave.
    for test, line in (("test_waits_holding_the_gil", 18), ("test_sleeps", 23)):
        assert f"worker 'gw0' crashed while running 'test_hangs.py::{test}'" in out.replace("gw1", "gw0"), out
        assert f'test_hangs.py", line {line} in {test}' in err, err[-3000:]  # where it hung, in every thread's stack
    assert err.count("Timeout (0:00:02)!") == 1 and err.count("Timeout (0:00:05)!") == 1, err[-3000:]
    assert took < 120, took
