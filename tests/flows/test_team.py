"""A team (issue 46): two workspaces, as on two teammates' machines, share one MLflow server (PostgreSQL behind it,
artifacts proxied to S3) and one DVC remote on the same S3 endpoint.

A runs the pipeline (`dvc repro`), pushes its outputs and registers version 1, the champion. B, a git clone of A in a
directory of its own, pulls them: nothing is left to reproduce. B then trains a challenger (`trainflow run -S`) and
registers it in the same registry: version 2, with its decision. Both models' files are in the bucket, none on the
disk of a workspace or of the server, though no trainflow command had S3 credentials (proxied artifacts); only
`dvc push` and `dvc pull` get them, and they are never written into .dvc/config, which git tracks.

Needs the `team` extra (psycopg2, boto3, moto[server], dvc-s3) and PostgreSQL's server binaries, which
scripts/test.sh --slow and .ci/run install; skipped, saying which is missing, otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.projects import FAST, REPO, make_project
from support.team import ARTIFACTS, DATABASES, DVC_REMOTE, S3, MlflowServer, mlflow_server, postgres, s3_server
from support.vcs import dvc, git, locked_outs, snapshot

from trainflow.registry.registry import CHAMPION, DECISION_TAG

pytestmark = pytest.mark.slow

STAGES = ("ingest", "split", "train", "evaluate", "register")
# No trainflow run pushes (deploy.push): the runs have no bucket credentials, only `dvc push` / `dvc pull` do.
SETTINGS = {"data.source": "builtin:iris", "register.model_name": "iris", "deploy.push": "false", **FAST}
S3_VARIABLES = ("AWS_", "MLFLOW_S3_")  # what would let a client reach the bucket itself


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[S3, MlflowServer]]:
    """The team's servers: PostgreSQL, an S3 endpoint, and MLflow over both (the bucket's keys in its env only)."""
    where = tmp_path_factory.mktemp("team")
    with contextlib.ExitStack() as servers:
        db = servers.enter_context(postgres(where / "postgres"))
        s3 = servers.enter_context(s3_server(where / "s3"))
        backend = db.create_database(DATABASES[0])
        tracking = servers.enter_context(mlflow_server(where / "mlflow", backend, ARTIFACTS, env=s3.env))
        yield s3, tracking
        # Nothing the server was given landed on its disk: its folder holds its log only.
        assert [p.name for p in (where / "mlflow").iterdir()] == ["mlflow.log"]


@pytest.fixture
def client_env(team: tuple[S3, MlflowServer], monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's environment as a teammate's: the team's tracking server, and no S3 credentials or endpoint
    (every `trainflow` and `dvc repro` here inherits it; `with_bucket_keys` adds them for a push or a pull)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", team[1].url)
    for key in [k for k in os.environ if k.startswith(S3_VARIABLES)]:
        monkeypatch.delenv(key)


@contextlib.contextmanager
def with_bucket_keys(s3: S3) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        for key, value in s3.env.items():
            mp.setenv(key, value)
        yield


def trainflow(root: Path, *args: str) -> str:
    env = dict(os.environ)
    assert not [k for k in env if k.startswith(S3_VARIABLES)], "a trainflow client was given S3 credentials"
    proc = subprocess.run([sys.executable, "-m", "trainflow", *args], cwd=root, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"trainflow {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}"
    return proc.stdout + proc.stderr


def test_a_teammate_pulls_the_run_and_registers_a_challenger_in_the_shared_registry(
    tmp_path: Path, team: tuple[S3, MlflowServer], client_env: None
) -> None:
    from mlflow.tracking import MlflowClient

    s3, server = team
    client = MlflowClient(server.url)
    a = make_project(tmp_path / "a", SETTINGS)
    shutil.copy2(REPO / ".gitignore", a / ".gitignore")
    dvc(a, "remote", "add", "-d", "team", DVC_REMOTE)
    dvc(a, "remote", "modify", "team", "endpointurl", s3.endpoint)
    ran = dvc(a, "repro")
    assert all(f"Running stage '{s}'" in ran for s in STAGES)
    first = json.loads((a / "reports/registration.json").read_text())
    assert (first["version"], first["champion"]) == (1, True)
    with with_bucket_keys(s3):
        dvc(a, "push")
        assert json.loads(dvc(a, "status", "--cloud", "--json")) == {}
    outs = locked_outs(a)
    pushed = set(s3.keys("dvc/"))
    for path, md5 in outs.items():  # each output's object (a directory's .dir manifest) is in the bucket
        assert f"dvc/files/md5/{md5[:2]}/{md5[2:]}" in pushed, f"{path} was not pushed"
    git(a, "add", "-A")
    git(a, "commit", "-qm", "run, and the team's remote")
    config = (a / ".dvc/config").read_text()
    assert s3.endpoint in config and s3.env["AWS_SECRET_ACCESS_KEY"] not in config and "access_key" not in config

    b = tmp_path / "b"
    git(tmp_path, "clone", "-q", str(a), str(b))
    assert not any((b / path).exists() for path in outs)
    with with_bucket_keys(s3):
        dvc(b, "pull")
    assert snapshot(b, list(outs)) == snapshot(a, list(outs))
    assert json.loads(dvc(b, "status", "--json")) == {}
    assert "Running stage" not in dvc(b, "repro")

    # B's challenger: trained longer, registered as the next version of the same model.
    trainflow(b, "run", "-S", "train.epochs=5")
    second = json.loads((b / "reports/registration.json").read_text())
    assert second["version"] == 2
    versions = {int(v.version): v for v in client.search_model_versions("name = 'iris'")}
    assert sorted(versions) == [1, 2]
    assert versions[2].tags.get(DECISION_TAG)
    assert int(client.get_model_version_by_alias("iris", CHAMPION).version) == (2 if second["champion"] else 1)

    # Both models' files are in the bucket, sent through the server: none on a workspace's disk.
    stored = set(s3.keys("mlartifacts/"))
    for number in versions:
        where = client.get_model_version_download_uri("iris", str(number))  # the registry's answer: the server
        assert where.startswith("mlflow-artifacts:/"), where
        assert f"mlartifacts/{where.removeprefix('mlflow-artifacts:/')}/MLmodel" in stored, f"version {number}: {where}"
    for root in (a, b):
        assert not [p for p in ("mlartifacts", "mlruns") if (root / p).exists()]


def test_an_experiment_trainflow_makes_on_a_server_keeps_its_artifacts_there(
    tmp_path: Path, team: tuple[S3, MlflowServer], client_env: None
) -> None:
    import mlflow

    from trainflow import tracking

    tracking.configure(tmp_path)
    experiment = mlflow.get_experiment(tracking.ensure_experiment("made-by-trainflow", tmp_path))
    assert experiment.artifact_location.startswith("mlflow-artifacts:/"), experiment.artifact_location
