"""Hyperparameter sweeps: `trainflow tune` and flows/sweep.py.

An Optuna study (trainflow.tune.study: storage, sampler, pruner, slots and claims) whose trials each train on
data/splits exactly as the train stage does (trainflow.tune.trial), run by local worker processes (`workers`), by
Prefect tasks, or by workers on other machines sharing the study's storage. The results go to reports/tune/
(trainflow.tune.results); `--apply` writes the best params into params.yaml for the next `trainflow run`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trainflow.core.errors import ParamsError, ServiceError, UserError
from trainflow.core.paths import SPLITS, Paths
from trainflow.data.stream import Split
from trainflow.params import RANKED, PipelineParams
from trainflow.tune.runs import finish_parent, parent_run
from trainflow.tune.study import hashes

FIXED_FOR_A_STUDY = ("data", "split")  # they make data/splits, which every trial shares (the seed does not: split.seed)


class TuneIncomplete(ServiceError):
    """Trials are left (a worker was killed): the study is intact, a rerun resumes it."""


def check_overrides(overrides: list[str]) -> None:
    for text in overrides:
        key = text.partition("=")[0].strip()
        if key.split(".")[0] in FIXED_FOR_A_STUDY:
            raise ParamsError(
                "-S",
                [
                    (
                        key,
                        "a sweep trains every trial on data/splits as params.yaml made them; change data or split in "
                        "params.yaml and run `trainflow run` (or `dvc repro split`) first",
                    )
                ],
            )


def check(params: PipelineParams, paths: Paths) -> None:
    if params.train.world_size != 1:
        raise ParamsError(
            "params.yaml",
            [("train.world_size", "a sweep runs each trial in one process; set it to 1 and use tune.workers")],
        )
    metric = params.tune.metric
    if metric in RANKED and metric != params.train.monitor:
        raise ParamsError(
            "params.yaml",
            [("tune.metric", f"{metric} is measured only when it is train.monitor; set train.monitor: {metric} too")],
        )
    for s in SPLITS:
        if not Split.stored(paths.splits, s).exists():
            raise UserError(f"tune: {Split.stored(paths.splits, s)} is missing; run `trainflow stage split` first")


def recorded(params: PipelineParams, paths: Paths) -> tuple[list[str], int] | None:
    """(the -S overrides study `tune.study` was started with, its number of trials), or None where it does not exist
    yet (or runs on Ray, which keeps no such record). `trainflow tune --apply` alone reopens a study with them: its
    trials were measured under them, and a study refuses other params."""
    import optuna

    from trainflow.tune.study import OVERRIDES, storage

    if params.tune.backend != "optuna":
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.load_study(study_name=params.tune.study, storage=storage(params.tune.storage, paths.root))
    except KeyError:  # no such study
        return None
    return list(study.user_attrs.get(OVERRIDES, [])), len(study.get_trials(deepcopy=False))


def run(
    params: PipelineParams,
    paths: Paths,
    trials: int | None = None,
    workers: int | None = None,
    apply: bool = False,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Run the study to its budget with `workers` local processes, write reports/tune/, optionally apply the best.
    `overrides`: the -S the params were loaded with, recorded in a new study (`recorded`)."""
    from trainflow.tune import results
    from trainflow.tune.study import OVERRIDES, open_study, say, stale

    budget, workers = trials or params.tune.trials, workers or params.tune.workers
    check(params, paths)
    failed: list[str] = []
    if params.tune.backend == "ray":
        from trainflow.tune import ray_backend

        s, left = ray_backend.run(params, paths, budget, workers)
    else:
        data, code = hashes(params, paths)
        s = open_study(params, paths.root, budget, data, code, on_create=parent_run(params, paths.root))
        if OVERRIDES not in s.study.user_attrs:
            s.study.set_user_attr(OVERRIDES, list(overrides or []))
        ended = s.terminal()
        say(
            f"study {s.name!r}: {ended}/{budget} trials ended; {workers} worker(s); optimising {s.metric} "
            f"({'min' if s.minimize else 'max'}imize); storage {params.tune.storage or 'models/tune/journal.log'}"
        )
        if ended < budget and workers == 1:
            work(params, paths.root, budget, data, code)  # in this process
        elif ended < budget:
            failed = _work_locally(s, workers)
        left = budget - s.terminal()
    top = results.write(s, paths.reports / "tune")
    summary = _summary(s, top)
    if left == 0:
        finish_parent(s, top)
    if apply:
        if top is None:
            raise UserError("tune --apply: no trial completed, nothing to apply")
        written = results.apply(top, paths.params)
        say(f"applied trial {top['trial']} to {paths.params}: {', '.join(written)}")
        summary["applied"] = written
    if left and params.tune.backend == "optuna" and not failed:
        orphans = stale(s)
        if not orphans and not any(t.state.name == "WAITING" for t in s.trials()):
            # Nothing left to claim, and the trials not ended are held by live workers of another command (or
            # machine): this command's share is done. The last worker to end writes the final reports.
            say(f"{left} trial(s) are still running in another worker; reports/tune/ holds them once they end")
            summary["running_elsewhere"] = left
            return summary
    if left:
        stopped = stale(s) if params.tune.backend == "optuna" else "see Ray's experiment in models/tune/ray"
        why = f"worker(s) {', '.join(failed)} stopped; " if failed else ""
        raise TuneIncomplete(
            f"tune: {left} of {budget} trials did not end ({why}trials left by a stopped worker: {stopped or 'none'}). "
            "Everything finished is kept; rerun `trainflow tune` to resume them from their checkpoints."
        )
    return summary


def work(params: PipelineParams, root: Path, budget: int, data: str, code: str, max_trials: int | None = None) -> int:
    """One worker: claim trials of the study and run them until none is left (or `max_trials` ran); returns how many
    ran. Any process that can reach the storage (and, for a resumed trial, its directory) can be one."""
    from trainflow.tune import trial
    from trainflow.tune.study import claim, open_study

    s = open_study(params, root, budget, data, code, on_create=parent_run(params, root))  # it may finish a set-up
    ran = 0
    while max_trials is None or ran < max_trials:
        c = claim(s)
        if c is None:
            break
        try:
            trial.run(s, c, data)
        finally:
            c.release()
        ran += 1
    return ran


def _work_locally(s: Any, workers: int) -> list[str]:
    """`workers` worker processes (`python -m trainflow.tune.worker`), each with its share of the cores; a progress
    bar of ended trials meanwhile. Returns the workers that did not exit cleanly."""
    from trainflow.core.progress import progress
    from trainflow.tune.study import say

    budget = s.budget
    spec = json.dumps({"root": str(s.root), "params": s.params.model_dump(mode="json"), "budget": budget})
    threads = str(max(1, (os.cpu_count() or 1) // workers))
    procs = []
    for i in range(workers):
        env = {**os.environ, "TRAINFLOW_TUNE_WORKER": str(i), "OMP_NUM_THREADS": threads}
        proc = subprocess.Popen([sys.executable, "-m", "trainflow.tune.worker"], stdin=subprocess.PIPE, env=env)
        assert proc.stdin is not None
        proc.stdin.write(spec.encode())
        proc.stdin.close()
        procs.append(proc)
    bar = progress(budget, initial=s.terminal(), unit="trial", desc="tune")  # plain lines when stderr is a log
    try:
        while any(p.poll() is None for p in procs):
            time.sleep(1.0)
            bar.update(s.terminal() - bar.n)
        bar.update(s.terminal() - bar.n)
    except BaseException:
        for p in procs:
            p.terminate()
        raise
    finally:
        bar.close()
    failed = []
    for i, p in enumerate(procs):
        if p.returncode:
            how = f"killed by signal {-p.returncode}" if p.returncode < 0 else f"exit code {p.returncode}"
            say(f"worker {i} (pid {p.pid}) stopped: {how}")
            failed.append(str(i))
    return failed


def _summary(s: Any, top: dict[str, Any] | None) -> dict[str, Any]:
    from collections import Counter

    from trainflow.tune.results import STATES

    counts = Counter(STATES.get(t.state.name, t.state.name.lower()) for t in s.trials())  # trials.csv's names
    return {
        "study": s.name,
        "trials": s.budget,
        "states": dict(counts),
        "best": top,
        "results": "reports/tune/ (trials.csv, best_params.yaml, optimization_history.png, param_importances.png)",
    }
