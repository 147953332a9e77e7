"""A real `prefect server start` for the tests (and bench/soak.py) that need one, and the process helpers around it.

Every process started here runs in its own session, so `stop` ends it with its children (flow-run subprocesses).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:  # the child keeps its own handle
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen[bytes], grace_s: float = 15) -> None:
    """SIGTERM the process's session, SIGKILL what is left after `grace_s` (flow-run subprocesses included)."""
    with contextlib.suppress(ProcessLookupError):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace_s)
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process's session at once, as a machine that goes down would."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def tail(log: Path, n: int = 4000) -> str:
    return log.read_text(errors="replace")[-n:] if log.is_file() else ""


@dataclass
class PrefectServer:
    home: Path  # PREFECT_HOME: the server's database lives here, so a restart keeps every run
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def log(self) -> Path:
        return self.home / "server.log"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a client of this server (PREFECT_HOME, PREFECT_API_URL, quiet and offline)."""
        return {**self._env(base), "PREFECT_API_URL": self.url}

    def _env(self, base: dict[str, str] | None) -> dict[str, str]:
        env = {
            **(base if base is not None else os.environ),
            "PREFECT_HOME": str(self.home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_LOGGING_LEVEL": "WARNING",
        }
        env.pop("PREFECT_API_URL", None)
        return env

    def start(self, timeout_s: float = 120) -> PrefectServer:
        """Start it (again, on the same port and database after `kill`); return once it answers /health."""
        cmd = [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = spawn(cmd, self.home, self._env(None), self.log)
        deadline = time.monotonic() + timeout_s  # healthy in 5-11 s here; a cold first migration can take longer
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prefect server exited:\n{tail(self.log)}")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                if response.status == 200:
                    return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"prefect server not healthy after {timeout_s:g} s:\n{tail(self.log)}")
            time.sleep(0.3)

    def kill(self) -> None:
        if self.proc is not None:
            kill(self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


@contextlib.contextmanager
def prefect_server(home: Path) -> Iterator[PrefectServer]:
    server = PrefectServer(home).start()
    try:
        yield server
    finally:
        server.stop()


def wait_for_http(url: str, alive: Callable[[], str | None], seconds: float, interval: float = 0.3) -> None:
    """Poll `url` until it answers 200; `alive()` returns why the server process died (None while it runs)."""
    deadline = time.monotonic() + seconds
    while True:
        died = alive()
        assert died is None, died
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{url} did not answer in {seconds:g} s"
        time.sleep(interval)
