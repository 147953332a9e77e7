"""One trial: the base params plus the trial's values, trained on data/splits like the train stage (the same `setup`),
in the trial's own directory, reporting the metric at every evaluation so the pruner can stop it.

A trial's checkpoints live in models/tune/<study>/trial_NNNN/checkpoints (never models/checkpoints) and are removed
once the trial has ended; until then a rerun resumes the trial from them. Its MLflow run is a child of the study's run
and is carried on, not duplicated, when the trial is resumed.
"""

from __future__ import annotations

import math
import shutil
from typing import TYPE_CHECKING

from trainflow import lineage, tracking
from trainflow.engine import distributed
from trainflow.engine.precision import resolve_device
from trainflow.errors import UserError
from trainflow.params import with_values
from trainflow.paths import Paths
from trainflow.tune import space
from trainflow.tune.study import PARENT_RUN, Claim, Study, describe, say

if TYPE_CHECKING:
    import optuna

    from trainflow.engine.trainer import Logger


class Reporter:
    """The trial's logger: every point goes to MLflow; at each evaluation the metric goes to Optuna, and a trial the
    pruner gives up on ends there (optuna.TrialPruned, raised through Trainer.fit, which leaves its checkpoints
    whole)."""

    def __init__(self, trial: optuna.Trial, metric: str, inner: Logger) -> None:
        self.trial, self.metric, self.inner = trial, metric, inner

    def log(self, metrics: dict[str, float], step: int) -> None:
        import optuna

        self.inner.log(metrics, step)
        if self.metric not in metrics or not math.isfinite(metrics[self.metric]):
            return
        if step not in self.trial.storage.get_trial(self.trial._trial_id).intermediate_values:  # not on a resume
            self.trial.report(metrics[self.metric], step)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"{self.metric} {metrics[self.metric]:.4g} at update {step}")

    def close(self) -> None:
        self.inner.close()


def run(s: Study, c: Claim, data_hash: str) -> str:
    """Run (or resume) the claimed trial to its end, tell the study how it ended and return that: complete, pruned
    or failed."""
    import optuna
    from optuna.trial import TrialState

    from trainflow.stages.train import setup

    trial, n = c.trial, c.trial.number
    values = space.suggest(trial, s.params.tune.space)
    what = describe(values)
    try:
        params = with_values(s.params, values, f"tune.space (trial {n})")
    except UserError as exc:
        s.study.tell(trial, state=TrialState.FAIL)
        trial.storage.set_trial_user_attr(trial._trial_id, "error", str(exc))
        say(f"trial {n} failed: {exc}")
        return "failed"
    run = tracking.TrainingRun(s.root, params.tracking.experiment, c.directory / "metrics_local.json")
    frozen = trial.storage.get_trial(trial._trial_id)
    if run_id := frozen.user_attrs.get("mlflow_run_id"):
        run.attach(run_id)
    else:
        commit, dirty = lineage.git_commit(s.root)
        tags = {
            "trainflow.tune.study": s.name,
            "trainflow.tune.trial": str(n),
            "trainflow.data_sha256": data_hash,
            "git_commit": commit,
            "git_dirty": str(dirty).lower(),
        }
        if parent := s.study.user_attrs.get(PARENT_RUN):
            tags["mlflow.parentRunId"] = parent
        run.start(params.model_dump(), tags=tags, run_name=f"{s.name}-trial-{n}")
        if run.run_id:
            trial.set_user_attr("mlflow_run_id", run.run_id)
    # tracking.tensorboard: the trial's events in its own folder, reports/tensorboard/tune/<study>/trial_NNNN/<run>
    tensorboard = Paths(s.root).tensorboard / "tune" / s.name / c.directory.name
    logger = Reporter(trial, s.metric, tracking.loggers(run, tensorboard if params.tracking.tensorboard else None))
    device = resolve_device(params.train.device)
    built = setup(params, Paths(s.root), device, distributed.Group(), c.directory / "checkpoints", logger)
    if c.resumed:
        say(f"trial {n}: taking over the trial of a stopped worker, from its last checkpoint ({what})")
    pruned: optuna.TrialPruned | None = None
    error: UserError | None = None
    try:
        end = built.trainer.fit(built.train, built.val)  # resumes from the trial's own checkpoint, if it has one
    except optuna.TrialPruned as exc:
        pruned = exc
    except UserError as exc:  # e.g. a learning rate so high the loss diverged: the trial failed, the study goes on
        error = exc
    except BaseException:
        # Interrupted, or a bug: the trial stays RUNNING with its checkpoints, and a rerun resumes it.
        logger.close()
        run.finish("KILLED")
        raise
    logger.close()
    resumed = built.trainer.resumed_from
    if resumed is not None:
        trial.set_user_attr("resumed_from_update", resumed)
    value = None
    if pruned is not None:
        state, told, detail = "pruned", TrialState.PRUNED, str(pruned)
    elif error is not None:
        trial.set_user_attr("error", str(error).splitlines()[0])
        state, told, detail = "failed", TrialState.FAIL, str(error)
    else:
        value = value_at_best(end.history, end.best_update, s.metric)
        finite = math.isfinite(value)
        state, told, detail = (
            ("complete", TrialState.COMPLETE, f"{s.metric} {value:.4g}")
            if finite
            else ("failed", TrialState.FAIL, f"no finite {s.metric}")
        )
        if finite:
            run.log_metrics({f"best_{s.metric}": value})
    s.study.tell(trial, value if state == "complete" else None, state=told)
    run.set_tags({"trainflow.tune.state": state})
    run.finish("FAILED" if state == "failed" else "FINISHED")
    say(f"trial {n} {state}: {detail} ({what})")
    shutil.rmtree(c.directory / "checkpoints", ignore_errors=True)  # ended: nothing will resume it
    return state


def value_at_best(history: list[dict[str, float]], best_update: int, metric: str) -> float:
    """The metric at the trial's best checkpoint (the weights the train stage would export)."""
    for record in history:
        if int(record["update"]) == best_update and metric in record:
            return float(record[metric])
    return math.nan
