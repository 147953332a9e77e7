"""The study: its storage, sampler and pruner, its fixed budget of trial slots, and how a worker claims a trial.

Optuna's own bookkeeping is what users of it complain about (a killed trial stays RUNNING and is rerun from scratch
as a new trial; `n_trials` counts per process; a restarted sampler suggests other params). Here:

- **Slots.** The study holds exactly `trials` trials with numbers 0..trials-1, created up front as WAITING trials by
  the process that creates the study (and topped up when a rerun raises the budget). A worker never creates a trial;
  it claims a WAITING one with the storage's atomic WAITING -> RUNNING transition (the same one Optuna uses for its
  queue). So the budget holds across restarts, workers and machines, and no number is run twice.
- **Set-up.** Creating a study takes several writes (the study, its identity, its MLflow run, its slots), each done
  only if it was not done before. The process doing them holds a lock file in models/tune/<study>/ and leaves a marker
  there until the slots are ready: an opener that finds a study not set up, begun by a process of this machine that no
  longer holds the lock, knows that process died and finishes the set-up itself (`open_study`).
- **Claims.** A worker holds a lock file in the trial's directory for as long as it runs the trial, and takes the
  lock *before* the storage transition. A RUNNING trial whose lock is free and whose directory says it was claimed
  here belongs to a dead worker: the next worker takes it over and resumes it from its own last checkpoint.
- **Seeds.** Trial n is sampled by a sampler seeded with a hash of (seed, n), so what it suggests depends only on the
  trials before it, never on how many processes came and went.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainflow.core import processes
from trainflow.core.errors import ParamsError, UserError
from trainflow.core.io import failpoint, write_json
from trainflow.params import MINIMIZED, PipelineParams, TuneParams
from trainflow.tune import space as space_

if TYPE_CHECKING:
    import optuna
    from filelock import BaseFileLock

    from trainflow.core.paths import Paths

DEFAULT_JOURNAL = "models/tune/journal.log"
SLOTS_READY = "trainflow.slots_ready"  # study user attr: the creator has made the first `trials` slots
CREATOR = (
    "trainflow.creator"  # study user attr: the process setting the study up (trainflow.core.processes.process_tag)
)
IDENTITY = "trainflow.identity"  # study user attr: what every trial of the study shares (params, data, code)
PARENT_RUN = "trainflow.mlflow_parent_run_id"
PARENT_KEY = "trainflow.mlflow_parent_run_key"  # recorded before the parent run starts (trainflow.tune.runs)
OVERRIDES = "trainflow.overrides"  # study user attr: the -S of the command that started it (trainflow.tune.recorded)


def objective(params: PipelineParams) -> tuple[str, bool]:
    """(metric, minimize) of the study: tune.metric (auto = train.monitor) and its direction."""
    t = params.tune
    metric = params.train.monitor if t.metric == "auto" else t.metric
    if t.direction != "auto":
        return metric, t.direction == "minimize"
    if metric == params.train.monitor:
        return metric, params.train.minimize
    return metric, metric in MINIMIZED


def storage(spec: str | None, root: Path) -> optuna.storages.BaseStorage:
    """A journal file (the default: safe for parallel local workers, per Optuna's FAQ) or a database URL."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    if spec is not None and "://" in spec:
        return optuna.storages.RDBStorage(spec, heartbeat_interval=None)
    path = root / (spec or DEFAULT_JOURNAL)
    path.parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(path)))


def trial_seed(seed: int, number: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{number}".encode()).digest()[:4], "big")


def _per_trial_sampler() -> type:
    from optuna.samplers import BaseSampler

    class PerTrialSeed(BaseSampler):
        """Delegates to a sampler made afresh for each trial with the seed trial_seed(seed, number)."""

        def __init__(self, make: Callable[[int], BaseSampler], seed: int) -> None:
            self._make, self._seed = make, seed
            self._inner = make(seed)

        def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
            self._inner = self._make(trial_seed(self._seed, trial.number))
            self._inner.before_trial(study, trial)

        def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
            return self._inner.infer_relative_search_space(study, trial)

        def sample_relative(self, study: Any, trial: Any, search_space: Any) -> dict[str, Any]:
            return self._inner.sample_relative(study, trial, search_space)

        def sample_independent(self, study: Any, trial: Any, name: str, distribution: Any) -> Any:
            return self._inner.sample_independent(study, trial, name, distribution)

        def after_trial(self, study: Any, trial: Any, state: Any, values: Sequence[float] | None) -> None:
            # GridSampler calls study.stop() after the last grid point, which raises outside study.optimize();
            # the slots already end the study there.
            with contextlib.suppress(RuntimeError):
                self._inner.after_trial(study, trial, state, values)

        def reseed_rng(self) -> None:  # seeds are a function of the trial number, never reseeded at random
            pass

    return PerTrialSeed


def sampler(t: TuneParams, seed: int) -> optuna.samplers.BaseSampler:
    from optuna.samplers import GridSampler, RandomSampler, TPESampler

    makers: dict[str, Callable[[int], Any]] = {
        # constant_liar: a running trial counts as a bad one, so parallel workers do not all sample the same region.
        "tpe": lambda s: TPESampler(seed=s, constant_liar=True),
        "random": lambda s: RandomSampler(seed=s),
        # Not reseeded per trial: GridSampler shuffles its points with its seed and gives trial n the n-th point of
        # that order, so every trial must see the same order (else points repeat and others are never visited).
        "grid": lambda s: GridSampler(space_.grid(t.space), seed=seed),
    }
    sampler: optuna.samplers.BaseSampler = _per_trial_sampler()(makers[t.sampler], seed)
    return sampler


def pruner(t: TuneParams) -> optuna.pruners.BasePruner:
    from optuna.pruners import HyperbandPruner, MedianPruner, NopPruner

    if t.pruner == "median":
        return MedianPruner(n_startup_trials=5)  # no pruning until 5 trials have finished
    if t.pruner == "hyperband":
        return HyperbandPruner()
    return NopPruner()


@dataclass
class Study:
    """An opened study and what its workers share."""

    study: optuna.Study
    params: PipelineParams  # the base params every trial starts from
    root: Path
    budget: int
    metric: str
    minimize: bool

    @property
    def name(self) -> str:
        return self.params.tune.study

    @property
    def directory(self) -> Path:
        """models/tune/<study>/: a directory per trial (its checkpoints, its claim)."""
        return self.root / "models" / "tune" / self.name

    def trial_dir(self, number: int) -> Path:
        return self.directory / f"trial_{number:04d}"

    def trials(self) -> list[optuna.trial.FrozenTrial]:
        """The budget's trials (numbers below it), by number."""
        return [t for t in self.study.get_trials(deepcopy=False) if t.number < self.budget]

    def terminal(self) -> int:
        return sum(t.state.is_finished() for t in self.trials())


def identity(params: PipelineParams, data_hash: str, code_hash: str) -> dict[str, str]:
    """What the trials of one study must share, each part hashed: the params a trial does not sample (the budget,
    workers and storage aside), the data, the training code."""
    from trainflow.core.io import sha256_json

    shared = params.model_dump(mode="json", exclude={"register", "deploy", "evaluate", "tracking"})
    for key in ("trials", "workers", "storage", "backend"):
        shared["tune"].pop(key)
    shared["train"].pop("progress")
    return {"params": sha256_json(shared), "data": data_hash, "code": code_hash}


def open_study(
    params: PipelineParams,
    root: Path,
    budget: int,
    data_hash: str,
    code_hash: str,
    on_create: Callable[[optuna.Study], None] | None = None,
    wait_s: float = 120.0,
) -> Study:
    """Create the study with its `budget` slots (trial 0 = the current params, when they lie in the space) or load it;
    a loaded study must have been started with the same params, data and code.

    Setting a study up takes several writes (the study, its identity, its MLflow run, its slots). The openers of one
    machine take turns under a lock file while they create or load it, and the one that sets it up leaves a marker
    beside the lock until it is done. So an opener that holds the lock and finds a study not set up knows whether the
    process that began it was of this workspace (the marker) or of this machine and is gone (the study's CREATOR, a
    process tag): it finishes the set-up itself, at once. A study begun by a live process of another workspace, or on
    another machine (which this machine cannot tell alive or dead), is waited for, up to `wait_s`."""
    import optuna

    t = params.tune
    if t.sampler == "grid" and budget > (size := space_.grid_size(t.space)):
        raise ParamsError(
            "params.yaml", [("tune.trials", f"{budget} trials exceed the grid's {size} points; set at most {size}")]
        )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    metric, minimize = objective(params)
    store = storage(t.storage, root)
    made = identity(params, data_hash, code_hash)
    chosen = sampler(t, params.seed if t.seed is None else t.seed)
    directory = root / "models" / "tune" / t.study
    marker = directory / SETTING_UP
    deadline = time.monotonic() + wait_s
    while True:
        with _setup_lock(directory, deadline, t.study):
            leftover = marker.is_file()  # a process of this machine died while it set up a study of this name
            write_json(marker, {"process": processes.process_tag()})  # before create_study: a kill after it is seen
            try:
                study = optuna.create_study(
                    study_name=t.study,
                    storage=store,
                    sampler=chosen,
                    pruner=pruner(t),
                    direction="minimize" if minimize else "maximize",
                )
                failpoint("tune-created")
                begun = True
            except optuna.exceptions.DuplicatedStudyError:
                study = optuna.load_study(study_name=t.study, storage=store, sampler=chosen, pruner=pruner(t))
                begun = not study.user_attrs.get(SLOTS_READY) and _begun_here(study, leftover)
            if begun:  # by this process, or by one of this machine that died before it was done
                baseline = space_.current_point(params, t.space) if t.sampler != "grid" else None
                _set_up(study, made, budget, baseline, on_create)
            marker.unlink()  # set up, by this process or another; or begun on another machine
            if study.user_attrs.get(SLOTS_READY):
                _check_identity(study, made, t.study)
                existing = len(study.get_trials(deepcopy=False))
                if existing < budget:  # a rerun with a larger budget
                    _add_slots(study, budget - existing, None)
                return Study(study, params, root, budget, metric, minimize)
        if time.monotonic() > deadline:
            raise UserError(_not_set_up(study, wait_s))
        time.sleep(0.5)  # another machine is setting it up


SETTING_UP = "setting_up.json"  # in models/tune/<study>/: the process of this machine that sets the study up


@contextlib.contextmanager
def _setup_lock(directory: Path, deadline: float, name: str) -> Iterator[None]:
    from filelock import FileLock, Timeout

    directory.mkdir(parents=True, exist_ok=True)
    lock = FileLock(directory / "setup.lock")
    try:
        lock.acquire(timeout=max(0.0, deadline - time.monotonic()))
    except Timeout:
        marker = directory / SETTING_UP
        who = marker.read_text() if marker.is_file() else "?"
        raise UserError(
            f"tune: study {name!r}: a process of this machine has been setting it up for too long ({who}), holding "
            f"{lock.lock_file}; wait for it, or stop it and rerun"
        ) from None
    try:
        yield
    finally:
        lock.release()


def _begun_here(study: optuna.Study, leftover: bool) -> bool:
    """Whether a study that is not set up was begun by a process of this machine that is gone. The setup lock this
    process holds is its workspace's: a process of another workspace on this machine may be setting it up now."""
    creator = study.user_attrs.get(CREATOR)
    if creator is None:  # killed right after create_study, or another machine's process is just past it
        return leftover
    return processes.process_alive(str(creator)) is False


def _set_up(
    study: optuna.Study,
    made: dict[str, str],
    budget: int,
    baseline: dict[str, Any] | None,
    on_create: Callable[[optuna.Study], None] | None,
) -> None:
    """Set up a study this process created, or finish the set-up of one whose creator died: every step is done only if
    it was not done before, so the next opener can always finish it."""
    study.set_user_attr(CREATOR, processes.process_tag())
    if IDENTITY in study.user_attrs:
        _check_identity(study, made, study.study_name)
    else:
        study.set_user_attr(IDENTITY, made)
    if on_create is not None:
        on_create(study)  # the study's MLflow run (made once: trainflow.tune.parent_run)
    existing = len(study.get_trials(deepcopy=False))
    _add_slots(study, budget - existing, baseline if existing == 0 else None)
    study.set_user_attr(SLOTS_READY, True)


def _add_slots(study: optuna.Study, n: int, baseline: dict[str, Any] | None) -> None:
    from optuna.trial import TrialState, create_trial

    for i in range(n):
        # Trial 0 evaluates the current params: the best trial is then never worse than what params.yaml has.
        system = {"fixed_params": baseline} if i == 0 and baseline is not None else {}
        study.add_trial(create_trial(state=TrialState.WAITING, system_attrs=system))
        failpoint("tune-slot")


def _not_set_up(study: optuna.Study, waited_s: float) -> str:
    creator = study.user_attrs.get(CREATOR)
    host = str(creator).rsplit(":", 2)[0] if creator else None
    where, there = (f"on {host} ({creator})", f"on {host}") if host else ("on another machine", "where it was begun")
    return (
        f"tune: study {study.study_name!r} was begun {where} and is still not set up after {waited_s:g} s; that "
        f"process is slow or dead. Rerun `trainflow tune` {there} to finish setting it up, or start a new study with "
        "-S tune.study=<new name>"
    )


def _check_identity(study: optuna.Study, made: dict[str, str], name: str) -> None:
    was = study.user_attrs.get(IDENTITY, {})
    changed = [part for part in ("params", "data", "code") if was.get(part) != made[part]]
    if changed:
        what = {
            "params": "params (besides tune.trials, workers and storage)",
            "data": "data (data/splits)",
            "code": "training code",
        }
        raise UserError(
            f"tune: study {name!r} was started with other {' and '.join(what[c] for c in changed)}; its trials would "
            f"not be comparable. Put them back as they were, or start a new study: -S tune.study={name}-2"
        )


# --- claims ----------------------------------------------------------------------------------------------------------

CLAIMED = "claimed.json"  # in the trial directory: this machine ran the trial (so its checkpoints are here)


@dataclass
class Claim:
    """A trial this worker runs, and the lock that says so. `resumed`: a dead worker's trial, taken over."""

    trial: optuna.Trial
    directory: Path
    lock: BaseFileLock
    resumed: bool

    def release(self) -> None:
        self.lock.release()


def _try_lock(directory: Path) -> BaseFileLock | None:
    from filelock import FileLock, Timeout

    directory.mkdir(parents=True, exist_ok=True)
    lock = FileLock(directory / "owner.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return None
    return lock


def claim(s: Study) -> Claim | None:
    """The next trial for this worker: first a trial of a dead worker of this machine (resumed from its checkpoint),
    then a WAITING slot; None when neither is left."""
    import optuna
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    storage = s.study._storage
    for frozen in s.trials():
        directory = s.trial_dir(frozen.number)
        if frozen.state == TrialState.RUNNING and (directory / CLAIMED).is_file():
            lock = _try_lock(directory)
            if lock is None:
                continue  # its worker is alive
            if storage.get_trial(frozen._trial_id).state == TrialState.RUNNING:
                return Claim(optuna.Trial(s.study, frozen._trial_id), directory, lock, resumed=True)
            lock.release()  # it ended between the two reads
    for frozen in s.trials():
        if frozen.state != TrialState.WAITING:
            continue
        directory = s.trial_dir(frozen.number)
        lock = _try_lock(directory)  # before the transition: a RUNNING trial always has its lock held
        if lock is None:
            continue
        # The marker goes first: a worker killed right after the transition leaves a trial a rerun can find.
        write_json(directory / CLAIMED, {"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()})
        failpoint("tune-claim")  # a kill here leaves the slot WAITING: the next worker claims it as any other
        try:
            won = storage.set_trial_state_values(frozen._trial_id, state=TrialState.RUNNING)
        except UpdateFinishedTrialError:
            won = False
        if not won:  # another worker (maybe on another machine) took it first: its checkpoints are not here
            (directory / CLAIMED).unlink()
            lock.release()
            continue
        failpoint("tune-claimed")  # a kill here leaves it RUNNING and free: the next worker takes it over
        return Claim(optuna.Trial(s.study, frozen._trial_id), directory, lock, resumed=False)
    return None


def stale(s: Study) -> list[int]:
    """Numbers of RUNNING trials no live worker holds (a worker here was killed): a rerun resumes them."""
    from optuna.trial import TrialState

    out = []
    for frozen in s.trials():
        directory = s.trial_dir(frozen.number)
        if frozen.state == TrialState.RUNNING and (directory / CLAIMED).is_file():
            lock = _try_lock(directory)
            if lock is not None:
                lock.release()
                out.append(frozen.number)
    return out


def describe(values: dict[str, Any]) -> str:
    return ", ".join(f"{k.split('.')[-1]}={_short(v)}" for k, v in values.items())


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else json.dumps(v) if not isinstance(v, str) else v


def say(message: str) -> None:
    print(f"[trainflow] tune: {message}", file=sys.stderr, flush=True)


def hashes(params: PipelineParams, paths: Paths) -> tuple[str, str]:
    """(data hash, code hash) a study's trials must share."""
    from trainflow.core.io import sha256_json
    from trainflow.engine.fingerprint import code_hash, data_hash, model_code_hash

    return data_hash(paths), sha256_json([code_hash(), model_code_hash(params.model, paths.root)])
