"""One trial: the base params plus the trial's values, trained on data/splits like the train stage (the same `setup`),
in the trial's own directory, reporting the metric at every evaluation so the pruner can stop it.

A trial's checkpoints live in models/tune/<study>/trial_NNNN/checkpoints (never models/checkpoints) and are removed
once the trial has ended; until then a rerun resumes the trial from them. Its MLflow run is a child of the study's run
and is carried on, not duplicated, when the trial is resumed.
"""

from __future__ import annotations

import math
import shutil
from typing import TYPE_CHECKING, Any

from trainflow import tracking
from trainflow.core.errors import DiskFullError, ParamsError, UserError
from trainflow.core.io import failpoint
from trainflow.core.paths import Paths
from trainflow.engine import distributed
from trainflow.engine.precision import resolve_device
from trainflow.params import PipelineParams, with_values
from trainflow.registry import lineage
from trainflow.tune import runs, space
from trainflow.tune.study import PARENT_RUN, Claim, Study, describe, say

if TYPE_CHECKING:
    import optuna

    from trainflow.core.logger import Logger
    from trainflow.engine.trainer import Trainer


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
    or failed. Values the params refuse, or that the model or the memory cannot take (`setup` raises: layer_decay for
    a model without layers, batch_size auto with no batch that fits), fail the trial with their message, and the
    study goes on."""
    import optuna

    from trainflow.stages.train import Training, setup

    trial, n = c.trial, c.trial.number
    values = space.suggest(trial, s.params.tune.space)
    what = describe(values)
    if c.resumed:
        say(f"trial {n}: taking over the trial of a stopped worker, from its last checkpoint ({what})")
    try:
        params = with_values(s.params, values, f"tune.space (trial {n})")
    except UserError as exc:  # values that do not go together (e.g. n_heads not dividing d_model)
        run = child_run(s, c, _overlaid(s.params, values), data_hash)
        return _end(s, c, run, "failed", None, exc, what)
    run = child_run(s, c, params.model_dump(), data_hash)
    # tracking.tensorboard: the trial's events in its own folder, reports/tensorboard/tune/<study>/trial_NNNN/<run>
    tensorboard = Paths(s.root).tensorboard / "tune" / s.name / c.directory.name
    logger = Reporter(trial, s.metric, tracking.loggers(run, tensorboard if params.tracking.tensorboard else None))
    device = resolve_device(params.train.device)
    trainer: Trainer | None = None
    try:
        built = setup(
            Training(**params.sections(Training.names())),
            Paths(s.root),
            device,
            distributed.Group(),
            c.directory / "checkpoints",
            logger,
        )
        trainer = built.trainer
        try:
            end = trainer.fit(built.train, built.val)  # resumes from the trial's own checkpoint, if it has one
        finally:
            built.discard()  # streamed data's files: as big as the data, in every trial's folder
    except optuna.TrialPruned as exc:
        outcome: tuple[str, float | None, BaseException | str | None] = ("pruned", None, exc)
    except UserError as exc:  # e.g. a learning rate so high the loss diverged: the trial failed, the study goes on
        if isinstance(exc, DiskFullError):  # the machine's fault, not the values': resumed once there is room
            _stopped(logger, run)
            raise
        outcome = ("failed", None, exc)
    except BaseException:
        # Interrupted, or a bug: the trial stays RUNNING with its checkpoints, and a rerun resumes it.
        _stopped(logger, run)
        raise
    else:
        value = value_at_best(end.history, end.best_update, s.metric)
        outcome = ("complete", value, None) if math.isfinite(value) else ("failed", None, f"no finite {s.metric}")
    logger.close()
    if trainer is not None and trainer.resumed_from is not None:
        trial.set_user_attr("resumed_from_update", trainer.resumed_from)
    return _end(s, c, run, *outcome, what)


def _end(
    s: Study,
    c: Claim,
    run: tracking.TrainingRun,
    state: str,
    value: float | None,
    why: BaseException | str | None,
    what: str,
) -> str:
    """Tell MLflow, then the study, how the trial ended. In that order: a worker killed between the two leaves the
    trial RUNNING, and the next one resumes it and ends it again, the same way."""
    from optuna.trial import TrialState

    trial, n = c.trial, c.trial.number
    detail = f"{s.metric} {value:.4g}" if value is not None else one_line(why)
    tags = {"trainflow.tune.state": state}
    if state == "failed":
        trial.set_user_attr("error", detail)
        tags["trainflow.tune.error"] = detail[:5000]  # MLflow's limit on a tag's value
    run.set_tags(tags)
    if value is not None:
        run.log_metrics({f"best_{s.metric}": value})
    run.finish("FAILED" if state == "failed" else "FINISHED")
    told = {"complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED, "failed": TrialState.FAIL}[state]
    s.study.tell(trial, value, state=told)
    say(f"trial {n} {state}: {detail} ({what})")
    shutil.rmtree(c.directory / "checkpoints", ignore_errors=True)  # ended: nothing will resume it
    return state


def _stopped(logger: Logger, run: tracking.TrainingRun) -> None:
    logger.close()
    run.finish("KILLED")


def one_line(why: BaseException | str | None) -> str:
    """Why a trial ended, on one line: a ParamsError's problems (its first line only counts them), else the text."""
    if isinstance(why, ParamsError):
        return "; ".join(f"{path}: {problem}" for path, problem in why.problems)
    return " ".join(str(why).split())


def _overlaid(params: PipelineParams, values: dict[str, Any]) -> dict[str, Any]:
    """The params with the trial's values, as a dict, for a trial whose values the params refuse (no params object
    holds them)."""
    out = params.model_dump()
    for path, value in values.items():
        *parents, leaf = path.split(".")
        node = out
        for key in parents:
            node = node[key]
        node[leaf] = value
    return out


RUN_ID, RUN_KEY = "mlflow_run_id", "mlflow_run_key"  # trial user attrs (trainflow.tune.runs)


def child_run(s: Study, c: Claim, logged: dict[str, Any], data_hash: str) -> tracking.TrainingRun:
    """The trial's MLflow run, a child of the study's: started once (under a key recorded first, so that a worker
    killed before it records the run's id leaves a run the next one finds), carried on when the trial is resumed."""
    trial, n = c.trial, c.trial.number
    run = tracking.TrainingRun(s.root, s.params.tracking.experiment, c.directory / "metrics_local.json")
    attrs = trial.storage.get_trial(trial._trial_id).user_attrs
    run_id, key = attrs.get(RUN_ID), attrs.get(RUN_KEY)
    # A key and no id: a worker started the run (or tried to) and was killed before it recorded the id.
    if run_id is None and key is not None and (run_id := runs.find(s.root, s.params.tracking.experiment, key)):
        trial.set_user_attr(RUN_ID, run_id)
    if run_id:
        run.attach(run_id)
        return run
    if key is None:
        key = runs.new_key()
        trial.set_user_attr(RUN_KEY, key)
    commit, dirty = lineage.git_commit(s.root)
    tags = {
        "trainflow.tune.study": s.name,
        "trainflow.tune.trial": str(n),
        "trainflow.data_sha256": data_hash,
        "git_commit": commit,
        "git_dirty": str(dirty).lower(),
        runs.KEY_TAG: key,
    }
    if parent := s.study.user_attrs.get(PARENT_RUN):
        tags["mlflow.parentRunId"] = parent
    run.start(logged, tags=tags, run_name=f"{s.name}-trial-{n}")
    failpoint("tune-run-start")  # the run is started, the trial does not know its id yet
    if run.run_id:
        trial.set_user_attr(RUN_ID, run.run_id)
    return run


def value_at_best(history: list[dict[str, float]], best_update: int, metric: str) -> float:
    """The metric at the trial's best checkpoint (the weights the train stage would export)."""
    for record in history:
        if int(record["update"]) == best_update and metric in record:
            return float(record[metric])
    return math.nan
