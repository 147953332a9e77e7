"""A team's sweep (issue 46): `trainflow tune` in two workspaces, as on two teammates' machines (B a git clone of A),
on one study in PostgreSQL (tune.storage: a database URL, committed in params.yaml) and one MLflow store.

A sets the study up; B's `trainflow tune` starts beside it and both claim trials; A is SIGKILLed in the middle of
one. The study's slots hold the budget: no trial is made beyond `tune.trials`, none runs twice, and B runs every slot
still WAITING. The trial A left RUNNING is A's to retry: its checkpoints, and the lock file and claim marker that tell
a dead worker's trial from a live one's (trainflow/tune/study.py, `claim`), are in A's models/tune/, which B cannot
see. So B, then and on a rerun, leaves it alone (saying it is still running in another worker), and the next
`trainflow tune` in A takes it over, once, from its checkpoint: the study ends with exactly `tune.trials` trials, all
COMPLETE, each with one MLflow run.

Needs PostgreSQL's server binaries and psycopg2 (tests/support/team.py skips, saying which, without them).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.projects import REPO, split_project
from support.sweeps import trials
from support.team import DATABASES, Postgres, postgres
from support.vcs import git

pytestmark = pytest.mark.slow

TRIALS = 4
SWEEP = {
    "data.source": "builtin:iris",
    "register.model_name": "iris",
    "train.epochs": 4,  # a checkpoint per epoch
    "train.batch_size": 16,
    "train.progress": "false",
    "tune.trials": TRIALS,
    "tune.workers": 1,  # the trials in the command's own process: one worker per workspace
    "tune.pruner": "none",  # every trial runs to its end: COMPLETE
}
# A is SIGKILLed at its 6th checkpoint write: the 2nd of its second trial (its first has ended by then), so that
# trial has a checkpoint to resume from.
KILL = "checkpoint_write:6"
DONE = re.compile(r"trial (\d+) complete: ")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    with postgres(tmp_path_factory.mktemp("postgres")) as running:
        yield running


def tune(root: Path, **env: str) -> subprocess.Popen[str]:
    # MLFLOW_TRACKING_URI: this test's store (tests/conftest.py), the team's, shared by both workspaces.
    full = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    cmd = [sys.executable, "-m", "trainflow", "tune"]
    return subprocess.Popen(cmd, cwd=root, env=full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def ended(proc: subprocess.Popen[str], timeout_s: float = 300) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


def load(url: str) -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name="trainflow", storage=url)


def states(url: str) -> dict[int, str]:
    return {t.number: t.state.name for t in load(url).trials}


def set_up(url: str, proc: subprocess.Popen[str], timeout_s: float = 120) -> None:
    """Wait until the study has its slots (trainflow.slots_ready), while `proc`, which sets it up, runs."""
    from trainflow.tune.study import SLOTS_READY

    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, f"trainflow tune exited {proc.returncode}:\n{proc.communicate()[1]}"
        try:
            if load(url).user_attrs.get(SLOTS_READY):
                return
        except KeyError:  # no such study yet
            pass
        assert time.monotonic() < deadline, f"the study was not set up in {timeout_s:g} s"
        time.sleep(0.2)


def test_two_workspaces_share_a_postgres_study_and_a_killed_trial_is_retried_once_in_its_own(
    db: Postgres, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    url = db.create_database(DATABASES[2])
    a = split_project(tmp_path / "a", {**SWEEP, "tune.storage": url})  # its splits made and committed to DVC
    shutil.copy2(REPO / ".gitignore", a / ".gitignore")  # not its MLflow database
    git(a, "add", "-A")
    git(a, "commit", "-qm", "splits, and the team's study storage")
    b = tmp_path / "b"
    git(tmp_path, "clone", "-q", str(a), str(b))  # no splits: B's `trainflow tune` makes them (ingest, split)

    # 1. A sets the study up, then B starts beside it (two workspaces of one host starting a study at the same
    # instant: the test below); A is killed in its second trial.
    first = tune(a, TRAINFLOW_FAILPOINT=KILL)
    set_up(url, first)
    second = tune(b)
    (rc_a, err_a), (rc_b, err_b) = ended(first), ended(second)
    assert rc_a == -9, err_a
    assert rc_b == 0, err_b
    got = states(url)
    assert sorted(got) == list(range(TRIALS)), got  # the budget's slots, none beyond
    [killed] = [n for n, state in got.items() if state == "RUNNING"]
    ran_a, ran_b = ({int(n) for n in DONE.findall(err)} for err in (err_a, err_b))
    assert ran_a and ran_b and not ran_a & ran_b, (ran_a, ran_b)  # both workspaces ran trials, none the same
    assert ran_a | ran_b | {killed} == set(range(TRIALS)), (ran_a, ran_b, killed)
    assert (a / f"models/tune/trainflow/trial_{killed:04d}/claimed.json").is_file()
    assert not (b / f"models/tune/trainflow/trial_{killed:04d}").exists()
    # B takes the dead worker's trial for a live one elsewhere: it cannot tell, and exits 0.
    assert "1 trial(s) are still running in another worker" in err_b

    # 2. A rerun in B does not retry it either.
    rc, err = ended(tune(b))
    assert rc == 0, err
    assert "taking over" not in err and "1 trial(s) are still running in another worker" in err
    assert states(url)[killed] == "RUNNING"

    # 3. A rerun in A takes it over, from its checkpoint, once.
    rc, err = ended(tune(a))
    assert rc == 0, err
    assert f"trial {killed}: taking over the trial of a stopped worker, from its last checkpoint" in err
    assert {int(n) for n in DONE.findall(err)} == {killed}
    study = load(url)
    assert [(t.number, t.state.name) for t in study.trials] == [(n, "COMPLETE") for n in range(TRIALS)]
    csv = trials(a).set_index("trial")
    assert csv["resumed_from_update"].notna().to_dict() == {n: n == killed for n in range(TRIALS)}
    assert csv.loc[killed, "resumed_from_update"] > 0  # from its checkpoint, not from scratch

    # MLflow: the study's run and one child run per trial (the resumed trial carried on its own).
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("trainflow").experiment_id])
    parents = [r for r in runs if r.data.tags.get("trainflow.tune.role") == "study"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(runs) == 1 + len(children)
    assert sorted(int(r.data.tags["trainflow.tune.trial"]) for r in children) == list(range(TRIALS))
    assert {r.info.status for r in runs} == {"FINISHED"}


def test_a_study_another_workspace_of_this_host_is_setting_up_is_waited_for(
    db: Postgres, tmp_path: Path, params_file: Path
) -> None:
    """In this process: a study in Postgres whose set-up a live process (this one) has begun from another workspace,
    as A's `trainflow tune` leaves it for a moment when B's opens it. B must wait for it, not set it up too."""
    import optuna

    from trainflow.core import processes
    from trainflow.core.errors import UserError
    from trainflow.params import load_params
    from trainflow.tune.study import CREATOR, open_study

    url = db.create_database("setup")
    params = load_params(params_file, [f"tune.storage={url}"])
    optuna.create_study(study_name="trainflow", storage=url).set_user_attr(CREATOR, processes.process_tag())
    with pytest.raises(UserError, match="still not set up"):
        open_study(params, tmp_path / "b", TRIALS, "data", "code", wait_s=1.0)
