"""A team's servers on this machine, for the tests of workspaces that share them (tests/flows/test_team.py): a
throwaway PostgreSQL cluster (a database each for MLflow, Prefect, Optuna), an S3-compatible store (moto's server
mode) and an MLflow tracking server over both, its artifacts proxied to the bucket.

Each runs in a session of its own on a free loopback port (support.servers.spawn) and is stopped with its children
when its context ends; a server that does not come up fails with the tail of its log. A helper whose binary or
package is missing skips the test, saying which in one line: the `team` extra (pip install -e '.[team]') and Debian's
postgresql, which .ci/run installs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from support.servers import BIN, free_port, spawn, stop, tail, wait_for_http

INSTALL_EXTRA = "pip install -e '.[team]'"
# Debian and Ubuntu keep the server binaries (initdb, postgres) out of PATH, one folder per major version.
PG_VERSIONS = Path("/usr/lib/postgresql")
# What a team's servers are set up with, here and in deploy/team/compose.yaml (tests/contracts/test_team_compose.py
# compares them): one database per server, one bucket for MLflow's artifacts and the DVC remote, the access-control
# app and the permission of a user on what they did not create.
DATABASES = ("mlflow", "prefect", "optuna")
BUCKET = "team"
ARTIFACTS = f"s3://{BUCKET}/mlartifacts"
DVC_REMOTE = f"s3://{BUCKET}/dvc"
AUTH_APP = "trainflow-auth"
DEFAULT_PERMISSION = "READ"


def need_module(name: str) -> None:
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"no {name} here: {INSTALL_EXTRA}")


def pg_bindir() -> Path | None:
    """The folder holding PostgreSQL's initdb and postgres: PATH's (a symlink followed), else the newest Debian one."""
    found = [Path(p).resolve().parent for p in (shutil.which("initdb"), shutil.which("postgres")) if p]
    debian = sorted(PG_VERSIONS.glob("*/bin"), key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0)
    return next((d for d in [*found, *debian[::-1]] if (d / "initdb").is_file() and (d / "postgres").is_file()), None)


def as_unprivileged() -> tuple[list[str], pwd.struct_passwd | None]:
    """The command prefix that runs PostgreSQL's binaries as a user they accept, and that user (None: this one).
    initdb and postgres refuse root: as root (CI, containers), they run as `postgres` (Debian's package makes it), else
    `nobody`, through util-linux's setpriv, which execs the server itself (so it leads its session, as spawned)."""
    if os.geteuid() != 0:
        return [], None
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root and no setpriv (util-linux) here to run PostgreSQL as another user")
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            user = pwd.getpwnam(name)
            return [setpriv, f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--"], user
    pytest.skip("running as root and no user `postgres` or `nobody` to run PostgreSQL as")


@dataclass
class Postgres:
    port: int
    user: str = "postgres"  # the cluster's superuser (initdb -U), trusted on 127.0.0.1: a throwaway test cluster

    def url(self, name: str) -> str:
        return f"postgresql+psycopg2://{self.user}@127.0.0.1:{self.port}/{name}"

    def connect(self, name: str = "postgres") -> Any:
        import psycopg2

        return psycopg2.connect(host="127.0.0.1", port=self.port, user=self.user, dbname=name, connect_timeout=5)

    def create_database(self, name: str) -> str:
        """A new, empty database (one each for MLflow, Prefect, Optuna); its SQLAlchemy URL."""
        conn = self.connect()
        try:
            conn.autocommit = True  # CREATE DATABASE cannot run in a transaction
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return self.url(name)


@contextlib.contextmanager
def postgres(tmp: Path, timeout_s: float = 60) -> Iterator[Postgres]:
    """A PostgreSQL cluster of its own (initdb, then postgres on 127.0.0.1 at a free port, TCP only, no fsync),
    removed at the end."""
    need_module("psycopg2")
    bindir = pg_bindir()
    if bindir is None:
        pytest.skip(f"no PostgreSQL server binaries (initdb, postgres) on PATH or in {PG_VERSIONS}/*/bin")
    prefix, user = as_unprivileged()
    tmp.mkdir(parents=True, exist_ok=True)
    # The cluster's user must reach its data folder: as root, one outside pytest's temp folders (mode 0700, root's).
    home = Path(tempfile.mkdtemp(prefix="trainflow-pg-")) if user is not None else tmp
    if user is not None:
        os.chown(home, user.pw_uid, user.pw_gid)
    data, log = home / "data", tmp / "postgres.log"
    proc = None
    try:
        init = [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"]
        made = subprocess.run([*prefix, *init, "--no-locale"], cwd=home, capture_output=True, text=True)
        if made.returncode != 0:
            raise RuntimeError(f"initdb failed ({made.returncode}):\n{(made.stdout + made.stderr)[-4000:]}")
        server = Postgres(free_port())
        settings = {"unix_socket_directories": "", "fsync": "off", "synchronous_commit": "off",
                    "full_page_writes": "off"}  # fmt: skip
        cmd = [str(bindir / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(server.port)]
        cmd += [arg for key, value in settings.items() for arg in ("-c", f"{key}={value}")]
        proc = spawn([*prefix, *cmd], home, dict(os.environ), log)  # the log is opened here: any user writes it
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"postgres exited ({proc.returncode}); its log ends:\n{tail(log)}")
            try:
                server.connect().close()
                break
            except Exception as exc:  # psycopg2.OperationalError until it accepts connections
                if time.monotonic() > deadline:
                    why = f"postgres not accepting connections after {timeout_s:g} s"
                    raise RuntimeError(f"{why}; its log ends:\n{tail(log)}") from exc
                time.sleep(0.1)
        yield server
    finally:
        if proc is not None:
            # SIGINT is its fast shutdown: clients still connected are cut off (SIGTERM would wait for them).
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            stop(proc)
        if home != tmp:
            shutil.rmtree(home, ignore_errors=True)


@dataclass
class S3:
    endpoint: str
    bucket: str
    env: dict[str, str] = field(default_factory=dict)  # what a client of it needs: dummy keys, region, endpoint

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=self.env["AWS_DEFAULT_REGION"],
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
        )

    def keys(self, prefix: str = "") -> list[str]:
        """Every object's key under `prefix` in the bucket."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [obj["Key"] for page in pages for obj in page.get("Contents", [])]


@contextlib.contextmanager
def s3_server(tmp: Path, bucket: str = BUCKET, timeout_s: float = 60) -> Iterator[S3]:
    """moto's server mode on 127.0.0.1 at a free port (its objects in memory), with `bucket` made."""
    for module in ("moto", "flask", "flask_cors", "boto3"):  # moto[server]: its server needs flask and flask-cors
        need_module(module)
    tmp.mkdir(parents=True, exist_ok=True)
    port, log = free_port(), tmp / "moto.log"
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,  # boto3 and DVC's s3fs
        "MLFLOW_S3_ENDPOINT_URL": endpoint,  # MLflow's S3 artifact repository
    }
    proc = spawn([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], tmp, dict(os.environ), log)
    try:
        started(proc, "moto server", f"{endpoint}/moto-api/", log, timeout_s)
        s3 = S3(endpoint, bucket, env)
        s3.client().create_bucket(Bucket=bucket)
        yield s3
    finally:
        stop(proc)


@dataclass
class MlflowServer:
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.contextmanager
def mlflow_server(
    tmp: Path,
    backend_url: str,
    artifacts_destination: str,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    timeout_s: float = 180,
) -> Iterator[MlflowServer]:
    """`mlflow server` over `backend_url` serving artifacts from `artifacts_destination` (s3://bucket/prefix): clients
    send and fetch them through it (mlflow-artifacts:/), with no bucket credentials of their own. `env`: what only
    the server's environment gets (S3.env)."""
    mlflow = BIN / "mlflow"
    if not mlflow.is_file():
        pytest.skip(f"no mlflow command in {BIN}")
    tmp.mkdir(parents=True, exist_ok=True)
    server = MlflowServer(free_port(), tmp / "mlflow.log")
    cmd = [str(mlflow), "server", "--backend-store-uri", backend_url, "--artifacts-destination", artifacts_destination,
           "--serve-artifacts", "--host", "127.0.0.1", "--port", str(server.port), "--workers", "1"]  # fmt: skip
    cmd += extra_args
    full = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    # Its job runner (GenAI jobs, none of ours) is six more processes: too many for a 2-core machine.
    full |= {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **(env or {})}
    proc = spawn(cmd, tmp, full, server.log)  # in tmp: nothing it writes by default lands in the checkout
    try:
        started(proc, "mlflow server", f"{server.url}/health", server.log, timeout_s)  # its migrations: ~15 s
        yield server
    finally:
        stop(proc)


def started(proc: subprocess.Popen[bytes], what: str, url: str, log: Path, timeout_s: float) -> None:
    """Wait until `url` answers 200; a server that exits or never answers fails with its log's tail."""

    def alive() -> str | None:
        return None if proc.poll() is None else f"it exited ({proc.returncode})"

    try:
        wait_for_http(url, alive, timeout_s)
    except AssertionError as exc:
        raise RuntimeError(f"{what} did not start: {exc}; its log ends:\n{tail(log)}") from None
