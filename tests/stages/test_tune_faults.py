"""`trainflow tune` under faults: a trial whose values fail in the train stage's `setup` fails alone; a sweep SIGKILLed
anywhere in setting up its study, claiming a trial or starting a trial's MLflow run is finished by the next
`trainflow tune` at once, as the uninterrupted sweep would have been, with one MLflow run per trial and one for the
study; MLflow's "no such run" is the only answer taken to mean that a run is absent."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from support.projects import split_project
from support.sweeps import trials

from trainflow.core.errors import ServiceError, UserError
from trainflow.tune import runs as tune_runs

SWEEP = {
    "data.source": "builtin:iris",
    "register.model_name": "iris",
    "train.epochs": 2,
    "train.batch_size": 16,
    "train.progress": "false",
    "tune.trials": 3,
    "tune.workers": 1,
}
COLUMNS = ["trial", "state", "val_loss", "last_update", "train.lr", "model.dropout", "model.hidden_sizes"]


def tune(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}", "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(
        [sys.executable, "-m", "trainflow", "tune", *args], cwd=root, env=full, capture_output=True, text=True
    )


def runs(root: Path) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("trainflow")
    return [] if experiment is None else client.search_runs([experiment.experiment_id])


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project with its splits made and committed and its MLflow database created, for each test to copy."""
    return split_project(tmp_path_factory.mktemp("prepared") / "proj", SWEEP)


def copy(prepared: Path, dest: Path) -> Path:
    shutil.copytree(prepared, dest)
    return dest


@pytest.fixture(scope="module")
def uninterrupted(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    root = copy(prepared, tmp_path_factory.mktemp("uninterrupted") / "proj")
    done = tune(root)
    assert done.returncode == 0, done.stderr
    return trials(root)


@pytest.mark.slow  # 19 s: README line 2 stays under 10 minutes (CI runs the slow tier after it)
def test_trials_whose_values_fail_in_setup_fail_with_their_message_and_the_sweep_goes_on(
    prepared: Path, tmp_path: Path
) -> None:
    """An mlp has no numbered layers, so any layer_decay fails in `setup` (plan_groups), and 1e-4 MiB holds no sample
    for batch_size auto: each trial sampling one of them fails, the others train, and nothing is left to a rerun."""
    root = copy(prepared, tmp_path / "proj")
    space = (
        "tune.space={train.layer_decay: {type: categorical, choices: [null, 0.8]}, "
        "train.memory_budget_mb: {type: categorical, choices: [null, 0.0001]}}"
    )
    sweep = ["-S", space, "-S", "train.batch_size=auto", "-S", "train.global_batch=16", "-S", "tune.sampler=random"]
    done = tune(root, *sweep, "--trials", "5")
    assert done.returncode == 0, done.stderr

    got = trials(root).set_index("trial")
    assert list(got.index) == list(range(5))
    decays, budgets = got["train.layer_decay"].notna(), got["train.memory_budget_mb"].notna()
    assert set(got.loc[decays | budgets, "state"]) == {"failed"}
    assert set(got.loc[~decays & ~budgets, "state"]) == {"complete"}
    assert 0 < (decays | budgets).sum() < 5  # both kinds of trial ran
    for n, row in got[decays | budgets].iterrows():
        named_decay = "train.layer_decay: MLP has no numbered layers" in row["error"]
        named_budget = "train.memory_budget_mb: 0.0001 MiB is too little for batch_size auto" in row["error"]
        assert (named_decay and decays[n]) or (named_budget and budgets[n]), row["error"]
        assert f"trial {n} failed: {row['error']}" in done.stderr
    assert got.loc[~decays & ~budgets, "error"].isna().all()

    children = {int(r.data.tags["trainflow.tune.trial"]): r for r in runs(root) if "mlflow.parentRunId" in r.data.tags}
    assert sorted(children) == list(range(5))
    for n, row in got.iterrows():
        run = children[n]
        assert run.info.run_id == row["mlflow_run_id"]
        assert run.data.tags["trainflow.tune.state"] == row["state"]
        assert run.info.status == ("FAILED" if row["state"] == "failed" else "FINISHED")
        if row["state"] == "failed":
            assert run.data.tags["trainflow.tune.error"] == row["error"]

    rerun = tune(root, *sweep, "--trials", "5")
    assert rerun.returncode == 0, rerun.stderr
    assert "5/5 trials ended" in rerun.stderr


# Where `trainflow tune` is SIGKILLed (trainflow.core.io.failpoint: the n-th time the process passes the point), run
# after run on one project: each run is killed at a later point than the one before, so it got past that one.
SETTING_UP = [
    "tune-created:1",  # the study exists in the journal; nothing else does
    "tune-parent:1",  # the study's MLflow run is started; the study does not hold its id
    "tune-slot:2",  # two of the three slots exist
]
CLAIMING = [
    "tune-claim:2",  # trial 0 ended; trial 1's directory says it is claimed, the journal still has it WAITING
    "tune-claimed:1",  # trial 1 is RUNNING, nothing of it has run
    "tune-run-start:1",  # trial 1 (taken over) has its MLflow run started; the trial does not hold the run's id
]


@pytest.mark.slow  # about a minute for the two: README line 2 stays under 10 minutes
@pytest.mark.parametrize("kills", [SETTING_UP, CLAIMING], ids=["setting-up", "claiming"])
def test_a_sweep_killed_while_it_sets_up_or_claims_is_finished_by_the_next_one(
    prepared: Path, uninterrupted: pd.DataFrame, tmp_path: Path, kills: list[str]
) -> None:
    root = copy(prepared, tmp_path / "proj")
    for where in [*kills, None]:
        start = time.monotonic()
        ran = tune(root, **({"TRAINFLOW_FAILPOINT": where} if where else {}))
        seconds = time.monotonic() - start
        assert ran.returncode == (-9 if where else 0), f"{where}: {ran.stderr}"
        assert seconds < 60, f"{where}: {seconds:.0f} s"  # each run finished the set-up at once, not after a wait

    # The budget exactly, no number twice, and the same trials as the uninterrupted sweep (same params, same values).
    got = trials(root)
    pd.testing.assert_frame_equal(got[COLUMNS], uninterrupted[COLUMNS])
    # MLflow: one run for the study and one per trial, each child of it, and none left RUNNING.
    all_runs = runs(root)
    parents = [r for r in all_runs if r.data.tags.get("trainflow.tune.role") == "study"]
    children = [r for r in all_runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(all_runs) == 1 + len(children)
    assert sorted(int(r.data.tags["trainflow.tune.trial"]) for r in children) == list(got["trial"])
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    assert sorted(r.info.run_id for r in children) == sorted(got["mlflow_run_id"])
    assert {r.info.status for r in all_runs} == {"FINISHED"}


# --- set-up and lookups, in this process -----------------------------------------------------------------------------


def begun(root: Path, creator: str) -> None:
    """A study in root's journal as its creator leaves it when it dies right after recording itself as CREATOR."""
    import optuna

    from trainflow.tune.study import CREATOR, storage

    optuna.create_study(study_name="trainflow", storage=storage(None, root)).set_user_attr(CREATOR, creator)


def test_a_study_begun_on_another_machine_is_waited_for_then_refused_naming_that_machine(
    params_file: Path, tmp_path: Path
) -> None:
    from trainflow.params import load_params
    from trainflow.tune.study import open_study

    params = load_params(params_file)
    begun(tmp_path / "a", "gpu-box-7:4242:1700000000.00")
    start = time.monotonic()
    with pytest.raises(UserError, match=r"begun on gpu-box-7 .*Rerun `trainflow tune` on gpu-box-7 to finish"):
        open_study(params, tmp_path / "a", 3, "data", "code", wait_s=1.0)
    assert 1.0 <= time.monotonic() - start < 10
    # Begun by a process of this machine (which holds no lock, so it is gone): finished at once.
    begun(tmp_path / "b", f"{socket.gethostname()}:4242:1700000000.00")
    opened = open_study(params, tmp_path / "b", 3, "data", "code", wait_s=0.0)
    assert [(t.number, t.state.name) for t in opened.trials()] == [(0, "WAITING"), (1, "WAITING"), (2, "WAITING")]
    assert opened.study.user_attrs["trainflow.identity"]["data"] == "data"


def test_a_run_lookup_takes_only_mlflows_no_for_absent(
    params_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, TEMPORARILY_UNAVAILABLE
    from mlflow.tracking import MlflowClient

    from trainflow.params import load_params
    from trainflow.tune import runs

    monkeypatch.setattr(runs, "RETRY_DELAYS_S", (0.0, 0.0))
    params = load_params(params_file)
    assert runs.find(tmp_path, "trainflow", "k1") is None  # MLflow answered: no such experiment
    made = tune_runs.start_parent(params, tmp_path, "k1")
    assert made is not None
    assert runs.find(tmp_path, "trainflow", "k1") == made
    assert runs.find(tmp_path, "trainflow", "k2") is None  # MLflow answered: no run has that key

    calls = []

    def down(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        raise MlflowException("database is locked", error_code=TEMPORARILY_UNAVAILABLE)

    with monkeypatch.context() as m:
        m.setattr(MlflowClient, "search_runs", down)
        with pytest.raises(ServiceError, match="did not answer whether the run with trainflow.tune.run_key=k1"):
            runs.find(tmp_path, "trainflow", "k1")
        assert len(calls) == 3  # retried, then raised: never taken for "absent"

        class Study:  # a study whose set-up was killed after its run's key was recorded
            user_attrs = {"trainflow.mlflow_parent_run_key": "k1"}

            def set_user_attr(self, key: str, value: Any) -> None:
                raise AssertionError(f"nothing is decided without MLflow's answer ({key}={value})")

        with pytest.raises(ServiceError):
            tune_runs.parent_run(params, tmp_path)(Study())
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("trainflow")
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [made]  # no second run

    def gone(*args: Any, **kwargs: Any) -> Any:
        raise MlflowException("no such experiment", error_code=RESOURCE_DOES_NOT_EXIST)

    monkeypatch.setattr(MlflowClient, "search_runs", gone)
    assert runs.find(tmp_path, "trainflow", "k1") is None  # "not found" is MLflow's answer
