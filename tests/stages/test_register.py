"""The register stage's own steps (trainflow.stages.register), called in this process: the model it logs into
train's run when tracking went down during train. (Registry decisions through the stage: tests/stages/test_registry.py;
the registry itself: tests/registry/.)"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from trainflow.core.paths import Paths


def test_register_returns_the_uri_of_the_model_it_logs_into_trains_run_when_train_could_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Train started a run but tracking went down before the model was logged: register logs the exported model into
    that run and registers what it logged, so the URI it returns is the one log_pyfunc gave (MLflow's own logging is
    stood in for: it needs a trained model; tests/reliability/test_tracking_outage.py runs it for real)."""
    from mlflow.tracking import MlflowClient

    from trainflow import tracking
    from trainflow.params import PipelineParams
    from trainflow.stages import register

    paths = Paths(tmp_path)
    paths.final.mkdir(parents=True)
    (paths.final / "model.safetensors").write_bytes(b"the weights")
    (paths.final / "training.json").write_text('{"data_sha256": "d"}')
    paths.splits.mkdir(parents=True)
    pd.DataFrame({"x": range(7), "target": list("abababa")}).to_parquet(paths.split_file("val"))
    tracking.configure(tmp_path)
    experiment = tracking.ensure_experiment(PipelineParams().tracking.experiment, tmp_path)
    train_run = MlflowClient().create_run(experiment).info.run_id  # no model in it: tracking failed before

    logged: list[tuple[str, Path, list[int], str]] = []

    def log_pyfunc(run_id: str, final: Path, example: pd.DataFrame, flavor: str) -> str:
        logged.append((run_id, final, example["x"].tolist(), flavor))
        return "models:/m-logged-by-register"

    monkeypatch.setattr(tracking, "log_pyfunc", log_pyfunc)
    found = register.logged_model(paths, {"run_id": train_run, "model_uri": None}, "package", "trainflow")
    assert found == (train_run, "models:/m-logged-by-register")
    # once, into train's run, 5 val rows as example, as register.flavor says
    assert logged == [(train_run, paths.final, [0, 1, 2, 3, 4], "package")]


def test_a_champion_without_split_tags_is_compared_on_no_rows_of_its_split_and_says_why(csv_project: Path) -> None:
    """A champion registered before versions recorded their split (no lineage, generation or data_hash tag) still
    meets the gate: which of this split's test rows it held is unknown, and the gate is told why, not a crash on the
    missing generation."""
    from trainflow.data.schema import Schema
    from trainflow.params import load_params
    from trainflow.registry import registry
    from trainflow.stages import register, run_stage

    paths = Paths(csv_project)
    for stage in ("ingest", "split"):
        run_stage(stage, load_params(paths.params), paths)
    sliced = register.slicing(paths, Schema.read(paths.split_schema), None)
    assert registry.LINEAGE_TAG in sliced.tags and registry.GENERATION_TAG in sliced.tags  # what this version records
    untagged = sliced.held({})
    assert untagged.split is None and untagged.clean is None and "not in the DVC cache" in untagged.how
    # the same split's own tags: every test row was a test row of the champion's split too (or new)
    tagged = sliced.held(sliced.tags)
    assert tagged.split is not None and tagged.clean is not None and tagged.clean.all()
    assert "extends the champion's" in tagged.how
