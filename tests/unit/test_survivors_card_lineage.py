"""Behaviours a mutation run showed no test pinned: the "(unset)" a param change names when a param is new, DVC's data
hash when dvc.lock records no stages, the model card's bootstrap interval drawing every test row, the header of the
card's slice table and the blank line that ends each Markdown table, and the models:/ URI register returns when it
logs the model itself (tracking was down during train)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from trainflow.core.paths import Paths
from trainflow.registry import card, changes
from trainflow.registry.gate import Scored

# --- why: params that changed -----------------------------------------------------------------------------------------


def test_a_param_new_since_the_champion_reads_unset_before_and_a_removed_one_unset_after() -> None:
    then = {"seed": "0", "train.lr": "0.1"}
    now = {"seed": "0", "train.epochs": "5"}
    assert changes._param_changes(then, now) == ["train.epochs: (unset) -> 5", "train.lr: 0.1 -> (unset)"]


# --- card: bootstrap intervals ----------------------------------------------------------------------------------------


def test_the_bootstrap_interval_resamples_every_row_including_the_first() -> None:
    """Two test rows, absolute errors 1 (row 0) and 0 (row 1). A resample of 2 rows has mean error 0, 0.5 or 1 with
    chances 1/4, 1/2, 1/4, so out of 2000 resamples about 500 are all row 0 and 500 all row 1: the 2.5% and 97.5%
    quantiles are 0 and 1. A bootstrap that never drew row 0 would give [0, 0]."""
    scored = Scored(labels=np.array([0.0, 0.0]), outputs=np.array([1.0, 0.0]))
    assert card.intervals({"mae": 0.5, "n_test": 2}, scored, seed=0) == [["mae", "0.5", "[0, 1]", "lower is better"]]


# --- card: the slice table and the Markdown layout --------------------------------------------------------------------


def _comparison_with_a_slice() -> dict[str, Any]:
    return {
        "challenger": 0.9, "champion": 0.8, "improvement": 0.1, "confidence": 0.95, "low": 0.05, "high": 0.15,
        "test": "paired bootstrap",
        "slices": [{"slice": "new rows", "rows": 12, "metric": "accuracy", "challenger": 0.75, "champion": 0.5,
                    "improvement": 0.25}],
    }  # fmt: skip


def test_the_cards_slice_table_has_its_header_and_one_row_per_slice(tmp_path: Path) -> None:
    reg = {"decision": "champion", "comparison": _comparison_with_a_slice()}
    parts = card.sections(Paths(tmp_path), reg, {"accuracy": 0.9, "n_test": 40}, None, seed=0)
    text = card.markdown("Model card: m v2", parts)
    header = "| slice | rows | metric | challenger | champion | improvement |"
    lines = text.splitlines()
    assert header in lines
    at = lines.index(header)
    row = "| new rows | 12 | accuracy | 0.75 | 0.5 | 0.25 |"
    assert lines[at + 1 : at + 4] == ["|---|---|---|---|---|---|", row, ""]


def test_markdown_ends_each_table_with_a_blank_line_so_the_next_block_renders() -> None:
    parts = [
        card.Section("First", tables=[(["a", "b"], [["1", "2"]]), (["c"], [["x|y"]])]),
        card.Section("Second", text=["Some words."]),
    ]
    expected = (
        "# T\n\n## First\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n| c |\n|---|\n| x\\|y |\n\n## Second\n\nSome words.\n"
    )
    assert card.markdown("T", parts) == expected


# --- register: logging the model when train could not -----------------------------------------------------------------


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
