"""The study (trainflow.tune.study): its objective, storage and trial seeds, the slots it opens and the params, data and
code it refuses, the set-up lock, the pruner, and how workers claim slots (the failpoints they pass included). The sweep
code is called in this process, so that mutation testing sees which function each test reached
(tests/stages/test_tune*.py run `trainflow tune` in subprocesses)."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState, create_trial
from support.sweeps import CURRENT

from trainflow.core.errors import ParamsError, UserError
from trainflow.params import load_params
from trainflow.tune import space
from trainflow.tune import study as study_
from trainflow.tune.study import CLAIMED, CREATOR, IDENTITY, SETTING_UP, SLOTS_READY, Study, claim, open_study, stale

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.mark.parametrize(
    ("overrides", "want"),
    [
        ([], ("val_loss", True)),
        (["train.monitor=val_accuracy"], ("val_accuracy", False)),
        (["tune.metric=val_accuracy"], ("val_accuracy", False)),
        (["tune.metric=val_ece"], ("val_ece", True)),
        (["train.monitor=val_accuracy", "tune.metric=val_loss"], ("val_loss", True)),
        (["train.mode=max"], ("val_loss", False)),  # the monitor's own direction, as train.mode says
        (["tune.direction=maximize"], ("val_loss", False)),
        (["train.monitor=val_accuracy", "tune.direction=minimize"], ("val_accuracy", True)),
    ],
)
def test_the_objective_is_the_monitor_in_its_direction_unless_tune_says_otherwise(
    params_file: Path, overrides: list[str], want: tuple[str, bool]
) -> None:
    assert study_.objective(load_params(params_file, overrides)) == want


def test_the_storage_is_a_journal_under_the_project_or_the_database_a_url_names(tmp_path: Path) -> None:
    from optuna.storages import JournalStorage, RDBStorage

    for spec, file in ((None, "models/tune/journal.log"), ("elsewhere/j.log", "elsewhere/j.log")):
        store = study_.storage(spec, tmp_path)
        assert isinstance(store, JournalStorage)
        optuna.create_study(study_name="s", storage=store)
        assert (tmp_path / file).stat().st_size > 0
    db = study_.storage(f"sqlite:///{tmp_path / 'optuna.db'}", tmp_path)
    assert isinstance(db, RDBStorage)
    optuna.create_study(study_name="s", storage=db)
    assert (tmp_path / "optuna.db").is_file()


def test_trial_seeds_are_fixed_numbers_of_the_seed_and_the_trial_number() -> None:
    # The first 4 bytes of sha256("42:0") and so on, big-endian (`echo -n 42:0 | sha256sum`).
    assert study_.trial_seed(42, 0) == 1416840650
    assert study_.trial_seed(42, 1) == 64878673
    assert study_.trial_seed(7, 0) == 4127154647


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_a_restarted_study_suggests_for_each_trial_what_the_uninterrupted_one_did(
    params_file: Path, tmp_path: Path, sampler: str
) -> None:
    """Trial 0 is the current params; each later trial is sampled from a seed of its own number, so a study opened
    afresh (a new process) for each trial suggests what one process running them all did."""
    p = load_params(params_file, [f"tune.sampler={sampler}"])

    def run_one(s: Study, value: float) -> dict[str, Any]:
        c = claim(s)
        assert c is not None
        values = space.suggest(c.trial, p.tune.space)
        s.study.tell(c.trial, value)
        c.release()
        return values

    one = open_study(p, tmp_path / "one", 3, "d", "c")
    uninterrupted = [run_one(one, v) for v in (1.0, 2.0, 3.0)]
    restarted = [run_one(open_study(p, tmp_path / "again", 3, "d", "c"), v) for v in (1.0, 2.0, 3.0)]
    assert restarted == uninterrupted
    assert uninterrupted[0] == {**CURRENT, "model.hidden_sizes": [256, 128]}
    assert uninterrupted[1] != uninterrupted[2] != uninterrupted[0]


def test_a_grid_study_visits_each_point_once_and_refuses_a_budget_beyond_the_grid(
    params_file: Path, tmp_path: Path
) -> None:
    """Each trial is claimed by a study opened afresh, as by a new worker process. (It once drew each trial's point
    from a grid shuffled with that trial's own seed: points repeated, others were never visited.)"""
    grid = (
        "{train.lr: {type: float, low: 0.001, high: 0.003, step: 0.001}, "
        "model.hidden_sizes: {type: categorical, choices: [[8], [16, 8]]}}"
    )
    p = load_params(params_file, ["tune.sampler=grid", f"tune.space={grid}"])
    with pytest.raises(ParamsError) as err:
        open_study(p, tmp_path, 7, "d", "c")
    assert err.value.problems == [("tune.trials", "7 trials exceed the grid's 6 points; set at most 6")]

    assert "fixed_params" not in open_study(p, tmp_path, 6, "d", "c").trials()[0].system_attrs  # no room for them
    seen = []
    for _ in range(6):
        s = open_study(p, tmp_path, 6, "d", "c")
        c = claim(s)
        assert c is not None
        v = space.suggest(c.trial, p.tune.space)
        seen.append((round(v["train.lr"], 6), tuple(v["model.hidden_sizes"])))
        s.study.tell(c.trial, 1.0)  # the last one: GridSampler stops the study, which is no error here
        c.release()
    assert sorted(seen) == sorted((lr, sizes) for lr in (0.001, 0.002, 0.003) for sizes in ((8,), (16, 8)))


def test_the_median_pruner_waits_for_five_finished_trials_and_none_never_prunes(params_file: Path) -> None:
    def prunes(kind: str, finished: int, value: float) -> bool:
        s = optuna.create_study(pruner=study_.pruner(load_params(params_file, [f"tune.pruner={kind}"]).tune))
        for _ in range(finished):
            s.add_trial(create_trial(value=0.5, intermediate_values={1: 0.5}))
        t = s.ask()
        t.report(value, 1)
        return t.should_prune()

    assert not prunes("median", 4, 0.9)  # four finished: too few to judge
    assert prunes("median", 5, 0.9)  # worse than the median of five
    assert not prunes("median", 5, 0.1)
    assert not prunes("none", 5, 0.9)
    hyperband = study_.pruner(load_params(params_file, ["tune.pruner=hyperband"]).tune)
    assert isinstance(hyperband, optuna.pruners.HyperbandPruner)


def test_open_study_makes_exactly_the_budget_of_slots_with_the_current_params_first(
    params_file: Path, tmp_path: Path
) -> None:
    p = load_params(params_file)
    created: list[optuna.Study] = []
    s = open_study(p, tmp_path, 3, "data-1", "code-1", on_create=created.append)
    assert [(t.number, t.state) for t in s.trials()] == [(n, TrialState.WAITING) for n in range(3)]
    assert [t.system_attrs.get("fixed_params") for t in s.trials()] == [CURRENT, None, None]
    attrs = s.study.user_attrs
    assert attrs[SLOTS_READY] is True
    assert (attrs[IDENTITY]["data"], attrs[IDENTITY]["code"], len(attrs[IDENTITY]["params"])) == (
        "data-1",
        "code-1",
        64,
    )
    assert str(attrs[CREATOR]).startswith(socket.gethostname() + ":")
    assert len(created) == 1 and created[0].study_name == "trainflow"
    assert not (tmp_path / "models/tune/trainflow" / SETTING_UP).exists()
    assert (s.name, s.budget, s.metric, s.minimize) == ("trainflow", 3, "val_loss", True)
    assert s.trial_dir(2) == tmp_path / "models/tune/trainflow/trial_0002" and s.directory == s.trial_dir(2).parent

    larger = open_study(p, tmp_path, 5, "data-1", "code-1", on_create=created.append)
    assert len(created) == 1  # set up once
    assert [t.number for t in larger.trials()] == [0, 1, 2, 3, 4]
    assert [t.system_attrs.get("fixed_params") for t in larger.trials()] == [CURRENT, None, None, None, None]
    smaller = open_study(p, tmp_path, 2, "data-1", "code-1")
    assert [t.number for t in smaller.trials()] == [0, 1] and len(smaller.study.trials) == 5
    smaller.study.tell(smaller.study.ask(), 1.0)  # trial 0 (WAITING slots go first)
    larger.study.tell(larger.study.ask(), 1.0)  # trial 1
    larger.study.tell(larger.study.ask(), 1.0)  # trial 2
    assert smaller.terminal() == 2 and larger.terminal() == 3

    outside = load_params(params_file, ["train.lr=0.05", "tune.study=other"])  # lr above the space's 0.01
    assert "fixed_params" not in open_study(outside, tmp_path, 1, "d", "c").trials()[0].system_attrs


def test_a_study_refuses_other_params_data_or_code_naming_which(params_file: Path, tmp_path: Path) -> None:
    p = load_params(params_file)
    open_study(p, tmp_path, 2, "d", "c")
    with pytest.raises(UserError, match=r"other params \(besides tune.trials, workers and storage\);.*trainflow-2"):
        open_study(load_params(params_file, ["train.epochs=9"]), tmp_path, 2, "d", "c")
    with pytest.raises(UserError, match=r"with other data \(data/splits\) and training code; its trials"):
        open_study(p, tmp_path, 2, "d2", "c2")
    with pytest.raises(UserError, match=r"with other training code; its trials"):
        open_study(p, tmp_path, 2, "d", "c2")
    # What a trial does not depend on may change: budget, workers, storage, backend, progress bars, the other stages.
    same = load_params(
        params_file,
        [
            "tune.trials=99",
            "tune.workers=7",
            "tune.storage=x.log",
            "tune.backend=ray",
            "train.progress=true",
            "tracking.experiment=e2",
            "register.model_name=m2",
            "evaluate.batch_size=3",
            "deploy.name=n2",
        ],
    )
    assert study_.identity(same, "d", "c") == study_.identity(p, "d", "c")
    for changed in ("tune.sampler=random", "tune.metric=val_accuracy", "train.epochs=9", "seed=1"):
        other = study_.identity(load_params(params_file, [changed]), "d", "c")
        assert other["params"] != study_.identity(p, "d", "c")["params"], changed


@pytest.mark.parametrize(
    ("marker", "creator", "finished"),
    [
        (True, None, True),  # killed right after create_study: its marker is here, it holds no lock
        (False, "{host}:4242:1700000000.00", True),  # a process of this machine, which holds no lock: dead
        (False, None, False),  # no marker, no creator: a process elsewhere may be just past create_study
        (False, "gpu-box-7:4242:1700000000.00", False),  # begun on another machine: not ours to finish
    ],
)
def test_a_study_begun_by_a_dead_process_of_this_machine_is_finished_at_once_and_one_of_another_is_not(
    params_file: Path, tmp_path: Path, marker: bool, creator: str | None, finished: bool
) -> None:
    p = load_params(params_file)
    begun = optuna.create_study(study_name="trainflow", storage=study_.storage(None, tmp_path))
    if creator is not None:
        begun.set_user_attr(CREATOR, creator.format(host=socket.gethostname()))
    if marker:
        (tmp_path / "models/tune/trainflow").mkdir(parents=True)
        (tmp_path / "models/tune/trainflow" / SETTING_UP).write_text('{"process": "x"}')
    if finished:
        s = open_study(p, tmp_path, 3, "d", "c", wait_s=0.0)
        assert [t.state for t in s.trials()] == [TrialState.WAITING] * 3
        assert s.study.user_attrs[IDENTITY]["code"] == "c"
    else:
        where = "on gpu-box-7 (gpu-box-7:4242:1700000000.00)" if creator else "on another machine"
        there = "on gpu-box-7" if creator else "where it was begun"
        why = re.escape(f"begun {where} and is still not set up after 0 s") + ".*" + re.escape(f"tune` {there} to")
        with pytest.raises(UserError, match=why):
            open_study(p, tmp_path, 3, "d", "c", wait_s=0.0)
        assert begun.trials == []  # nothing done to it


def test_a_study_whose_set_up_lock_is_held_too_long_names_the_process_holding_it(
    params_file: Path, tmp_path: Path
) -> None:
    from filelock import FileLock

    directory = tmp_path / "models/tune/trainflow"
    directory.mkdir(parents=True)
    (directory / SETTING_UP).write_text('{"process": "box:77:1.0"}')
    held = FileLock(directory / "setup.lock")
    held.acquire()
    try:
        with pytest.raises(UserError, match=r"setting it up for too long \(\{\"process\": \"box:77:1.0\"\}\), holding"):
            open_study(load_params(params_file), tmp_path, 2, "d", "c", wait_s=0.0)
    finally:
        held.release()


def test_claims_give_each_slot_once_and_a_stopped_workers_trial_to_the_next_one(
    params_file: Path, tmp_path: Path
) -> None:
    s = open_study(load_params(params_file), tmp_path, 3, "d", "c")
    claims = [claim(s) for _ in range(3)]
    assert [(c.trial.number, c.resumed) for c in claims if c] == [(0, False), (1, False), (2, False)]
    assert [t.state for t in s.trials()] == [TrialState.RUNNING] * 3
    record = json.loads((s.trial_dir(1) / CLAIMED).read_text())
    assert (record["host"], record["pid"]) == (socket.gethostname(), os.getpid())
    assert claim(s) is None and stale(s) == []  # every trial held by a live worker
    c0, c1, c2 = claims
    assert c0 and c1 and c2

    c1.release()  # its worker died: the trial is RUNNING, its lock free
    assert stale(s) == [1]
    again = claim(s)
    assert again is not None and (again.trial.number, again.resumed) == (1, True)
    assert again.directory == s.trial_dir(1)
    assert stale(s) == [] and claim(s) is None

    s.study.tell(c0.trial, 0.5)
    c0.release()
    (s.trial_dir(2) / CLAIMED).unlink()  # as if claimed on another machine: its checkpoints are not here
    c2.release()
    assert claim(s) is None and stale(s) == []
    again.release()


@pytest.mark.parametrize("then", ["running", "finished"])
def test_a_slot_another_worker_took_first_is_left_to_it(
    params_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    from filelock import FileLock

    s = open_study(load_params(params_file), tmp_path, 2, "d", "c")
    storage = s.study._storage
    transition = storage.set_trial_state_values
    raced: list[int] = []

    def racing(trial_id: int, state: TrialState, values: Any = None) -> bool:
        if not raced:  # a worker elsewhere wins trial 0 between our lock and our transition (and maybe ends it)
            raced.append(trial_id)
            transition(trial_id, state=TrialState.RUNNING)
            if then == "finished":
                transition(trial_id, state=TrialState.COMPLETE, values=[1.0])
        return transition(trial_id, state=state, values=values)

    monkeypatch.setattr(storage, "set_trial_state_values", racing)
    c = claim(s)
    assert c is not None and c.trial.number == 1
    assert not (s.trial_dir(0) / CLAIMED).exists()  # it ran elsewhere
    free = FileLock(s.trial_dir(0) / "owner.lock")
    free.acquire(timeout=0)  # the lock on trial 0 was given back
    free.release()
    c.release()


def test_describe_names_each_value_by_its_last_key() -> None:
    values = {
        "train.lr": 0.00064781,
        "model.dropout": 0.1,
        "model.hidden_sizes": [128],
        "model.activation": "relu",
        "train.epochs": 3,
        "train.layer_decay": None,
    }
    assert study_.describe(values) == (
        "lr=0.0006478, dropout=0.1, hidden_sizes=[128], activation=relu, epochs=3, layer_decay=null"
    )


def test_a_study_that_cannot_be_opened_says_exactly_why_and_what_to_do(params_file: Path, tmp_path: Path) -> None:
    import optuna
    from filelock import FileLock

    from trainflow.core.errors import ParamsError
    from trainflow.params import load_params
    from trainflow.tune import study as study_

    p = load_params(params_file)
    open_study(p, tmp_path, 2, "d", "c")
    with pytest.raises(UserError) as err:
        open_study(load_params(params_file, ["train.epochs=9"]), tmp_path, 2, "d2", "c2")
    assert str(err.value) == (
        "tune: study 'trainflow' was started with other params (besides tune.trials, workers and storage) and data "
        "(data/splits) and training code; its trials would not be comparable. Put them back as they were, or start a "
        "new study: -S tune.study=trainflow-2"
    )

    begun = optuna.create_study(study_name="elsewhere", storage=study_.storage(None, tmp_path))
    begun.set_user_attr(study_.CREATOR, "gpu-box-7:4242:1700000000.00")
    with pytest.raises(UserError) as err:
        open_study(load_params(params_file, ["tune.study=elsewhere"]), tmp_path, 2, "d", "c", wait_s=0.0)
    assert str(err.value) == (
        "tune: study 'elsewhere' was begun on gpu-box-7 (gpu-box-7:4242:1700000000.00) and is still not set up after "
        "0 s; that process is slow or dead. Rerun `trainflow tune` on gpu-box-7 to finish setting it up, or start a "
        "new study with -S tune.study=<new name>"
    )

    directory = tmp_path / "models/tune/held"
    directory.mkdir(parents=True)
    (directory / study_.SETTING_UP).write_text('{"process": "box:77:1.0"}')
    lock = FileLock(directory / "setup.lock")
    lock.acquire()
    try:
        with pytest.raises(UserError) as err:
            open_study(load_params(params_file, ["tune.study=held"]), tmp_path, 2, "d", "c", wait_s=0.0)
    finally:
        lock.release()
    assert str(err.value) == (
        "tune: study 'held': a process of this machine has been setting it up for too long "
        f'({{"process": "box:77:1.0"}}), holding {directory / "setup.lock"}; wait for it, or stop it and rerun'
    )

    grid = ["tune.sampler=grid", "tune.space={model.dropout: {type: float, low: 0.0, high: 0.2, step: 0.1}}"]
    with pytest.raises(ParamsError) as err:
        open_study(load_params(params_file, grid), tmp_path, 4, "d", "c")
    assert err.value.problems == [("tune.trials", "4 trials exceed the grid's 3 points; set at most 3")]


def test_claiming_a_slot_passes_the_failpoints_tune_claim_then_tune_claimed(
    params_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The crash tests kill a worker with TRAINFLOW_FAILPOINT=tune-claim:<n>: claiming slot 0 passes that point once
    its claimed.json marker is written and the slot is still WAITING, then tune-claimed once the slot is RUNNING."""
    s = open_study(load_params(params_file), tmp_path, 2, "d", "c")
    seen: list[tuple[str, bool, TrialState]] = []

    def failpoint(name: str) -> None:
        first = s.trials()[0]
        seen.append((name, (s.trial_dir(0) / CLAIMED).is_file(), first.state))

    monkeypatch.setattr(study_, "failpoint", failpoint)
    c = claim(s)
    assert c is not None and c.trial.number == 0
    try:
        assert seen == [("tune-claim", True, TrialState.WAITING), ("tune-claimed", True, TrialState.RUNNING)]
    finally:
        c.release()
