"""Tests for the survivors of the fifth (blind) mutation sample (BENCHMARKS.md, issue 24): each pins a behaviour a
mutant changed without any test noticing, against values worked out by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from support import sweeps
from support.sweeps import mlflow_runs, sweep_params

from trainflow.core.errors import DataError
from trainflow.core.paths import Paths
from trainflow.params import PipelineParams

prepared, project = sweeps.prepared, sweeps.project  # the iris project and its own MLflow store


def test_a_missing_or_damaged_processed_table_says_how_to_restore_it(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    fix = (
        "restore the version DVC committed with `dvc checkout --force data/processed`, or write it again with "
        "`trainflow stage ingest`"
    )
    with pytest.raises(DataError) as exc:
        paths.read_table()
    assert str(exc.value) == f"{paths.table} is missing; {fix}"
    paths.table.parent.mkdir(parents=True)
    paths.table.write_bytes(b"PAR1 not a parquet file")
    with pytest.raises(DataError) as exc:
        paths.read_table()
    assert str(exc.value).startswith(f"{paths.table} cannot be read, it is corrupt or truncated (")
    assert str(exc.value).endswith(f"); {fix}")
    pd.DataFrame({"a": [1, 2]}).to_parquet(paths.table)
    assert paths.read_table()["a"].tolist() == [1, 2]


class Claim:
    def __init__(self, number: int, log: list[str]) -> None:
        self.number, self.log = number, log

    def release(self) -> None:
        self.log.append(f"release {self.number}")


@pytest.mark.parametrize(("max_trials", "ran"), [(None, 3), (1, 1), (2, 2), (5, 3)])
def test_a_worker_runs_trials_until_none_is_left_or_its_limit_and_counts_them(
    max_trials: int | None, ran: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`trainflow tune work --max-trials N`: a worker claims and runs at most N trials of the three left, releasing
    each claim, and returns how many it ran."""
    import trainflow.tune as tune
    from trainflow.tune import study, trial

    log: list[str] = []
    left = [Claim(n, log) for n in (1, 2, 3)]
    monkeypatch.setattr(tune, "parent_run", lambda params, root: "on_create")
    monkeypatch.setattr(study, "open_study", lambda *a, **kw: log.append(f"open {a[2:]} {kw}") or "the study")
    monkeypatch.setattr(study, "claim", lambda s: left.pop(0) if left else None)
    monkeypatch.setattr(trial, "run", lambda s, c, data: log.append(f"run {c.number} of {s} on {data}"))
    assert tune.work(PipelineParams(), tmp_path, 3, "data9", "code9", max_trials) == ran
    assert log == ["open (3, 'data9', 'code9') {'on_create': 'on_create'}"] + [
        entry for n in range(1, ran + 1) for entry in (f"run {n} of the study on data9", f"release {n}")
    ]


def test_a_trial_that_raises_still_releases_its_claim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainflow.tune as tune
    from trainflow.tune import study, trial

    log: list[str] = []
    monkeypatch.setattr(tune, "parent_run", lambda params, root: None)
    monkeypatch.setattr(study, "open_study", lambda *a, **kw: "s")
    monkeypatch.setattr(study, "claim", lambda s: Claim(7, log))

    def fail(s: Any, c: Any, data: str) -> None:
        raise RuntimeError("trial crashed")

    monkeypatch.setattr(trial, "run", fail)
    with pytest.raises(RuntimeError, match="trial crashed"):
        tune.work(PipelineParams(), tmp_path, 1, "d", "c")
    assert log == ["release 7"]


def test_layer_decay_on_a_model_without_numbered_layers_names_params_yaml_and_the_fix() -> None:
    from torch import nn

    from trainflow.core.errors import ParamsError
    from trainflow.engine.optim import plan_groups
    from trainflow.params import TrainParams

    with pytest.raises(ParamsError) as exc:
        plan_groups(nn.Linear(2, 1), TrainParams(layer_decay=0.8))
    assert str(exc.value) == (
        "params.yaml: 1 invalid parameter:\n"
        "  train.layer_decay: Linear has no numbered layers to decay (text_transformer and hf: models have); set it "
        "to null, or give layers their own rates with train.param_groups\n"
        "Fix params.yaml or the -S override, then rerun (`trainflow params schema` lists every field)."
    )


class Killed(Exception):
    """Stands in for the SIGKILL a failpoint sends."""


def test_a_ray_sweep_killed_after_starting_its_parent_run_finds_that_run_again(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed at the failpoint tune-parent (the study's MLflow run started, its id not yet recorded): the record
    holds the run's key and no id; the next sweep finds the run by that key and records it, never a second run."""
    import json

    import trainflow.core.io
    from trainflow.tune import ray_backend, runs

    real = trainflow.core.io.failpoint

    def failpoint(name: str) -> None:
        if name == "tune-parent":
            raise Killed(name)
        real(name)

    p = sweep_params(project)
    experiment = project / "models/tune/trainflow/ray"
    record = experiment.parent / f"{p.tune.study}.parent.json"
    with monkeypatch.context() as m:
        m.setattr(trainflow.core.io, "failpoint", failpoint)
        with pytest.raises(Killed):
            ray_backend._parent(p, Paths(project), experiment)
    (started,) = mlflow_runs(project)
    key = started.data.tags[runs.KEY_TAG]
    assert {k: v for k, v in json.loads(record.read_text()).items() if k != "identity"} == {"key": key, "run_id": None}
    assert ray_backend._parent(p, Paths(project), experiment) == started.info.run_id
    assert json.loads(record.read_text())["run_id"] == started.info.run_id
    assert [r.info.run_id for r in mlflow_runs(project)] == [started.info.run_id]
