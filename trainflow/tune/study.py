"""The study: its storage, sampler and pruner, its fixed budget of trial slots, and how a worker claims a trial.

Optuna's own bookkeeping is what users of it complain about (a killed trial stays RUNNING and is rerun from scratch
as a new trial; `n_trials` counts per process; a restarted sampler suggests other params). Here:

- **Slots.** The study holds exactly `trials` trials with numbers 0..trials-1, created up front as WAITING trials by
  the process that creates the study (and topped up when a rerun raises the budget). A worker never creates a trial;
  it claims a WAITING one with the storage's atomic WAITING -> RUNNING transition (the same one Optuna uses for its
  queue). So the budget holds across restarts, workers and machines, and no number is run twice.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainflow.errors import ParamsError, UserError
from trainflow.io import write_json
from trainflow.params import MINIMIZED, PipelineParams, TuneParams
from trainflow.tune import space as space_

if TYPE_CHECKING:
    import optuna
    from filelock import BaseFileLock

DEFAULT_JOURNAL = "models/tune/journal.log"
SLOTS_READY = "trainflow.slots_ready"  # study user attr: the creator has made the first `trials` slots
IDENTITY = "trainflow.identity"  # study user attr: what every trial of the study shares (params, data, code)
PARENT_RUN = "trainflow.mlflow_parent_run_id"


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
        "grid": lambda s: GridSampler(space_.grid(t.space), seed=s),
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
    from trainflow.io import sha256_json

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
) -> Study:
    """Create the study with its `budget` slots (trial 0 = the current params, when they lie in the space) or load it;
    a loaded study must have been started with the same params, data and code."""
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
    try:
        study = optuna.create_study(
            study_name=t.study,
            storage=store,
            sampler=chosen,
            pruner=pruner(t),
            direction="minimize" if minimize else "maximize",
        )
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=t.study, storage=store, sampler=chosen, pruner=pruner(t))
        created = False
    opened = Study(study, params, root, budget, metric, minimize)
    if created:
        study.set_user_attr(IDENTITY, made)
        if on_create is not None:
            on_create(study)
        baseline = space_.current_point(params, t.space) if t.sampler != "grid" else None
        _add_slots(study, budget, baseline)
        study.set_user_attr(SLOTS_READY, True)
        return opened
    _wait_for_slots(study)
    _check_identity(study, made, t.study)
    existing = len(study.get_trials(deepcopy=False))
    if existing < budget:  # a rerun with a larger budget
        _add_slots(study, budget - existing, None)
    return opened


def _add_slots(study: optuna.Study, n: int, baseline: dict[str, Any] | None) -> None:
    from optuna.trial import TrialState, create_trial

    for i in range(n):
        # Trial 0 evaluates the current params: the best trial is then never worse than what params.yaml has.
        system = {"fixed_params": baseline} if i == 0 and baseline is not None else {}
        study.add_trial(create_trial(state=TrialState.WAITING, system_attrs=system))


def _wait_for_slots(study: optuna.Study, timeout_s: float = 120.0) -> None:
    """Another process created the study a moment ago: wait until it has made its slots."""
    deadline = time.monotonic() + timeout_s
    while not study.user_attrs.get(SLOTS_READY):
        if time.monotonic() > deadline:
            raise UserError(
                f"tune: study {study.study_name!r} exists but its trials were never set up (its creator died?); "
                "start a new study with -S tune.study=<new name>"
            )
        time.sleep(0.5)


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
        try:
            won = storage.set_trial_state_values(frozen._trial_id, state=TrialState.RUNNING)
        except UpdateFinishedTrialError:
            won = False
        if not won:  # another worker (maybe on another machine) took it first: its checkpoints are not here
            (directory / CLAIMED).unlink()
            lock.release()
            continue
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
