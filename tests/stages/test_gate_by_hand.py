"""The paired gate's refusal to decide, through the registry: a challenger on fewer than gate.MIN_ROWS test rows
leaves the champion where it was, and the command the decision names, followed as written, promotes it."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import r2_score
from support.projects import model_run

from trainflow.params import RegisterParams
from trainflow.registry import gate, registry
from trainflow.registry.gate import Scored


def regression_metrics(s: Scored) -> dict[str, float]:
    return {"r2": float(r2_score(s.labels, s.outputs)), "rmse": 1.0, "mae": 1.0}


def test_too_few_test_rows_keep_the_champion_and_the_advice_promotes_by_hand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    from trainflow import cli, tracking

    monkeypatch.chdir(tmp_path)
    tracking.configure(tmp_path)
    client = MlflowClient()
    experiment = tracking.ensure_experiment("trainflow", tmp_path)
    y = np.arange(gate.MIN_ROWS - 1, dtype=np.float64)
    champion, challenger = Scored(y, y + 1.0), Scored(y, y + 0.01)  # the challenger better on every row
    params = RegisterParams(model_name="m")  # decide: paired, the default; gate_metric auto: r2

    def register(scored: Scored) -> dict[str, object]:
        run_id = model_run(client, experiment, tmp_path / "models")
        return registry.register(
            f"runs:/{run_id}/model", run_id, params, regression_metrics(scored), {}, test_hash="h",
            rescore=lambda uri: (regression_metrics(champion), champion), challenger=scored, seed=0,
        )  # fmt: skip

    assert register(champion)["champion"] is True  # the first version
    second = register(challenger)
    decision = str(second["decision"])
    assert second["champion"] is False and second["champion_version"] == 1, decision
    assert f"too few test rows to decide (n = {len(y)} < {gate.MIN_ROWS}); the champion stays" in decision
    advice = re.search(r"promote by hand with `trainflow (models promote 2 --name m) --reason \.\.\.`", decision)
    assert advice is not None, decision
    assert cli.main([*advice.group(1).split(), "--reason", "checked by hand"]) == 0
    assert {a: str(v) for a, v in client.get_registered_model("m").aliases.items()}["champion"] == "2"
    assert registry.champion_history(client, "m") == [1, 2]
