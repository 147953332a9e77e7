"""Prefect's local mode with a temporary server that dies with the run that started it.

With no PREFECT_API_URL, Prefect starts a temporary API server as a child process on first use and stops it at exit.
A run killed with SIGKILL (the OOM killer, a preempted machine, `kill -9`) never reaches exit, so the server lived on
as an orphan, one per killed run, each holding memory and a port until the machine rebooted. Here the server is
started before the flow, from the main thread, as a child that the kernel signals when its parent dies
(PR_SET_PDEATHSIG). Prefect's clients find it already running: it is the instance they would have started.

The server runs in a session of its own, and ignores SIGUSR1. A terminal's Ctrl-C (SIGINT to the foreground process
group) and any signal sent to the run's process group reached the server too, which stopped at once while the run
still had to record how it ended: every call of Prefect's clients to the gone server then retried with exponential
backoff, then failed with a traceback. In its own session only the run's own end (or its death) stops it.
Slurm's `--signal=USR1@...` and `scancel --signal=USR1` signal every process of the job, and SIGUSR1's default
action would end the server, so it is ignored there (uvicorn handles only SIGINT and SIGTERM itself).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from typing import Any
from unittest import mock

PR_SET_PDEATHSIG = 1
SIG_IGN = 1  # <signal.h>: the handler value that ignores a signal


def start_temporary_server() -> None:
    """Start Prefect's temporary local server now, as a child that gets SIGTERM when this process dies.

    Linux only (elsewhere this does nothing, and Prefect starts its server as usual). The kernel sends the signal when
    the *thread* that started the child ends, so this must run on the main thread, which lives as long as the process.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # the instance Prefect's clients use in local mode (keyed by port None)
    if server.running:
        return
    libc = ctypes.CDLL(None, use_errno=True)  # looked up here: the child runs only async-signal-safe code
    prctl, set_handler = libc.prctl, libc.signal
    set_handler.argtypes, set_handler.restype = [ctypes.c_int, ctypes.c_void_p], ctypes.c_void_p
    ignore = ctypes.c_void_p(SIG_IGN)
    parent = os.getpid()

    def die_with_parent() -> None:  # in the child, between fork and exec
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the line above: nobody will signal us
            os._exit(1)
        set_handler(signal.SIGUSR1, ignore)  # an ignored signal stays ignored across exec

    popen: Any = subprocess.Popen

    def popen_dying_with_parent(*args: Any, **kwargs: Any) -> Any:
        # A session of its own (setsid, before preexec_fn runs): out of the terminal's foreground process group.
        return popen(*args, preexec_fn=die_with_parent, start_new_session=True, **kwargs)

    # Prefect's server module calls subprocess.Popen once, in start(); only that call is made here.
    with mock.patch.object(subprocess, "Popen", popen_dying_with_parent):
        server.start()
