"""The sweep's worker process (trainflow.tune.worker): it reads its spec from stdin, runs the study without progress
bars, prints how many trials it ran or the error alone, and exits with the error's code. The sweep code is called in
this process, so that mutation testing sees which function each test reached (tests/stages/test_tune*.py run `trainflow
tune` in subprocesses)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
from support import sweeps
from support.sweeps import sweep_params

from trainflow import tune
from trainflow.core.errors import ServiceError, UserError
from trainflow.core.paths import Paths
from trainflow.params import PipelineParams
from trainflow.tune import worker

optuna.logging.set_verbosity(optuna.logging.WARNING)


# --- the project: iris split in this process, an MLflow database whose tables exist --------------------------------
prepared, project = sweeps.prepared, sweeps.project  # the fixtures, in tests/support/sweeps.py


def test_the_worker_reads_its_spec_from_stdin_and_runs_the_study_without_progress_bars(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainflow.engine.fingerprint import data_hash

    p = sweep_params(project, "train.progress=true")
    spec = {"root": str(project), "params": p.model_dump(mode="json"), "budget": "3", "max_trials": 1}
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(spec)))
    calls: list[tuple[Any, ...]] = []

    def work(*args: Any) -> int:
        calls.append(args)
        return 1

    monkeypatch.setattr(tune, "work", work)
    assert worker.main() == 0
    assert json.loads(capsys.readouterr().out) == {"trials_run": 1}
    ((params, root, budget, data, code, max_trials),) = calls
    assert params.train.progress is False and params.model_dump(exclude={"train"}) == p.model_dump(exclude={"train"})
    assert (root, budget, max_trials) == (project, 3, 1)
    assert data == data_hash(Paths(project)) and len(code) == 64
    assert sys.path[0] == str(project)  # a user model imports from the project


def test_a_worker_that_meets_a_user_or_service_error_says_so_and_exits_with_its_code(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def main(p: PipelineParams) -> int:
        spec = {"root": str(project), "params": p.model_dump(mode="json"), "budget": 2}
        monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(spec)))
        return worker.main()

    assert main(sweep_params(project, "model.code=missing.py")) == 2
    assert "error: model.code: missing.py does not exist under" in capsys.readouterr().err

    def down(*args: Any) -> int:
        raise ServiceError("MLflow did not answer")

    monkeypatch.setattr(tune, "work", down)
    assert main(sweep_params(project)) == 1
    captured = capsys.readouterr()
    assert "error: MLflow did not answer" in captured.err and captured.out == ""


def test_the_worker_prints_how_many_trials_it_ran_or_the_error_alone(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainflow.core.errors import ServiceError

    p = sweep_params(project)
    results = iter([2, ServiceError("MLflow did not answer"), UserError("tune: study 'x' was begun elsewhere")])

    def work(*args: Any) -> int:
        out = next(results)
        if isinstance(out, Exception):
            raise out
        return out

    monkeypatch.setattr(tune, "work", work)
    codes = []
    outputs = []
    for _ in range(3):
        monkeypatch.setattr(
            sys,
            "stdin",
            io.StringIO(json.dumps({"root": str(project), "params": p.model_dump(mode="json"), "budget": 2})),
        )
        codes.append(worker.main())
        captured = capsys.readouterr()
        outputs.append((captured.out, captured.err))
    assert codes == [0, ServiceError("x").exit_code, UserError("x").exit_code] and codes[1] != codes[2]
    assert outputs == [
        ('{"trials_run": 2}\n', ""),
        ("", "error: MLflow did not answer\n"),
        ("", "error: tune: study 'x' was begun elsewhere\n"),
    ]
