"""flows/local_server.py: Prefect's temporary server runs in a session of its own, ignores SIGUSR1, and dies with the
run. A terminal's Ctrl-C (SIGINT to the run's process group) used to stop it while the run still had to record how it
ended (tests/flows/test_interrupt_run.py, slow tier, shows the whole run).

Prefect's server start is replaced by a stand-in child (a Python process that notes a SIGINT in a file and waits), so
this takes a second or two instead of a server's start; the Popen call it makes goes through start_temporary_server's
like Prefect's own.
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

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]

RUN = textwrap.dedent(
    """
    import subprocess, sys, time
    from prefect.server.api.server import SubprocessASGIServer
    from flows import local_server

    CHILD = "import pathlib, signal, sys, time; signal.signal(signal.SIGINT, lambda *_: pathlib.Path(sys.argv[1])" \\
            ".write_text('SIGINT')); time.sleep(60)"

    def start(self, timeout=None):  # what Prefect's start does, less the server: one subprocess.Popen
        self.running = True
        self.server_process = subprocess.Popen([sys.executable, "-c", CHILD, sys.argv[1]])

    SubprocessASGIServer.start = start
    local_server.start_temporary_server()
    print(SubprocessASGIServer().server_process.pid, flush=True)
    time.sleep(60)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and the session are Linux's")
def test_the_temporary_server_is_out_of_the_run_s_process_group_ignores_sigusr1_and_dies_with_the_run(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "child-got-sigint"
    run = subprocess.Popen([sys.executable, "-c", RUN, str(marker)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                           start_new_session=True)  # fmt: skip
    try:
        assert run.stdout is not None
        server = psutil.Process(int(run.stdout.readline()))
        assert os.getsid(server.pid) == server.pid != os.getsid(run.pid)  # a session (and process group) of its own
        os.kill(server.pid, signal.SIGUSR1)  # Slurm's --signal=USR1 reaches every process of the job
        time.sleep(0.5)
        assert server.is_running() and server.status() != psutil.STATUS_ZOMBIE
        os.killpg(run.pid, signal.SIGINT)  # a terminal's Ctrl-C: the run's process group
        assert run.wait(timeout=30) != 0
        gone, alive = psutil.wait_procs([server], timeout=15)  # PR_SET_PDEATHSIG: SIGTERM when the run is gone
        assert not alive, "the server outlived the run"
        assert not marker.exists(), "the run's Ctrl-C reached the server"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.wait()
