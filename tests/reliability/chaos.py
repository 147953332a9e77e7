"""Kill `trainflow run` anywhere, rerun it, and check that nothing is lost and nothing is wrong (issue 16).

One round: change a param (`-S`, so real work happens), start `trainflow run`, SIGKILL it somewhere — at a random
moment, or at a named point (inside a stage, between a stage and its DVC commit, during the DVC commit, the push or
the registry write) after a random delay — then rerun the same command to completion and check every invariant
(`check`). tests/reliability/test_kill_anywhere.py runs a few rounds; bench/soak.py runs many (default 50).

The project is the repo's pipeline on the built-in iris data, trained briefly, with the default DVC remote; runs go
through one Prefect server (tests/support/servers.py), as scheduled runs do.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
GIT = ["git", "-c", "user.name=chaos", "-c", "user.email=chaos@trainflow.invalid"]

# Where a run is killed: a failpoint (trainflow.core.io.failpoint) with an occurrence, and a delay after it, or None for
# "after a random time". Each names the part of the run it interrupts.
# {update} is an update of the run (it trains ~24), {epoch} an epoch end (a checkpoint), {delay} up to 0.3 s.
POINTS: dict[str, str | None] = {
    "anywhere (random time)": None,
    "ingest, before its output is renamed into place": "rename-processed:1",
    "split, before its output is renamed into place": "rename-splits:1",
    "train, after an update": "update:{update}",
    "train, while writing a checkpoint": "checkpoint_write:{epoch}",
    "train, before the model is renamed into place": "rename-final:1",
    "between split and its DVC commit": "commit-split:1",
    "between train and its DVC commit": "commit-train:1",
    "during train's DVC commit": "commit-train:1@{delay}",
    "before a new dvc.lock is renamed into place": "rename-dvc.lock:{stage}",
    "evaluate, before metrics.json is renamed into place": "rename-metrics.json:1",
    "during evaluate's DVC commit": "commit-evaluate:1@{delay}",
    "at the registry write": "register:1",
    "during the registry write": "register:1@{delay}",
    "register, before registration.json is renamed into place": "rename-registration.json:1",
    "between register and its DVC commit": "commit-register:1",
    "during the DVC push": "push:1@{delay}",
}

# Param changes a round picks from (always a value other than the current one): each makes train, evaluate and
# register run again; `split.seed` also makes a new split and `data.duplicates` a new ingest (iris holds a duplicate
# row), so the test set changes and the champion is re-scored on it. (The top-level seed trains: it moves no row.)
CHANGES: dict[str, list[str]] = {
    "train.lr": ["0.001", "0.002", "0.004", "0.008"],
    "train.epochs": ["3", "4", "5", "6"],
    "model.dropout": ["0.0", "0.1", "0.2"],
    "split.seed": ["0", "1", "2", "3"],
    "data.duplicates": ["keep", "drop"],
}


@dataclass
class Workspace:
    root: Path
    env: dict[str, str]
    run_s: float = 30.0  # how long a run that trains takes here (measured by `workspace`)
    first_log: str = ""  # what the first run printed (stderr)

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, cwd=self.root, env=self.env, capture_output=True, text=True, timeout=timeout)

    def trainflow(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(BIN / "trainflow"), *args)

    def dvc(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(BIN / "dvc"), *args)


@dataclass
class Round:
    number: int
    change: list[str]
    point: str
    spec: str | None  # the failpoint, or None for a kill after `after_s`
    after_s: float | None
    killed: bool = False  # whether the run died of the kill (it may have finished first)
    killed_in: str = ""  # the last "[trainflow] <stage>: running" line the killed run printed
    rerun_s: float = 0.0
    violations: list[str] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        return {
            "round": self.number,
            "change": " ".join(self.change),
            "kill": self.point + (f" ({self.spec})" if self.spec else f" ({self.after_s:.1f} s)"),
            "killed": self.killed,
            "killed in": self.killed_in or "-",
            "rerun s": round(self.rerun_s, 1),
            "violations": len(self.violations),
        }


def workspace(
    dest: Path, make_project: Any, prefect_env: dict[str, str], params: dict[str, Any] | None = None
) -> Workspace:
    """The repo's pipeline on iris in `dest`, with its DVC remote, one MLflow store and the given Prefect setup;
    `params`: more overrides (data.memory_budget_mb tiny: every stage after ingest streams)."""
    root = make_project(
        dest / "proj",
        {"data.source": "builtin:iris", "register.model_name": "iris", "train.epochs": 4, "train.batch_size": 16,
         "train.progress": "false",
         # the point rule: registry_consistent's invariant is its outcome (the best accuracy holds the alias); the
         # paired rule's evidence is tested in tests/stages/test_registry.py, its crash-safety is the same code's
         "register.decide": "point", **(params or {})},
    )  # fmt: skip
    env = {
        **os.environ,
        **prefect_env,
        "MLFLOW_TRACKING_URI": f"sqlite:///{dest / 'mlflow.db'}",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("TRAINFLOW_FAILPOINT", None)
    env.pop("TRAINFLOW_WORKSPACE", None)
    ws = Workspace(root, env)
    start = time.monotonic()
    first = ws.trainflow("run")
    if first.returncode != 0:
        raise RuntimeError(f"the first run failed:\n{first.stdout[-3000:]}{first.stderr[-3000:]}")
    ws.run_s = time.monotonic() - start
    ws.first_log = first.stderr
    return ws


def plan(number: int, rng: random.Random, ws: Workspace) -> Round:
    """A random round: one or two param changes and a kill point with its occurrence and delay."""
    import yaml

    params = yaml.safe_load((ws.root / "params.yaml").read_text())
    change = []
    for key in rng.sample(sorted(CHANGES), rng.choice([1, 2])):
        section, _, name = key.rpartition(".")
        now = str((params[section] if section else params)[name])
        change.append(f"{key}={rng.choice([v for v in CHANGES[key] if v != now])}")
    # Only points the run reaches: ingest runs again on a data change, split also on a split.seed change.
    rerun = ["train", "evaluate", "register"]
    if any(c.startswith(("split.", "data.")) for c in change):
        rerun.insert(0, "split")
    if any(c.startswith("data.") for c in change):
        rerun.insert(0, "ingest")
    stage_of = {"processed": "ingest", "splits": "split", "commit-split": "split"}
    reachable = [
        p
        for p, t in POINTS.items()
        if t is None or stage_of.get(t.split(":")[0].removeprefix("rename-"), "train") in rerun
    ]
    point = rng.choice(sorted(reachable))
    template = POINTS[point]
    if template is None:
        return Round(number, change, point, None, rng.uniform(0.3, ws.run_s))
    delay = round(rng.uniform(0.0, 0.3), 3)
    spec = template.format(
        update=rng.randint(1, 20), epoch=rng.randint(1, 3), delay=delay, stage=rng.randint(1, len(rerun))
    )
    return Round(number, change, point, spec, None)


def play(ws: Workspace, r: Round) -> Round:
    """Run the round: the killed run, then the same command to completion, then every check."""
    args = [str(BIN / "trainflow"), "run", *[a for c in r.change for a in ("-S", c)]]
    env = dict(ws.env)
    if r.spec:
        env["TRAINFLOW_FAILPOINT"] = r.spec
    proc = subprocess.Popen(
        args, cwd=ws.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    if r.after_s is not None:
        try:
            out, _ = proc.communicate(timeout=r.after_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the machine goes away: the run and every child of it
            out, _ = proc.communicate()
    else:
        out, _ = proc.communicate(timeout=600)
    r.killed = proc.returncode == -signal.SIGKILL
    stages = [line.split()[1].rstrip(":") for line in out.splitlines() if line.endswith(": running")]
    r.killed_in = (stages[-1] if stages else "before any stage") if r.killed else ""
    if not r.killed and proc.returncode != 0:
        r.violations.append(f"the run to be killed failed by itself (exit {proc.returncode}):\n{out[-3000:]}")
    start = time.monotonic()
    rerun = ws.run(*args)
    r.rerun_s = time.monotonic() - start
    if rerun.returncode != 0:
        output = rerun.stdout[-3000:] + rerun.stderr[-3000:]
        r.violations.append(f"the rerun failed (exit {rerun.returncode}):\n{output}")
        return r
    r.violations += check(ws)
    return r


# --- invariants ----------------------------------------------------------------------------------------------------


def check(ws: Workspace) -> list[str]:
    """Every invariant of a workspace after a completed run; returns what does not hold (empty: all hold)."""
    problems: list[str] = []
    for name, test in INVARIANTS.items():
        try:
            problems += [f"{name}: {p}" for p in test(ws)]
        except Exception as exc:  # noqa: BLE001 - a check that crashes is a violation, reported with why
            problems.append(f"{name}: {type(exc).__name__}: {exc}")
    return problems


def dvc_status_clean(ws: Workspace) -> list[str]:
    status = ws.dvc("status")
    return [] if "up to date" in status.stdout else [status.stdout + status.stderr]


def dvc_repro_noop(ws: Workspace) -> list[str]:
    repro = ws.dvc("repro")
    return [repro.stdout + repro.stderr] if repro.returncode != 0 or "Running stage" in repro.stdout else []


def outputs_load(ws: Workspace) -> list[str]:
    """Every output reads, and the reports describe the model on disk: its test accuracy, computed here from its own
    predictions, is the one metrics.json holds."""
    import pandas as pd

    from trainflow.artifacts.predict import ExportedModel

    root = ws.root
    for table in [*(root / "data/processed").glob("*.parquet"), *(root / "data/splits").glob("*.parquet")]:
        pd.read_parquet(table)
    reports = {name: json.loads((root / "reports" / name).read_text()) for name in
               ("metrics.json", "train_run.json", "registration.json")}  # fmt: skip
    model = ExportedModel.load(root / "models/final")
    test = read_test(root)
    predicted = model.predict_frame(test)["prediction"].astype(str)
    target = json.loads((root / "data/splits/schema.json").read_text())["target"]
    accuracy = float((predicted.to_numpy() == test[target].astype(str).to_numpy()).mean())
    problems = []
    if abs(accuracy - reports["metrics.json"]["accuracy"]) > 1e-12:
        said = reports["metrics.json"]["accuracy"]
        problems.append(f"models/final scores {accuracy} on the test split, metrics.json says {said}")
    from trainflow.tracking import model_hash

    # The version registration.json names holds models/final: registered from train_run.json's run, or, when that run
    # exported byte for byte an earlier run's model, from that run (register adds no second version of one model).
    registered = reports["registration.json"]["tags"]
    if registered["model_sha256"] != model_hash(root / "models/final"):
        problems.append("registration.json names a version of another model than models/final")
    elif (
        registered["mlflow_run_id"] != reports["train_run.json"]["run_id"]
        and "no new version" not in (reports["registration.json"]["decision"])
    ):
        problems.append("registration.json registered another run than train_run.json names")
    return problems


def checkpoints_load(ws: Workspace) -> list[str]:
    from trainflow.engine.checkpoint import CheckpointStore, load_checkpoint

    store = CheckpointStore(ws.root / "models/checkpoints", keep_last=2)
    problems = [] if store.steps() else ["no checkpoint"]
    for step in store.steps():
        load_checkpoint(step)
    return problems


def no_leftovers(ws: Workspace) -> list[str]:
    """No temp file or directory of an interrupted write is left among the outputs (DVC would hash them)."""
    left = [p for top in ("data", "models", "reports") for p in (ws.root / top).rglob(".*.tmp")]
    left += list((ws.root / "models").glob(".*.old.*"))
    return [f"left behind: {', '.join(str(p.relative_to(ws.root)) for p in left)}"] if left else []


def registry_consistent(ws: Workspace) -> list[str]:
    """Each alias points at an existing version, one version per run, each version's decision recorded, and the
    champion is the best by the gate (accuracy) among the versions scored on the current test split."""
    from mlflow.tracking import MlflowClient

    from trainflow.core.io import sha256_files

    client = MlflowClient(ws.env["MLFLOW_TRACKING_URI"])
    model = client.get_registered_model("iris")
    versions = {int(v.version): v for v in client.search_model_versions("name='iris'")}
    problems = [f"alias {a} -> missing version {v}" for a, v in model.aliases.items() if int(v) not in versions]
    runs = [v.run_id for v in versions.values()]
    if len(set(runs)) != len(runs):
        problems.append(f"a run registered more than one version: {sorted(runs)}")
    problems += [f"version {n}: no decision recorded" for n, v in versions.items() if "registry_decision" not in v.tags]
    champion = versions.get(int(model.aliases.get("champion", -1)))
    if champion is None:
        return [*problems, "no champion"]
    test_hash = sha256_files(test_files(ws.root))
    comparable = {
        n: float(v.tags["metric.accuracy"]) for n, v in versions.items() if v.tags.get("test_data_hash") == test_hash
    }
    if champion.tags.get("test_data_hash") == test_hash:
        best = float(champion.tags["metric.accuracy"])
    else:  # the champion was registered on another split: score it on this one, independently of register
        best = rescored_accuracy(ws, f"models:/iris/{champion.version}")
    better = {n: a for n, a in comparable.items() if a > best}
    if better:
        problems.append(f"champion version {champion.version} ({best}) is beaten by {better} on this test split")
    return problems


def rescored_accuracy(ws: Workspace, uri: str) -> float:
    import mlflow

    mlflow.set_tracking_uri(ws.env["MLFLOW_TRACKING_URI"])
    test = read_test(ws.root)
    target = json.loads((ws.root / "data/splits/schema.json").read_text())["target"]
    predicted = mlflow.pyfunc.load_model(uri).predict(test.drop(columns=[target]))["prediction"].astype(str)
    return float((predicted.to_numpy() == test[target].astype(str).to_numpy()).mean())


def nothing_left_running(ws: Workspace) -> list[str]:
    """No Prefect flow run and no MLflow run of the workspace is still "running" once the rerun has ended: a killed
    run's were ended by the rerun (flows/orphans.py, tracking.end_orphans)."""
    from mlflow.tracking import MlflowClient
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType

    from flows.orphans import WORKSPACE_PREFIX
    from trainflow.core.processes import workspace_tag

    problems = []
    with SyncPrefectClient(ws.env["PREFECT_API_URL"]) as client:
        states = FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING]))
        for run in client.read_flow_runs(flow_run_filter=FlowRunFilter(state=states)):
            if WORKSPACE_PREFIX + workspace_tag(ws.root) in run.tags or not run.tags:
                problems.append(f"Prefect flow run {run.name!r} is still {run.state_name}")
    mlflow = MlflowClient(ws.env["MLFLOW_TRACKING_URI"])
    experiment = mlflow.get_experiment_by_name("trainflow")
    for run in mlflow.search_runs([experiment.experiment_id], filter_string="attributes.status = 'RUNNING'"):
        problems.append(f"MLflow run {run.info.run_id} ({run.info.run_name}) is still RUNNING")
    return problems


def cache_pushes_and_pulls(ws: Workspace) -> list[str]:
    """`dvc push`, then a fresh clone's `dvc pull` gives every output byte for byte."""
    push = ws.dvc("push")
    if push.returncode != 0:
        return [f"dvc push failed: {push.stderr[-2000:]}"]
    for cmd in (["add", "-A", "params.yaml", "dvc.lock"], ["commit", "-qm", "round", "--allow-empty"]):
        subprocess.run([*GIT, *cmd], cwd=ws.root, check=True, capture_output=True)
    clone = ws.root.parent / "clone"
    subprocess.run(["rm", "-rf", str(clone)], check=True)
    subprocess.run(["git", "clone", "-q", str(ws.root), str(clone)], check=True)
    subprocess.run([str(BIN / "dvc"), "remote", "add", "--local", "-d", "-f", "origin", str(ws.root / "dvc-remote")],
                   cwd=clone, check=True, capture_output=True)  # fmt: skip
    pull = subprocess.run([str(BIN / "dvc"), "pull"], cwd=clone, capture_output=True, text=True)
    if pull.returncode != 0:
        return [f"dvc pull in a fresh clone failed: {pull.stdout[-2000:]}{pull.stderr[-2000:]}"]
    outs = [o["path"] for s in _lock(ws.root)["stages"].values() for o in s.get("outs", [])]
    different = [out for out in outs if _files(ws.root / out) != _files(clone / out)]
    subprocess.run(["rm", "-rf", str(clone)], check=True)
    return [f"{out} differs in a fresh clone after dvc pull" for out in different]


def _lock(root: Path) -> dict[str, Any]:
    import yaml

    return dict(yaml.safe_load((root / "dvc.lock").read_text()))


def _files(top: Path) -> dict[str, bytes]:
    if top.is_file():
        return {"": top.read_bytes()}
    return {str(p.relative_to(top)): p.read_bytes() for p in sorted(top.rglob("*")) if p.is_file()}


INVARIANTS = {
    "dvc status clean": dvc_status_clean,
    "dvc repro a no-op": dvc_repro_noop,
    "outputs load and agree": outputs_load,
    "checkpoints load": checkpoints_load,
    "no half-written leftovers": no_leftovers,
    "registry consistent": registry_consistent,
    "nothing left running": nothing_left_running,
    "DVC cache pushes and pulls": cache_pushes_and_pulls,
}


def test_files(root: Path) -> list[Path]:
    """The files that hold the test split: its own, or (streamed) the linked table and each row's split."""
    own = root / "data/splits/test.parquet"
    return [own] if own.is_file() else [root / "data/splits/table.parquet", root / "data/splits/rows.npy"]


def read_test(root: Path) -> Any:
    """The test split, read without trainflow: its file, or the rows of the linked table that rows.npy marks 2."""
    import numpy as np
    import pandas as pd

    files = test_files(root)
    if len(files) == 1:
        return pd.read_parquet(files[0])
    whole = pd.read_parquet(files[0]).drop(columns=["__row_key__"])
    return whole[np.load(files[1]) == 2].reset_index(drop=True)
