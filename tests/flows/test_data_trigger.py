"""Acceptance: retraining when data lands, on a real Prefect server.

`trainflow deploy` serves the pipeline with a trigger on the event `trainflow data add` emits. Adding one new file
starts exactly one flow run, which retrains and registers exactly one version; adding a byte-identical file (another
name, same bytes) emits nothing and starts nothing. A third, new file shows the identical one started nothing: the
server's events and runs are counted after it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.projects import FAST, make_project
from support.servers import BIN, prefect_server, spawn, stop, tail

from trainflow.core.paths import Paths
from trainflow.params import load_params
from trainflow.stages import STAGES, run_stage

pytestmark = pytest.mark.slow

DEPLOYMENT = "training_pipeline/nightly"


def table(path: Path, rows: range) -> Path:
    path.write_text("x1,x2,label\n" + "".join(f"{i},{i % 7 * 0.5},{'ab'[i % 7 > 3]}\n" for i in rows))
    return path


def post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def wait_for(what: str, check: Any, timeout_s: float, log: Path) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"no {what} after {timeout_s} s; log:\n{tail(log)}"
        time.sleep(1)
    return value


def test_a_new_file_retrains_once_and_a_byte_identical_one_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tasks.dvc import commit

    (tmp_path / "prefect-home").mkdir()
    with prefect_server(tmp_path / "prefect-home") as server:
        root = make_project(
            tmp_path / "proj",
            {"data.source": "data/raw/sales", "data.target": "label", "register.model_name": "sales", **FAST},
        )
        (root / "data/raw/sales").mkdir()
        table(root / "data/raw/sales/jan.csv", range(300))
        subprocess.run([str(BIN / "dvc"), "add", "-q", "data/raw/sales"], cwd=root, check=True)
        env = {**server.env(), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
        log = tmp_path / "serve.log"

        def trainflow(*args: str) -> str:
            proc = subprocess.run([str(BIN / "trainflow"), *args], cwd=root, env=env, capture_output=True, text=True)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            return proc.stdout + proc.stderr

        # Version 1, before anything is deployed: the pipeline as `trainflow run` runs it (each stage committed to
        # dvc.lock), in this process.
        monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
        monkeypatch.chdir(root)
        paths = Paths(root)
        for stage in STAGES:
            run_stage(stage, load_params(paths.params), paths)
            commit(root, stage)

        def versions() -> int:
            from mlflow import MlflowClient

            return len(MlflowClient(env["MLFLOW_TRACKING_URI"]).search_model_versions("name='sales'"))

        def runs() -> list[dict[str, Any]]:
            """The deployment's flow runs but those its cron scheduled ahead (`trainflow run` before it made one of no
            deployment)."""
            with urllib.request.urlopen(f"{server.url}/deployments/name/{DEPLOYMENT}", timeout=10) as response:
                deployment = json.load(response)["id"]
            found = post(f"{server.url}/flow_runs/filter", {"sort": "EXPECTED_START_TIME_ASC"})
            return [r for r in found if r["deployment_id"] == deployment and not r["auto_scheduled"]]

        def finished(n: int) -> list[dict[str, Any]] | None:
            done = [r for r in runs() if r["state_type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")]
            return done if len(done) >= n else None

        def events() -> list[str]:
            body = {"filter": {"event": {"name": ["trainflow.data.added"]}}, "limit": 50}
            return [e["payload"]["file"] for e in post(f"{server.url}/events/filter", body)["events"]]

        assert versions() == 1
        # Prefect's runner asks for runs to start every 10 s by default: each triggered run would wait up to that long.
        serve = spawn([str(BIN / "trainflow"), "deploy"], root, {**env, "PREFECT_RUNNER_POLL_FREQUENCY": "1"}, log)
        try:
            wait_for(
                "automation of the data trigger",
                lambda: post(f"{server.url}/automations/filter", {}) and serve.poll() is None,
                90,
                log,
            )
            [automation] = post(f"{server.url}/automations/filter", {})
            assert automation["trigger"]["expect"] == ["trainflow.data.added"]
            assert automation["trigger"]["match"] == {"prefect.resource.id": "trainflow.project.nightly"}

            out = trainflow("data", "add", str(table(tmp_path / "feb.csv", range(300, 360))))
            assert "added data/raw/sales/feb.csv (60 rows" in out and "event trainflow.data.added sent" in out
            [first] = wait_for("a triggered flow run that ended", lambda: finished(1), 300, log)
            assert first["state_type"] == "COMPLETED", tail(log)
            assert versions() == 2  # one retrain, one version

            same = shutil.copy(root / "data/raw/sales/feb.csv", tmp_path / "feb-resent.csv")
            assert "nothing added, no retrain" in trainflow("data", "add", str(same))

            trainflow("data", "add", str(table(tmp_path / "mar.csv", range(360, 400))))
            done = wait_for("a second triggered flow run that ended", lambda: finished(2), 300, log)
            assert [r["state_type"] for r in done] == ["COMPLETED", "COMPLETED"], tail(log)
            time.sleep(5)  # a run the identical file had started would exist by now (events are handled in order)
            assert len(runs()) == 2 and versions() == 3
            assert sorted(events()) == ["data/raw/sales/feb.csv", "data/raw/sales/mar.csv"]
            registration = json.loads((root / "reports/registration.json").read_text())
            assert registration["version"] == 3
        finally:
            stop(serve)
