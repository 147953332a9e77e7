"""Access control on a shared MLflow server (issue 46): `mlflow server --app-name trainflow-auth`
(trainflow.registry.guard), MLflow's basic-auth app where moving `champion` also needs MANAGE on the model.

Alice trains first: she creates the registered model (its creator: MANAGE) and version 1 is champion. Bob, given EDIT
on the model and on the experiment, trains a better model: version 2 is registered and becomes `challenger`, the
gate says it beats the champion, and the server refuses to move `champion`: the run exits 2 with one line saying so,
the decision tag says "not moved", and nothing else was written (no champion history, no lock left). Alice then
promotes version 2 by hand. Bob's own MlflowClient is refused as well: the rule is the server's, not trainflow's.
Credentials come only from MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD, and no password appears in any
output, file of the project, or anything the server holds about the runs and versions.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.projects import FAST, make_project
from support.servers import BIN, free_port, spawn, stop, tail, wait_for_http
from support.team import AUTH_APP, DEFAULT_PERMISSION

from trainflow.params import write_overrides
from trainflow.registry.lock import LOCK_SUFFIX
from trainflow.registry.registry import CHALLENGER, CHAMPION, CHANGE_TAG, DECISION_TAG, HISTORY_TAG

pytestmark = pytest.mark.slow

if importlib.util.find_spec("flask_wtf") is None:
    pytest.skip("no Flask-WTF here (MLflow's basic-auth needs it): pip install -e '.[team]'", allow_module_level=True)

MODEL, EXPERIMENT = "iris", "trainflow"  # register.model_name; tracking.experiment as params.yaml has it
# The point rule on log loss, which more training lowers: Bob's longer run beats Alice's one epoch, every time.
SETTINGS = {"data.source": "builtin:iris", "register.model_name": MODEL, **FAST, "train.epochs": 1,
            "register.decide": "point", "register.gate_metric": "log_loss", "register.min_improvement": 0,
            "deploy.push": "false"}  # fmt: skip
BOB_EPOCHS = 30


@dataclass
class User:
    name: str
    password: str

    def header(self) -> str:
        return "Basic " + base64.b64encode(f"{self.name}:{self.password}".encode()).decode()


@dataclass
class Server:
    url: str
    admin: User
    log: Path

    def rest(self, user: User, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        """(status, body: parsed JSON, else text) of one REST call as `user`."""
        url = self.url + path
        data = None
        if method == "GET" and body:
            url += "?" + urllib.parse.urlencode(body)
        elif body is not None:
            data = json.dumps(body).encode()
        headers = {"Authorization": user.header(), "Content-Type": "application/json"}
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, text = response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            status, text = exc.code, exc.read().decode()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def admin_call(self, method: str, path: str, body: dict[str, Any]) -> Any:
        status, answer = self.rest(self.admin, method, path, body)
        assert status == 200, (path, status, answer)
        return answer

    def create_user(self, name: str) -> User:
        user = User(name, secrets.token_urlsafe(18))
        self.admin_call("POST", "/api/2.0/mlflow/users/create", {"username": name, "password": user.password})
        return user

    def permission(self, user: User, resource_type: str, resource_id: str) -> str:
        query = {"username": user.name, "resource_type": resource_type, "resource_id": resource_id}
        return str(self.admin_call("GET", "/api/3.0/mlflow/users/permissions/get", query)["permission"])

    def grant(self, user: User, resource_type: str, resource_id: str, permission: str) -> None:
        body = {"username": user.name, "resource_type": resource_type, "resource_id": resource_id,
                "permission": permission}  # fmt: skip
        self.admin_call("POST", "/api/3.0/mlflow/users/permissions/grant", body)

    def env(self, user: User) -> dict[str, str]:
        """A teammate's environment: this server, logged in as `user` through MLflow's own variables."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
        env.pop("TRAINFLOW_WORKSPACE", None)
        return {**env, "MLFLOW_TRACKING_URI": self.url, "MLFLOW_TRACKING_USERNAME": user.name,
                "MLFLOW_TRACKING_PASSWORD": user.password}  # fmt: skip


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """`mlflow server --app-name trainflow-auth` over SQLite stores in tmp_path, everyone READ by default."""
    where = tmp_path / "server"
    where.mkdir()
    admin = User("admin", secrets.token_urlsafe(18))
    config = where / "basic_auth.ini"
    config.write_text(
        f"[mlflow]\ndefault_permission = {DEFAULT_PERMISSION}\n"
        f"database_uri = sqlite:///{where / 'auth.db'}\n"
        f"admin_username = {admin.name}\nadmin_password = {admin.password}\n"
    )
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    env |= {
        "MLFLOW_AUTH_CONFIG_PATH": str(config),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",  # no job runner and huey consumers: a registry is all we need
    }
    cmd = [str(BIN / "mlflow"), "server", "--app-name", AUTH_APP, "--host", "127.0.0.1", "--port", str(port),
           "--workers", "1", "--backend-store-uri", f"sqlite:///{where / 'mlflow.db'}", "--serve-artifacts",
           "--artifacts-destination", str(where / "artifacts")]  # fmt: skip
    log = where / "server.log"
    proc = spawn(cmd, where, env, log)
    try:
        died = lambda: None if proc.poll() is None else f"mlflow server exited:\n{tail(log)}"  # noqa: E731
        wait_for_http(f"http://127.0.0.1:{port}/health", died, 120)
        yield Server(f"http://127.0.0.1:{port}", admin, log)
    finally:
        stop(proc)


def trainflow(server: Server, user: User, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "trainflow", *args]
    return subprocess.run(cmd, cwd=root, env=server.env(user), capture_output=True, text=True, timeout=480)


@pytest.fixture
def as_user(server: Server, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An MlflowClient logged in as `user`. MLflow reads the credentials from the environment at each request, so
    every client of this process is `user`'s until the next call."""
    from mlflow.tracking import MlflowClient

    def client(user: User) -> Any:
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user.name)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", user.password)
        return MlflowClient(server.url)

    return client


def test_an_edit_user_registers_a_challenger_and_only_a_manager_moves_the_champion(
    tmp_path: Path, server: Server, as_user: Any
) -> None:
    from mlflow.exceptions import MlflowException

    alice, bob = server.create_user("alice"), server.create_user("bob")
    root = make_project(tmp_path / "proj", SETTINGS)
    outputs: list[str] = []

    def run(user: User, *args: str) -> subprocess.CompletedProcess[str]:
        done = trainflow(server, user, root, *args)
        outputs.extend([done.stdout, done.stderr])
        return done

    first = run(alice, "run")
    assert first.returncode == 0, first.stderr[-3000:]
    admin = as_user(server.admin)
    assert admin.get_registered_model(MODEL).aliases == {CHAMPION: "1", CHALLENGER: "1"}
    assert server.permission(alice, "registered_model", MODEL) == "MANAGE"  # its creator

    # Bob: READ on everything (default_permission), so he can neither log runs nor register: EDIT on both.
    experiment = admin.get_experiment_by_name(EXPERIMENT).experiment_id
    assert server.permission(bob, "experiment", experiment) == "READ"
    assert server.permission(bob, "registered_model", MODEL) == "READ"
    server.grant(bob, "experiment", experiment, "EDIT")
    server.grant(bob, "registered_model", MODEL, "EDIT")

    # Bob trains longer, his change made in params.yaml. (With `-S` the CLI would also put params.yaml back on this
    # error, cli/overrides.py, and end with its advice: the refusal is the last line of a plain run.)
    write_overrides(root / "params.yaml", [f"train.epochs={BOB_EPOCHS}"])
    second = run(bob, "run")
    assert second.returncode == 2, second.stderr[-3000:]
    last = second.stderr.rstrip("\n").splitlines()[-1]
    assert last.startswith("error: "), second.stderr[-3000:]
    assert "refused to move `champion`" in last and "MANAGE" in last and "trainflow models promote 2" in last, last
    model = admin.get_registered_model(MODEL)
    assert model.aliases == {CHAMPION: "1", CHALLENGER: "2"}
    assert json.loads(model.tags[HISTORY_TAG]) == [1]  # nothing after the refused alias was written
    version = admin.get_model_version(MODEL, "2")
    decision = version.tags[DECISION_TAG]
    assert "beats champion version 1" in decision, decision
    assert decision.split("; not moved: ")[-1].startswith("the registry refused to move `champion`"), decision
    assert CHANGE_TAG not in version.tags
    assert [m.name for m in admin.search_registered_models() if m.name.endswith(LOCK_SUFFIX)] == []
    assert json.loads((root / "reports/registration.json").read_text())["version"] == 1  # register wrote nothing

    # The rule is the server's: Bob's own client is refused (403, MLflow's error body naming the rule) ...
    with pytest.raises(MlflowException) as refused:
        as_user(bob).set_registered_model_alias(MODEL, CHAMPION, "2")
    assert refused.value.error_code == "PERMISSION_DENIED" and refused.value.get_http_status_code() == 403
    body = {"name": MODEL, "alias": CHAMPION, "version": "2"}
    for path in ("/api/2.0/mlflow/registered-models/alias", "/ajax-api/2.0/mlflow/registered-models/alias"):
        status, answer = server.rest(bob, "POST", path, body)
        assert status == 403 and answer["error_code"] == "PERMISSION_DENIED", (path, status, answer)
        assert "needs MANAGE permission" in answer["message"]
    # ... and so are the other ways of moving what `champion` means: renaming the model (its aliases go with it) and
    # rewriting the champion history that a rollback follows. Another tag is his to write (EDIT).
    for refused_call in (
        lambda: as_user(bob).rename_registered_model(MODEL, "taken"),
        lambda: as_user(bob).set_registered_model_tag(MODEL, HISTORY_TAG, "[2]"),
        lambda: as_user(bob).set_registered_model_tag(MODEL, HISTORY_TAG.upper(), "[2]"),  # one key to MySQL
        lambda: as_user(bob).delete_registered_model_tag(MODEL, HISTORY_TAG),
    ):
        with pytest.raises(MlflowException) as refused:
            refused_call()
        assert refused.value.error_code == "PERMISSION_DENIED", refused.value
    as_user(bob).set_registered_model_tag(MODEL, "reviewed_by", "bob")
    admin = as_user(server.admin)
    assert admin.get_registered_model(MODEL).aliases[CHAMPION] == "1"
    assert json.loads(admin.get_registered_model(MODEL).tags[HISTORY_TAG]) == [1]

    # ... and a user allowed to move it does, by hand.
    promoted = run(alice, "models", "promote", "2", "--name", MODEL, "--reason", "reviewed")
    assert promoted.returncode == 0, promoted.stderr[-3000:]
    assert admin.get_registered_model(MODEL).aliases[CHAMPION] == "2"
    assert json.loads(admin.get_registered_model(MODEL).tags[HISTORY_TAG]) == [1, 2]

    leaks = where_passwords_are(server, admin, root, outputs, [alice, bob], tmp_path / "downloaded")
    assert leaks == [], leaks


def where_passwords_are(
    server: Server, admin: Any, root: Path, outputs: list[str], users: list[User], scratch: Path
) -> list[str]:
    """Where any of the users' passwords appears: the commands' output, every file of the project (params.yaml,
    dvc.lock, .dvc/config, reports/, models/, logs, git's objects), the server's log, and what the server holds about
    the experiments, runs, logged models, registered models and versions, artifacts included."""
    import mlflow

    texts: dict[str, bytes] = {f"output {n}": text.encode() for n, text in enumerate(outputs)}
    texts |= {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    texts["server log"] = server.log.read_bytes()
    experiments = admin.search_experiments()
    for experiment in experiments:
        texts[f"experiment {experiment.name}"] = repr(experiment).encode()
        for run in admin.search_runs([experiment.experiment_id]):
            texts[f"run {run.info.run_id}"] = repr(run).encode()  # params, tags, metrics
            dst = str(scratch / run.info.run_id)
            got = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, dst_path=dst, tracking_uri=server.url)
            texts |= {str(p): p.read_bytes() for p in Path(got).rglob("*") if p.is_file()}
    for logged in admin.search_logged_models([e.experiment_id for e in experiments]):
        texts[f"logged model {logged.model_id}"] = repr(logged).encode() + repr(logged.params).encode()
    for model in admin.search_registered_models():
        texts[f"registered model {model.name}"] = repr(model).encode() + repr(model.tags).encode()
        for version in admin.search_model_versions(f"name='{model.name}'"):
            texts[f"{model.name} version {version.version}"] = repr(version).encode() + repr(version.tags).encode()
    assert any(p.endswith("card/card.md") for p in texts), sorted(texts)  # the runs' artifacts were read
    return [f"{user.name}'s password in {where}" for user in users for where, text in texts.items()
            if user.password.encode() in text]  # fmt: skip
