"""tune.backend: ray — the same trials under Ray Tune, with ASHA, for users who already run a Ray cluster.

Each trial is the train stage's `setup` on data/splits with the trial's values (as with Optuna), in
models/tune/<study>/ray/<trial id>/ (its own checkpoints), reporting the metric at every evaluation; Ray's
OptunaSearch samples (tune.sampler, seeded by tune.seed; the current params first) and ASHA (Ray's asynchronous
successive halving) stops unpromising trials (tune.pruner none: no early stopping). The experiment lives in
models/tune/ray/<study>: rerunning `trainflow tune` after a crash restores it with Ray's own `Tuner.restore`, and an
unfinished trial resumes from its own last checkpoint (bit-exact, as always). MLflow: the study's parent run and one
child run per trial. Results: reports/tune/ as with Optuna (trials.csv, best_params.yaml, plots), and --apply.

Ray's budget and restore are Ray's: what Ray counts, and when it saves its experiment state. The guarantees of the
Optuna backend (an exact budget across any number of concurrent commands, the suggestions of an uninterrupted run
after a restart) are not claimed here. Ray connects to a running cluster when RAY_ADDRESS is set, else starts one on
this machine with tune.workers trials at a time.
"""

from __future__ import annotations

import functools
import math
import os
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainflow.core.errors import DiskFullError, UserError
from trainflow.core.paths import Paths
from trainflow.params import PipelineParams, with_values
from trainflow.tune import space

if TYPE_CHECKING:
    from trainflow.core.logger import Logger

ENDED = "trainflow_ended"  # in a trial's last report: it trained to its end (not stopped by ASHA)
FAILED = "trainflow_failed"  # ... and why it failed (bad values: the study goes on; Ray's own errors are crashes)


def _require_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserError(
            "tune.backend ray needs Ray Tune: pip install -e '.[ray]' (or pip install 'ray[tune]'), or set "
            "tune.backend: optuna"
        ) from None
    return ray


class Reporter:
    """The trial's logger: every point to MLflow, the metric to Ray at each evaluation (ASHA decides on it)."""

    def __init__(self, metric: str, inner: Logger) -> None:
        self.metric, self.inner = metric, inner

    def log(self, metrics: dict[str, float], step: int) -> None:
        from ray import tune

        self.inner.log(metrics, step)
        if self.metric in metrics and math.isfinite(metrics[self.metric]):
            tune.report({self.metric: metrics[self.metric], "update": step})

    def close(self) -> None:
        self.inner.close()


def trial(config: dict[str, Any], spec: dict[str, Any]) -> None:
    """One Ray trial (runs in a Ray worker process)."""
    import optuna
    from ray import tune

    from trainflow import tracking
    from trainflow.engine import distributed
    from trainflow.engine.precision import resolve_device
    from trainflow.stages import importable
    from trainflow.stages.train import Training, setup
    from trainflow.tune.trial import one_line, value_at_best

    root = Path(spec["root"])
    importable(root)
    base = PipelineParams.model_validate(spec["params"])
    trial_id = tune.get_context().get_trial_id()
    fixed: Any = optuna.trial.FixedTrial(config)  # Ray's config is Optuna's encoding of the values: decode it
    values = space.suggest(fixed, base.tune.space)
    try:
        params = with_values(base, {**values, "train.progress": False}, f"tune.space (trial {trial_id})")
    except UserError as exc:  # values that do not go together (e.g. n_heads not dividing d_model): a failed trial
        tune.report({ENDED: 1, FAILED: one_line(exc)})
        return
    directory = root / "models" / "tune" / base.tune.study / "ray" / trial_id
    directory.mkdir(parents=True, exist_ok=True)
    run = _child_run(root, base, params, trial_id, spec, directory / "run.json")
    metric = spec["metric"]
    logger = Reporter(metric, tracking.loggers(run, None))
    device = resolve_device(params.train.device)
    try:
        # setup in the try: values the model or the memory cannot take (layer_decay for a model without layers,
        # batch_size auto with no batch that fits) fail this trial, not the study
        built = setup(
            Training(**params.sections(Training.names())),
            Paths(root),
            device,
            distributed.Group(),
            directory / "checkpoints",
            logger,
        )
        try:
            end = built.trainer.fit(built.train, built.val)  # resumes from the trial's own checkpoint, if it has one
        finally:
            built.discard()  # streamed data's files: as big as the data, in every trial's folder
    except UserError as exc:  # e.g. a learning rate so high the loss diverged: the trial failed, the study goes on
        logger.close()
        if isinstance(exc, DiskFullError):  # the machine's fault, not the values': Ray resumes it on a rerun
            run.finish("FAILED")
            raise
        why = one_line(exc)
        run.set_tags({"trainflow.tune.state": "failed", "trainflow.tune.error": why[:5000]})
        run.finish("FAILED")
        tune.report({ENDED: 1, FAILED: why})
        return
    except BaseException:
        logger.close()
        run.finish("FAILED")
        raise
    logger.close()
    value = value_at_best(end.history, end.best_update, metric)
    resumed = built.trainer.resumed_from
    run.set_tags({"trainflow.tune.state": "complete" if math.isfinite(value) else "failed"})
    if math.isfinite(value):
        run.log_metrics({f"best_{metric}": value})
    run.finish("FINISHED" if math.isfinite(value) else "FAILED")
    last = {metric: value, "update": end.updates, ENDED: 1, "resumed_from_update": -1 if resumed is None else resumed}
    tune.report(last)


def _child_run(
    root: Path, base: PipelineParams, params: PipelineParams, trial_id: str, spec: dict[str, Any], record: Path
) -> Any:
    """The trial's MLflow run: started once under a key that run.json holds first (trainflow.tune.runs), so that a
    process killed before it records the run's id leaves a run the restored trial finds; carried on after a restore."""
    from trainflow import tracking
    from trainflow.core.io import failpoint, read_json, write_json
    from trainflow.registry import lineage
    from trainflow.tune import runs

    run = tracking.TrainingRun(root, params.tracking.experiment, record.parent / "metrics_local.json")
    known = read_json(record) if record.is_file() else {}
    run_id, key = known.get("run_id"), known.get("key")
    if run_id is None and key is not None and (run_id := runs.find(root, params.tracking.experiment, key)):
        write_json(record, {"key": key, "run_id": run_id})
    if run_id:
        run.attach(run_id)  # a restored trial carries on its run
        return run
    if key is None:
        key = runs.new_key()
        write_json(record, {"key": key, "run_id": None})
    commit, dirty = lineage.git_commit(root)
    tags = {"trainflow.tune.study": base.tune.study, "trainflow.tune.trial": trial_id,
            "trainflow.tune.backend": "ray", "trainflow.data_sha256": spec["data_hash"], "git_commit": commit,
            "git_dirty": str(dirty).lower(), runs.KEY_TAG: key}  # fmt: skip
    if spec.get("parent"):
        tags["mlflow.parentRunId"] = spec["parent"]
    run.start(params.model_dump(), tags=tags, run_name=f"{base.tune.study}-{trial_id}")
    failpoint("tune-run-start")  # the run is started, run.json does not hold its id yet
    write_json(record, {"key": key, "run_id": run.run_id})
    return run


def run(params: PipelineParams, paths: Paths, budget: int, workers: int) -> tuple[Any, int]:
    """Run (or restore) the Ray experiment to `budget` trials; returns a Study of its results (for reports/tune/)
    and how many trials did not end."""
    ray = _require_ray()
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    from trainflow import tracking
    from trainflow.engine.fingerprint import data_hash
    from trainflow.tune.study import PARENT_RUN, objective, say

    t = params.tune
    metric, minimize = objective(params)
    dims = t.space
    seed = params.seed if t.seed is None else t.seed
    storage = paths.root / "models" / "tune" / "ray"
    experiment = storage / t.study
    uri = tracking.configure(paths.root)
    parent = _parent(params, paths, experiment)
    spec = {"root": str(paths.root), "params": params.model_dump(mode="json"), "metric": metric,
            "data_hash": data_hash(paths), "parent": parent}  # fmt: skip
    cpus = os.cpu_count() or 1
    trainable = tune.with_resources(tune.with_parameters(trial, spec=spec), {"cpu": max(1, cpus // workers)})
    if not ray.is_initialized():
        env = {k: v for k, v in os.environ.items() if k.startswith(("MLFLOW_", "TRAINFLOW_"))}
        ray.init(
            address=os.environ.get("RAY_ADDRESS"),
            num_cpus=None if os.environ.get("RAY_ADDRESS") else cpus,
            include_dashboard=False,
            configure_logging=False,
            log_to_driver=False,
            runtime_env={"env_vars": {**env, "MLFLOW_TRACKING_URI": uri}},
        )
    if tune.Tuner.can_restore(str(experiment)):
        say(f"study {t.study!r} (ray): restoring {experiment}; unfinished trials resume from their checkpoints")
        tuner = tune.Tuner.restore(str(experiment), trainable=trainable, resume_unfinished=True, resume_errored=True)
    else:
        say(f"study {t.study!r} (ray): {budget} trials, {workers} at a time; optimising {metric} "
            f"({'min' if minimize else 'max'}imize), ASHA {'off' if t.pruner == 'none' else 'on'}")  # fmt: skip
        mode = "min" if minimize else "max"
        first = space.current_point(params, dims)
        search = OptunaSearch(
            space=functools.partial(_define, dims=dims),  # Ray pickles its searcher's state
            metric=metric,
            mode=mode,
            sampler=_sampler(t, seed),
            points_to_evaluate=[first] if first is not None and t.sampler != "grid" else None,
        )
        asha = ASHAScheduler(
            time_attr="training_iteration", metric=metric, mode=mode, grace_period=1, reduction_factor=2, max_t=10**6
        )
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(
                num_samples=budget,
                max_concurrent_trials=workers,
                search_alg=search,
                scheduler=None if t.pruner == "none" else asha,
            ),  # fmt: skip
            run_config=tune.RunConfig(name=t.study, storage_path=str(storage), verbose=0),
        )
    grid = tuner.fit()
    s, left = _study(params, paths, grid, metric, minimize, budget)
    if PARENT_RUN not in s.study.user_attrs and parent:
        s.study.set_user_attr(PARENT_RUN, parent)
    return s, left


def _define(trial: Any, dims: dict[str, Any]) -> None:
    space.suggest(trial, dims)  # define-by-run: Ray keeps what was suggested (encoded) as the trial's config


def _sampler(t: Any, seed: int) -> Any:
    from optuna.samplers import GridSampler, RandomSampler, TPESampler

    if t.sampler == "grid":
        return GridSampler(space.grid(t.space), seed=seed)
    return RandomSampler(seed=seed) if t.sampler == "random" else TPESampler(seed=seed)


def _parent(params: PipelineParams, paths: Paths, experiment: Path) -> str | None:
    """The study's MLflow run: made once, its id kept beside the Ray experiment (with what its trials share: params,
    data, code) so that a restore reuses it, and refuses to mix trials of other params into the study."""
    from trainflow.core.io import failpoint, read_json, write_json
    from trainflow.tune import runs
    from trainflow.tune.runs import start_parent
    from trainflow.tune.study import hashes, identity

    shared = identity(params, *hashes(params, paths))
    record = experiment.parent / f"{params.tune.study}.parent.json"
    known = read_json(record) if record.is_file() else {}
    changed = [k for k, v in shared.items() if known and known.get("identity", {}).get(k) != v]
    if changed:
        raise UserError(
            f"tune: study {params.tune.study!r} (ray, {experiment}) was run with other {' and '.join(changed)}; "
            "its trials would not be comparable. Give this sweep a new name (-S tune.study=<new name>), or "
            f"delete {experiment} and {record} to start that study again"
        )
    run_id, key = known.get("run_id"), known.get("key")
    # A key and no id: the process that started the run was killed before it recorded the id (or MLflow did not
    # answer then): the run under that key, if MLflow has one, else a new one under the same key.
    if run_id is None and key is not None and (run_id := runs.find(paths.root, params.tracking.experiment, key)):
        write_json(record, {**known, "run_id": run_id})
    if run_id:
        return str(run_id)
    if key is None:
        key = runs.new_key()
        record.parent.mkdir(parents=True, exist_ok=True)
        write_json(record, {"key": key, "run_id": None, "identity": shared})  # the key before the run
    run_id = start_parent(params, paths.root, key)
    failpoint("tune-parent")  # the run is started, the record does not hold its id yet
    write_json(record, {"key": key, "run_id": run_id, "identity": shared})
    return run_id


def _study(
    params: PipelineParams, paths: Paths, grid: Any, metric: str, minimize: bool, budget: int
) -> tuple[Any, int]:
    """The Ray results as an in-memory Optuna study (trial n = Ray's n-th trial), so reports/tune/ and --apply are
    the Optuna backend's own. A trial whose last report is not its end was stopped by ASHA: pruned."""
    import optuna
    from optuna.trial import TrialState

    from trainflow.core.io import read_json
    from trainflow.tune.study import Study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dims = params.tune.space
    probe = optuna.create_study().ask()
    space.suggest(probe, dims)
    distributions = probe.distributions
    study = optuna.create_study(direction="minimize" if minimize else "maximize")
    results = sorted(grid, key=_order)
    left = 0
    for result in results:
        m = result.metrics or {}
        trial_id = m.get("trial_id", "")
        directory = paths.root / "models" / "tune" / params.tune.study / "ray" / trial_id
        record = directory / "run.json"
        history = result.metrics_dataframe
        steps: dict[int, float] = {}
        if history is not None and metric in history and "update" in history:
            done = history[ENDED].fillna(0).tolist() if ENDED in history else [0] * len(history)
            for update, value, last in zip(history["update"], history[metric], done):
                if last != 1 and isinstance(value, float) and math.isfinite(value):  # the evaluations, not the end
                    steps[int(update)] = value
        value = m.get(metric)
        error = None  # why a failed trial failed (trials.csv's error column, as the Optuna backend records it)
        if result.error is not None:  # its process died (a failed trial reports FAILED): a rerun resumes it
            state, value = TrialState.RUNNING, None
            left += 1
        elif m.get(FAILED):
            state, value, error = TrialState.FAIL, None, str(m[FAILED])
        elif m.get(ENDED) == 1 and isinstance(value, float) and math.isfinite(value):
            state = TrialState.COMPLETE
        elif m.get(ENDED) == 1:  # trained to its end without a finite metric: said as the Optuna backend says it
            state, value, error = TrialState.FAIL, None, f"no finite {metric}"
        elif m:
            state, value = TrialState.PRUNED, None
        else:  # never reported: not started, or restored before its first evaluation
            state, value = TrialState.WAITING, None
            left += 1
        config = result.config or {}
        attrs: dict[str, Any] = {"ray_trial_id": trial_id}
        if error is not None:
            attrs["error"] = error
        if record.is_file():
            attrs["mlflow_run_id"] = read_json(record).get("run_id")
        if (resumed := m.get("resumed_from_update", -1)) is not None and resumed >= 0:
            attrs["resumed_from_update"] = int(resumed)
        frozen = optuna.trial.create_trial(
            state=state, value=value, params={k: config[k] for k in dims if k in config},
            distributions=distributions, intermediate_values=steps, user_attrs=attrs,
        )  # fmt: skip
        if frozen.datetime_complete is not None:  # the trial's time, as Ray measured it
            frozen.datetime_start = frozen.datetime_complete - timedelta(seconds=float(m.get("time_total_s", 0.0)))
        study.add_trial(frozen)
        if state == TrialState.PRUNED and record.is_file():
            _mark_pruned(str(read_json(record).get("run_id") or ""))
    return Study(study, params, paths.root, budget, metric, minimize), left + max(0, budget - len(results))


def _order(result: Any) -> int:
    """Ray's number of a trial (1, 2, ...: the order it was created in), from its directory trial_<id>_<n>_..."""
    parts = Path(str(result.path)).name.split("_")
    return int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else 1 << 30


def _mark_pruned(run_id: str) -> None:
    """ASHA stopped the trial's process: its MLflow run is told so here, by the driver."""
    if not run_id:
        return
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    client.set_tag(run_id, "trainflow.tune.state", "pruned")
    if client.get_run(run_id).info.status == "RUNNING":
        client.set_terminated(run_id, "FINISHED")
