"""The whole text of the model card, the flow's report artifacts, `why` and the paired gate, pinned on hand-made inputs.

Each expected Markdown/HTML page, dict and decision line is written out here by hand (or, for a bootstrap, computed
with numpy from the same seeded draw), so a change to any header, cell, branch or default shows up as a failing test.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from support.vcs import git_stdout as _git

from trainflow.core.io import write_json
from trainflow.core.paths import Paths
from trainflow.data.schema import Schema
from trainflow.registry import card, changes, gate
from trainflow.stages import report

# --------------------------------------------------------------------------------------------------------------------
# report: the Prefect artifacts
# --------------------------------------------------------------------------------------------------------------------


def _reg(**changes: object) -> dict[str, object]:
    reg: dict[str, object] = {
        "model_name": "digits",
        "version": 3,
        "model_uri": "models:/digits/3",
        "gate_metric": "accuracy",
        "value": 0.95,
        "previous_champion": 2,
        "previous_value": 0.9667,
        "champion": False,
        "champion_version": 2,
    }
    return reg | changes


def test_a_cell_is_four_decimals_a_dash_for_none_and_escapes_pipes() -> None:
    """fmt: floats to 4 decimals, None as an em dash, anything else as text with its pipes escaped."""
    assert report.fmt(None) == "—"
    assert report.fmt(0.5) == "0.5000"
    assert report.fmt(1 / 3) == "0.3333"
    assert report.fmt(3) == "3"
    assert report.fmt(True) == "True"
    assert report.fmt("a|b|c") == "a\\|b\\|c"


def test_a_table_is_a_header_a_rule_and_a_line_per_row() -> None:
    """_table: the rule under the header repeats the alignment once per column."""
    assert report._table(["a", "b"], [["1", "2"], ["3", "4"]]) == "| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |"
    assert report._table(["a", "b"], [], align=":-:") == "| a | b |\n|:-:|:-:|"


def test_metrics_beside_the_champions_gate_metric_recorded_at_its_registration() -> None:
    """Without previous_metrics only the gate metric of the champion is shown, as the registry recorded it."""
    md = report.metrics_markdown({"accuracy": 0.9704, "log_loss": 0.1012, "n_test": 270}, _reg())
    assert md == (
        "## Test metrics: digits v3\n"
        "\n"
        "| metric | this run (v3) | champion before it (v2) |\n"
        "|---|---|---|\n"
        "| **accuracy** (gate, higher is better) | 0.9704 | 0.9667 |\n"
        "| log_loss | 0.1012 | — |\n"
        "| n_test | 270 | — |\n"
        "\n"
        "v2's metrics are those recorded when it was registered.\n"
    )


def test_metrics_of_a_rescored_champion_list_its_metrics_the_new_run_lacks_last() -> None:
    """previous_metrics (the champion rescored on this test data): every metric of both, a lower-is-better gate."""
    reg = _reg(gate_metric="log_loss", previous_metrics={"accuracy": 0.9667, "ece": 0.02}, rescored=True)
    md = report.metrics_markdown({"accuracy": 0.9704, "log_loss": 0.1012}, reg)
    assert md == (
        "## Test metrics: digits v3\n"
        "\n"
        "| metric | this run (v3) | champion before it (v2) |\n"
        "|---|---|---|\n"
        "| accuracy | 0.9704 | 0.9667 |\n"
        "| **log_loss** (gate, lower is better) | 0.1012 | — |\n"
        "| ece | — | 0.0200 |\n"
        "\n"
        "The champion (v2) was rescored on this run's test data.\n"
    )


def test_metrics_of_a_first_version_and_of_a_champion_that_could_not_be_scored() -> None:
    """No earlier champion, and a champion whose value is unknown: each says so in its last line."""
    first = _reg(version=1, previous_champion=None, previous_value=None, gate_metric="rmse", previous_metrics=[1])
    assert report.metrics_markdown({"rmse": 0.5}, first) == (
        "## Test metrics: digits v1\n"
        "\n"
        "| metric | this run (v1) | champion before it |\n"
        "|---|---|---|\n"
        "| **rmse** (gate, lower is better) | 0.5000 | — |\n"
        "\n"
        "No earlier champion: this is the first version of the model.\n"
    )
    # a first version whose gate metric the run did not measure: no row for it
    assert report.metrics_markdown({"rmse": 0.5}, _reg(previous_champion=None, gate_metric="mae")).split("\n")[2:6] == [
        "| metric | this run (v3) | champion before it |",
        "|---|---|---|",
        "| rmse | 0.5000 | — |",
        "",
    ]
    lost = _reg(previous_value=None)
    assert report.metrics_markdown({"accuracy": 0.95}, lost) == (
        "## Test metrics: digits v3\n"
        "\n"
        "| metric | this run (v3) | champion before it (v2) |\n"
        "|---|---|---|\n"
        "| **accuracy** (gate, higher is better) | 0.9500 | — |\n"
        "\n"
        "The champion (v2) could not be scored on this run's test data: see the decision.\n"
    )


def test_metrics_without_a_registration_have_a_plain_title_and_header() -> None:
    """No registration.json (the pipeline stopped before register): this run's metrics alone, and nothing said of a
    champion (it used to say that champion "vNone" could not be scored)."""
    md = report.metrics_markdown({"accuracy": 0.9, "n_test": 4}, None)
    assert md == (
        "## Test metrics\n\n"
        "| metric | this run | champion before it |\n|---|---|---|\n| accuracy | 0.9000 | — |\n| n_test | 4 | — |\n"
    )


def test_a_run_link_is_for_http_servers_only() -> None:
    """run_link: the MLflow UI page on an http(s) server (a trailing slash dropped), None for a local store."""
    assert report.run_link("http://h:5000/", "1", "r") == "http://h:5000/#/experiments/1/runs/r"
    assert report.run_link("https://m.example.com", "7", "x") == "https://m.example.com/#/experiments/7/runs/x"
    assert report.run_link("sqlite:///mlflow.db", "1", "r") is None
    assert report.run_link("file:///tmp/mlruns", "1", "r") is None
    assert report.run_link("http://hostX//", "1", "r") == "http://hostX/#/experiments/1/runs/r"  # only slashes go


def test_the_mlflow_run_on_a_server_is_a_link_and_the_logged_model() -> None:
    run = {
        "run_id": "r1",
        "experiment_id": "7",
        "tracking_uri": "https://mlflow.example.com/",
        "model_uri": "runs:/r1/m",
    }
    assert report.mlflow_run_markdown(run) == (
        "## MLflow run\n"
        "\n"
        "- run: [r1](https://mlflow.example.com/#/experiments/7/runs/r1)\n"
        "- logged model: `runs:/r1/m`\n"
        "- tracking store: `https://mlflow.example.com/`\n"
    )


def test_the_mlflow_run_in_a_local_store_says_how_to_browse_it() -> None:
    run = {"run_id": "r1", "experiment_id": "7", "tracking_uri": "sqlite:////srv/p/mlflow.db"}
    assert report.mlflow_run_markdown(run) == (
        "## MLflow run\n"
        "\n"
        "- run: `r1` (experiment 7)\n"
        "- tracking store: `sqlite:////srv/p/mlflow.db`\n"
        "\n"
        "Browse it on the machine that ran the flow:\n"
        "\n"
        "    mlflow ui --backend-store-uri sqlite:////srv/p/mlflow.db\n"
        "\n"
        "then open http://127.0.0.1:5000/#/experiments/7/runs/r1\n"
    )


def test_a_train_run_json_without_its_fields_shows_empty_ones() -> None:
    assert report.mlflow_run_markdown({"run_id": "r"}) == (
        "## MLflow run\n\n- run: `r` (experiment )\n- tracking store: ``\n\nBrowse it on the machine that ran the flow:"
        "\n\n    mlflow ui --backend-store-uri \n\nthen open http://127.0.0.1:5000/#/experiments//runs/r\n"
    )


def test_a_run_that_lost_tracking_says_where_the_metrics_are_and_links_the_run_if_it_has_one() -> None:
    """tracking_error: the failure paragraph; with no run id that is all, with one the run follows."""
    failure = (
        "MLflow tracking at `http://mlflow:5000` failed during training (bad\\|gateway); the metrics were kept in "
        "`reports/train_metrics_local.json`, and the register stage logs the model to MLflow once the server answers."
    )
    down = {"run_id": None, "model_uri": None, "tracking_uri": "http://mlflow:5000", "tracking_error": "bad|gateway"}
    assert report.mlflow_run_markdown(down) == f"## MLflow run\n\n{failure}\n"
    late = {**down, "run_id": "r9", "experiment_id": "2"}
    assert report.mlflow_run_markdown(late) == (
        f"## MLflow run\n\n{failure}\n\n"
        "- run: [r9](http://mlflow:5000/#/experiments/2/runs/r9)\n"
        "- tracking store: `http://mlflow:5000`\n"
    )


COMPARISON = {
    "metric": "accuracy", "challenger": 0.75, "champion": 0.5, "improvement": 0.25, "low": 0.0, "high": 0.5,
    "confidence": 0.9, "rows": 4, "resamples": 10, "seed": 1, "test": "paired bootstrap, 10 resamples",
    "mcnemar": {"challenger_only": 2, "champion_only": 1, "p_value": 1.0},
    "slices": [
        {"slice": "class a", "rows": 2, "metric": "accuracy", "challenger": 1.0, "champion": 0.5, "improvement": 0.5,
         "challenger_only": 1, "champion_only": 0},
        {"slice": "class b", "rows": 2, "metric": "accuracy", "challenger": 0.5, "champion": 0.5, "improvement": 0.0},
    ],
}  # fmt: skip
COMPARISON_MD = (
    "Paired comparison on the same 4 test rows (accuracy):\n"
    "\n"
    "|  |  |\n"
    "|---|---|\n"
    "| challenger | 0.7500 |\n"
    "| champion | 0.5000 |\n"
    "| improvement | 0.2500 |\n"
    "| 90% one-sided bounds | [0.0000, 0.5000] |\n"
    "| test | paired bootstrap, 10 resamples |\n"
    "| McNemar (exact) | only the challenger right on 2 rows, only the champion on 1: p = 1.0000 |\n"
    "\n"
    "By slice (for reading; the decision is on all the rows):\n"
    "\n"
    "| slice | rows | metric | challenger | champion | improvement | only challenger right | only champion right |\n"
    "|---|---|---|---|---|---|---|---|\n"
    "| class a | 2 | accuracy | 1.0000 | 0.5000 | 0.5000 | 1 | 0 |\n"
    "| class b | 2 | accuracy | 0.5000 | 0.5000 | 0.0000 | — | — |"
)


def test_the_paired_comparison_is_a_table_of_evidence_and_one_of_slices() -> None:
    """comparison_markdown: with McNemar and slices (a slice without McNemar counts shows dashes), and without."""
    assert report.comparison_markdown(COMPARISON) == COMPARISON_MD
    plain = {k: v for k, v in COMPARISON.items() if k not in ("mcnemar", "slices")} | {"metric": "rmse"}
    assert report.comparison_markdown(plain) == (
        "Paired comparison on the same 4 test rows (rmse):\n"
        "\n"
        "|  |  |\n"
        "|---|---|\n"
        "| challenger | 0.7500 |\n"
        "| champion | 0.5000 |\n"
        "| improvement | 0.2500 |\n"
        "| 90% one-sided bounds | [0.0000, 0.5000] |\n"
        "| test | paired bootstrap, 10 resamples |"
    )


def test_a_version_that_stays_challenger_says_how_to_load_it_why_it_ran_and_its_lineage() -> None:
    reg = _reg(
        decision="The champion stays v2",
        comparison=COMPARISON,
        why={"summary": "since champion version 2: params: seed: 1 -> 2"},
        tags={"git_commit": "abc", "note": "a|b"},
    )
    assert report.registry_markdown(reg) == (
        "## Registry decision: digits v3\n"
        "\n"
        "**The champion stays v2**\n"
        "\n"
        "|  |  |\n"
        "|---|---|\n"
        "| model version | `models:/digits/3` |\n"
        "| gate metric | accuracy |\n"
        "| v3 | 0.9500 |\n"
        "| previous champion | v2 (0.9667) |\n"
        "| champion now | v2 |\n"
        "\n"
        "Load the champion: `trainflow.serving.load('models:/digits@champion')`\n"
        "\n"
        "Load this run's version: `trainflow.serving.load('models:/digits/3')`\n"
        "\n"
        f"{COMPARISON_MD}\n"
        "\n"
        "Why this run ran: since champion version 2: params: seed: 1 -> 2\n"
        "\n"
        "Lineage tags of this version:\n"
        "\n"
        "| tag | value |\n"
        "|---|---|\n"
        "| git_commit | abc |\n"
        "| note | a\\|b |\n"
    )


def test_a_first_champion_from_an_older_trainflow_has_dashes_and_only_the_champion_to_load() -> None:
    reg = {"model_name": "m", "version": 1, "model_uri": "models:/m/1", "gate_metric": "rmse", "value": 0.5,
           "previous_champion": None, "champion": True, "champion_version": None, "tags": {}}  # fmt: skip
    assert report.registry_markdown(reg) == (
        "## Registry decision: m v1\n"
        "\n"
        "**no decision recorded (registered by an older trainflow)**\n"
        "\n"
        "|  |  |\n"
        "|---|---|\n"
        "| model version | `models:/m/1` |\n"
        "| gate metric | rmse |\n"
        "| v1 | 0.5000 |\n"
        "| previous champion | — |\n"
        "| champion now | — |\n"
        "\n"
        "Load the champion: `trainflow.serving.load('models:/m@champion')`\n"
    )
    unscored = report.registry_markdown({**reg, "previous_champion": 0, "champion_version": 0, "decision": "kept"})
    assert "| previous champion | v0 (—) |\n| champion now | v0 |\n" in unscored
    assert report.decision_line({"decision": ""}) == "no decision recorded (registered by an older trainflow)"


def test_the_artifacts_are_each_report_under_its_key_and_description(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    assert report.artifacts(paths) == []
    write_json(paths.metrics, {"accuracy": 0.5})
    write_json(paths.train_run, {"run_id": "r", "experiment_id": "1", "tracking_uri": "https://m"})
    reg = {"model_name": "m", "version": 1, "model_uri": "models:/m/1", "gate_metric": "accuracy", "value": 0.5,
           "previous_champion": None, "champion": True, "champion_version": 1, "decision": "first"}  # fmt: skip
    write_json(paths.registration, reg)
    (paths.reports / "card.md").write_text("# Model card: m v1\n", encoding="utf-8")
    assert report.artifacts(paths) == [
        report.Artifact(
            "training-metrics",
            "Test metrics of this run's model beside the champion's",
            "## Test metrics: m v1\n\n| metric | this run (v1) | champion before it |\n|---|---|---|\n"
            "| **accuracy** (gate, higher is better) | 0.5000 | — |\n\n"
            "No earlier champion: this is the first version of the model.\n",
        ),
        report.Artifact(
            "mlflow-run",
            "The MLflow run that trained the model",
            "## MLflow run\n\n- run: [r](https://m/#/experiments/1/runs/r)\n- tracking store: `https://m`\n",
        ),
        report.Artifact("model-card", "The registered version's model card", "# Model card: m v1\n"),
        report.Artifact(
            "registry-decision",
            "Registry version and champion decision",
            "## Registry decision: m v1\n\n**first**\n\n|  |  |\n|---|---|\n| model version | `models:/m/1` |\n"
            "| gate metric | accuracy |\n| v1 | 0.5000 |\n| previous champion | — |\n| champion now | v1 |\n\n"
            "Load the champion: `trainflow.serving.load('models:/m@champion')`\n",
        ),
    ]


def _schema(paths: Paths, **changes: object) -> None:
    schema = Schema(source="data/raw/t.csv", target="y", task="classification", features=["a", "b"],
                    kinds={"a": "numeric", "b": "numeric"}, classes=["0", "1"], n_rows=4)  # fmt: skip
    write_json(paths.split_schema, schema.to_json() | changes)


def test_the_summary_names_the_stages_run_the_task_the_metrics_and_the_new_champion(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    _schema(paths, task_reason="target 'y' holds 2 labels", data_params={"features": ["a", "b"]})
    write_json(paths.metrics, {"accuracy": 0.75, "n_test": 4})
    write_json(paths.registration, {"model_name": "m", "model_uri": "models:/m/3", "champion": True,
                                    "champion_version": 3, "gate_metric": "accuracy", "value": 0.75,
                                    "decision": "promoted"})  # fmt: skip
    results = {"ingest": {"skipped": True}, "train": {}, "register": {"skipped": False}}
    assert report.summary(paths, results).split("\n") == [
        "",
        "trainflow: pipeline finished",
        "  stages run: train, register",
        "  task:     classification (target 'y' holds 2 labels)",
        "  features: 2 used: a, b (data.features: [a, b])",
        f"  metrics:  {paths.metrics}  (accuracy=0.7500, n_test=4)",
        f"  model:    {paths.final}",
        f"  plots:    {paths.plots}",
        "  registry: models:/m/3 (now champion; accuracy=0.7500)",
        "  decision: promoted",
        "  load it:  trainflow.serving.load('models:/m@champion')",
    ]


def test_the_summary_of_a_run_with_nothing_to_do_says_the_version_came_from_an_earlier_run(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    _schema(paths)
    reg = {"model_name": "m", "model_uri": "models:/m/3", "champion": False, "champion_version": 2,
           "gate_metric": "rmse", "value": 0.5, "decision": "no new version: the data did not change"}  # fmt: skip
    write_json(paths.registration, reg)
    assert report.summary(paths, {"train": {"skipped": True}}).split("\n") == [
        "",
        "trainflow: pipeline finished",
        "  stages run: none (everything up to date)",
        "  task:     classification (from the schema)",
        f"  model:    {paths.final}",
        f"  plots:    {paths.plots}",
        "  registry: models:/m/3 (registered by an earlier run; champion stays version 2; rmse=0.5000)",
        "  decision: no new version: the data did not change",
        "  load it:  trainflow.serving.load('models:/m/3')",
    ]
    write_json(paths.registration, reg | {"champion": True, "decision": None})
    lines = report.summary(paths, {"register": {"skipped": True}}).split("\n")
    assert lines[-2:] == [
        "  registry: models:/m/3 (registered by an earlier run; champion; rmse=0.5000)",
        "  load it:  trainflow.serving.load('models:/m@champion')",
    ]
    assert report.load_uri({"model_name": "m", "model_uri": "models:/m/3"}) == "models:/m/3"


def test_the_features_line_says_what_features_and_exclude_left_in() -> None:
    def schema(**changes: object) -> Schema:
        base = {"source": "s", "target": "y", "task": "regression", "features": ["a", "b"], "kinds": {},
                "classes": [], "n_rows": 1}  # fmt: skip
        return Schema(**(base | changes))  # type: ignore[arg-type]

    assert report.features_line(schema()) is None
    assert report.features_line(schema(data_params={"exclude": []})) is None
    assert report.features_line(schema(data_params={"exclude": ["c", "d"]})) == "2 used: a, b (data.exclude: [c, d])"
    assert (
        report.features_line(
            schema(features=[], text_column="t", image_column="img", data_params={"features": [], "exclude": ["x"]})
        )
        == "2 used: t, img (data.features: []; data.exclude: [x])"
    )
    assert report.features_line(schema(features=[], data_params={"features": []})) == "0 used: none (data.features: [])"
    names = [f"f{i}" for i in range(14)]
    assert report.features_line(schema(features=names, data_params={"features": names})) == (
        "14 used: " + ", ".join(names[:12]) + ", ... (2 more) (data.features: [" + ", ".join(names) + "])"
    )
    twelve = names[:12]
    assert report.features_line(schema(features=twelve, data_params={"features": ["f0"]})) == (
        "12 used: " + ", ".join(twelve) + " (data.features: [f0])"
    )


# --------------------------------------------------------------------------------------------------------------------
# card: the model card
# --------------------------------------------------------------------------------------------------------------------


def test_a_card_number_has_four_significant_digits() -> None:
    assert card._fmt(0.123456) == "0.1235"
    assert card._fmt(1.0) == "1"
    assert card._fmt(1e-5) == "1e-05"
    assert card._fmt(12345.0) == "1.234e+04"
    assert card._fmt(7) == "7"
    assert card._fmt("x") == "x"


def _four_rows() -> gate.Scored:
    # right, right, wrong, right: accuracy 0.75
    return gate.Scored(np.array([0, 1, 1, 0]), np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.7, 0.3]]))


def test_an_interval_is_the_2_5_and_97_5_percentiles_of_2000_seeded_resamples_of_the_rows() -> None:
    """accuracy and log_loss get a bootstrap interval (numpy, from the same seeded draw), f1_macro none; n_test is
    not a metric row; rows are sorted by name and say which way is better."""
    scored = _four_rows()
    right = np.array([1.0, 1.0, 0.0, 1.0])
    loss = -np.log(np.array([0.9, 0.8, 0.4, 0.7]))

    def interval(values: np.ndarray, seed: int) -> str:
        idx = np.random.default_rng(seed).integers(0, len(values), size=(2000, len(values)))
        boot = values[idx].mean(axis=1)
        return f"[{np.quantile(boot, 0.025):.4g}, {np.quantile(boot, 0.975):.4g}]"

    metrics = {"n_test": 4, "log_loss": float(loss.mean()), "f1_macro": 0.7333, "accuracy": 0.75}
    assert card.intervals(metrics, scored, seed=5) == [
        ["accuracy", "0.75", interval(right, 5), "higher is better"],
        ["f1_macro", "0.7333", "—", "higher is better"],
        ["log_loss", f"{loss.mean():.4g}", interval(loss, 5), "lower is better"],
    ]
    y = np.arange(10.0)
    errors = np.array([0.1, 0.5, 1.3, 0.2, 2.9, 0.7, 0.05, 1.1, 0.4, 3.3])
    ten = gate.Scored(y, y + errors)
    assert interval(errors, 5) != interval(errors, 6)
    for seed in (5, 6):  # the seed is the one given
        assert card.intervals({"mae": 1.0}, ten, seed=seed) == [["mae", "1", interval(errors, seed), "lower is better"]]
    assert card.intervals({"accuracy": 1}, None, seed=5) == [["accuracy", "1", "—", "higher is better"]]
    empty = gate.Scored(np.array([], dtype=np.int64), np.zeros((0, 2)))
    assert card.intervals({"accuracy": 1.0}, empty, seed=5) == [["accuracy", "1", "—", "higher is better"]]


def test_r2_gets_an_interval_from_the_resamples_whose_labels_vary_and_none_when_none_do() -> None:
    labels = np.array([1.0, 2.0, 3.0])
    scored = gate.Scored(labels, labels.copy())  # perfect: r2 is 1 on every resample with varied labels
    assert card.intervals({"r2": 1.0, "mae": 0.0}, scored, seed=0) == [
        ["mae", "0", "[0, 0]", "lower is better"],
        ["r2", "1", "[1, 1]", "higher is better"],
    ]
    one = gate.Scored(np.array([2.0]), np.array([2.5]))  # every resample has one label: r2 is never finite
    assert card.intervals({"r2": 0.0}, one, seed=0) == [["r2", "0", "—", "higher is better"]]


def test_the_card_leaves_out_intervals_when_the_resamples_would_be_too_big() -> None:
    """n * 2000 resampled indices must stay under 5e7 (400 MB): at 25,000 rows no interval is drawn."""
    n = 25_000
    big = gate.Scored(np.zeros(n, dtype=np.int64), np.tile([0.9, 0.1], (n, 1)))
    assert card.intervals({"accuracy": 1.0}, big, seed=0) == [["accuracy", "1", "—", "higher is better"]]


def test_calibration_bins_the_top_probability_by_tenths_and_a_certain_row_goes_in_the_last() -> None:
    outputs = np.array([[0.95, 0.05], [0.15, 0.85], [0.66, 0.34], [0.72, 0.28], [0.62, 0.38], [1.0, 0.0]])
    labels = np.array([0, 1, 1, 0, 0, 1])  # right, right, wrong, right, right, wrong
    assert card.calibration(gate.Scored(labels, outputs)) == [
        ["0.6–0.7", "2", "0.640", "0.500"],
        ["0.7–0.8", "1", "0.720", "1.000"],
        ["0.8–0.9", "1", "0.850", "1.000"],
        ["0.9–1.0", "2", "0.975", "0.500"],
    ]
    low = gate.Scored(np.array([2]), np.array([[0.34, 0.33, 0.33]]))
    assert card.calibration(low) == [["0.3–0.4", "1", "0.340", "0.000"]]


def _project(tmp_path: Path) -> Paths:
    paths = Paths(tmp_path)
    paths.splits.mkdir(parents=True)
    for split, ys in (("train", ["a", "b", "a"]), ("val", ["b"]), ("test", ["a", "b"])):
        pd.DataFrame({"x": range(len(ys)), "y": ys}).to_parquet(paths.split_file(split))
    return paths


FULL_REG = {
    "model_name": "digits",
    "version": 3,
    "decision": "promoted: better",
    "tags": {"git_commit": "abc", "git_dirty": "true", "data_hash": "d1.dir", "params_hash": "p1",
             "mlflow_run_id": "r|1", "model_sha256": "s1", "task": "classification", "target": "y"},
    "why": {"summary": "since champion version 2: params: seed: 1 -> 2", "params": ["seed: 1 -> 2"],
            "data": ["t.csv: +1 rows (2 -> 3)", "u.csv: removed (4 rows)"]},
    "comparison": {"challenger": 1.0, "champion": 0.5, "improvement": 0.5, "confidence": 0.95, "low": 0.0,
                   "high": 1.0, "test": "paired bootstrap",
                   "slices": [{"slice": "class a", "rows": 1, "metric": "accuracy", "challenger": 1.0,
                               "champion": 1.0, "improvement": 0.0}]},
}  # fmt: skip

FULL_CARD = """# Model card: digits v3

## Lineage

Why this run ran: since champion version 2: params: seed: 1 -> 2

|  |  |
|---|---|
| git commit | abc (uncommitted changes) |
| data (DVC hash of data/splits) | d1.dir |
| params hash | p1 |
| MLflow run | r\\|1 |
| model sha256 | s1 |

| params changed since the champion |
|---|
| seed: 1 -> 2 |

## Data

Changes to the data since the champion: t.csv: +1 rows (2 -> 3); u.csv: removed (4 rows)

| split | rows |
|---|---|
| train | 3 |
| val | 1 |
| test | 2 |

| class | train | val | test |
|---|---|---|---|
| a | 2 | 0 | 1 |
| b | 1 | 1 | 1 |

## Test metrics

On 2 test rows. Decision: promoted: better

| metric | value | 95% interval (bootstrap) |  |
|---|---|---|---|
| accuracy | 1 | [1, 1] | higher is better |
| f1_macro | 1 | — | higher is better |

## Against the champion (paired, on the same test rows)

|  |  |
|---|---|
| challenger | 1 |
| champion | 0.5 |
| improvement | 0.5 |
| 95% one-sided bounds | [0, 1] |
| test | paired bootstrap |

| slice | rows | metric | challenger | champion | improvement |
|---|---|---|---|---|---|
| class a | 1 | accuracy | 1 | 1 | 0 |

## Calibration and classes

| confidence | rows | mean confidence | accuracy |
|---|---|---|---|
| 0.7–0.8 | 1 | 0.750 | 1.000 |
| 0.9–1.0 | 1 | 0.950 | 1.000 |

| class | precision | recall | support |
|---|---|---|---|
| a | 1 | 0.5 | 2 |
| b | 0.6667 | 1 | 1 |

## Plots

![training curves](training_curves.png)

![ROC and precision-recall](roc_pr.png)
"""


def test_the_card_of_a_classifier_against_a_champion_is_every_section_in_order(tmp_path: Path) -> None:
    """Lineage (dirty commit, why, params changed), data (rows, classes per split, data changes), test metrics,
    the paired comparison with slices, calibration and per-class, and the plots that exist."""
    paths = _project(tmp_path)
    paths.reports.mkdir(parents=True)
    paths.per_class.write_text("class,precision,recall,support\na,1.0,0.5,2\nb,0.66666,1.0,1\n", encoding="utf-8")
    paths.test_plots.mkdir(parents=True)
    (paths.reports / "plots" / "training_curves.png").write_bytes(b"PNG")
    (paths.test_plots / "roc_pr.png").write_bytes(b"PNG")
    scored = gate.Scored(np.array([0, 1]), np.array([[0.95, 0.05], [0.25, 0.75]]))
    parts = card.sections(paths, FULL_REG, {"accuracy": 1.0, "f1_macro": 1.0, "n_test": 2}, scored, seed=0)
    assert card.markdown("Model card: digits v3", parts) == FULL_CARD


MINIMAL_CARD = """# Model card: house v1

## Lineage

|  |  |
|---|---|
| git commit | — |
| data (DVC hash of data/splits) | — |
| params hash | — |
| MLflow run | — |
| model sha256 | — |

## Data

| split | rows |
|---|---|
| train | 0 |
| val | 0 |
| test | 0 |

## Test metrics

On ? test rows. Decision: —

| metric | value | 95% interval (bootstrap) |  |
|---|---|---|---|
| rmse | 0.5 | — | lower is better |

## Plots
"""


def test_the_card_of_a_regressor_with_no_lineage_or_splits_has_dashes_and_zeros(tmp_path: Path) -> None:
    """Tags, why, a comparison and the splits all missing; no scored outputs: no calibration section. write()
    puts the same Markdown in reports/card.md, and the HTML page beside it."""
    paths = Paths(tmp_path)
    reg = {"model_name": "house", "version": 1, "tags": {"git_dirty": "false", "task": "regression", "target": "y"},
           "why": {}}  # fmt: skip
    written = card.write(paths, reg, {"rmse": 0.5}, None, seed=0)
    assert written == [paths.reports / "card.md", paths.reports / "card.html"]
    assert written[0].read_text(encoding="utf-8") == MINIMAL_CARD
    html = written[1].read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Model card: house v1</title>")
    assert html.endswith("<h2>Plots</h2></body></html>\n")
    regression = gate.Scored(np.array([1.0, 2.0]), np.array([1.5, 2.5]))  # outputs [n]: no calibration either
    titles = [s.title for s in card.sections(paths, reg, {"rmse": 0.5}, regression, seed=0)]
    assert titles == ["Lineage", "Data", "Test metrics", "Plots"]


STYLE = (
    "body{font-family:sans-serif;max-width:960px;margin:2em auto;color:#222}"
    "table{border-collapse:collapse;margin:0.5em 0 1em}td,th{border:1px solid #ccc;padding:2px 8px;"
    "text-align:left}img{max-width:100%}"
)


def test_the_html_page_escapes_text_and_embeds_the_plots(tmp_path: Path) -> None:
    png = tmp_path / "p.png"
    png.write_bytes(b"PNG")  # base64: UE5H
    parts = [
        card.Section("A<b>", text=["x & y"], tables=[(["h", "i"], [["<c>", "d"]])], images=[('c"ap', png)]),
        card.Section("Empty"),
    ]
    assert card.page("T&C", parts) == (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>T&amp;C</title><style>{STYLE}</style></head><body>"
        "<h1>T&amp;C</h1><h2>A&lt;b&gt;</h2><p>x &amp; y</p>"
        "<table><tr><th>h</th><th>i</th></tr><tr><td>&lt;c&gt;</td><td>d</td></tr></table>"
        '<figure><img alt="c&quot;ap" src="data:image/png;base64,UE5H"><figcaption>c&quot;ap</figcaption></figure>'
        "<h2>Empty</h2></body></html>\n"
    )
    assert card.markdown("T", parts) == (
        '# T\n\n## A<b>\n\nx & y\n\n| h | i |\n|---|---|\n| <c> | d |\n\n![c"ap](p.png)\n\n## Empty\n'
    )


# --------------------------------------------------------------------------------------------------------------------
# why: what changed since the champion
# --------------------------------------------------------------------------------------------------------------------


def test_data_files_are_rows_and_sha256_per_file_sorted_by_name(tmp_path: Path) -> None:
    (tmp_path / "b.csv").write_bytes(b"x\n1\n2\n")
    (tmp_path / "a.csv").write_bytes(b"x\n3\n")
    big = b"0123456789" * 150_000  # over one read block (1 MiB)
    (tmp_path / "c.csv").write_bytes(big)
    paths = [tmp_path / "b.csv", tmp_path / "a.csv", tmp_path / "c.csv"]
    got = changes.data_files(["data/b.csv", "data/a.csv", "data/c.csv"], [2, 1, 7], paths, group_by_folder=False)
    assert got == {
        "data/a.csv": {"rows": 1, "sha256": hashlib.sha256(b"x\n3\n").hexdigest()},
        "data/b.csv": {"rows": 2, "sha256": hashlib.sha256(b"x\n1\n2\n").hexdigest()},
        "data/c.csv": {"rows": 7, "sha256": hashlib.sha256(big).hexdigest()},
    }
    assert list(got) == ["data/a.csv", "data/b.csv", "data/c.csv"]
    with pytest.raises(ValueError):  # a row count for each file, no fewer
        changes.data_files(["data/b.csv", "data/a.csv"], [2], [tmp_path / "b.csv", tmp_path / "a.csv"], False)
    images = [tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "a.csv"]
    folders = changes.data_files(["img/dog/1.png", "img/cat/2.png", "img/cat/1.png"], [1, 1, 1], images, True)
    assert folders == {
        "img/cat/": {"rows": 2, "sha256": hashlib.sha256(b"x\n1\n2\n" + b"x\n3\n").hexdigest()},
        "img/dog/": {"rows": 1, "sha256": hashlib.sha256(b"x\n3\n").hexdigest()},
    }


def test_the_data_tag_is_compact_json_up_to_the_limit_and_a_digest_past_it() -> None:
    """The compact form has no spaces and 12 hex of each hash; at exactly TAG_LIMIT characters it is kept."""
    sha = "0123456789abcdef" * 4
    assert changes.data_tag({"a.csv": {"rows": 3, "sha256": sha}, "b.csv": {"rows": 0, "sha256": sha}}) == (
        '{"a.csv":[3,"0123456789ab"],"b.csv":[0,"0123456789ab"]}'
    )
    at_limit = {"n" * (changes.TAG_LIMIT - 23): {"rows": 1, "sha256": sha}}  # '{"' + name + '":[1,"' + 12 + '"]}'
    assert len(changes.data_tag(at_limit)) == changes.TAG_LIMIT == 4500
    assert json.loads(changes.data_tag(at_limit)) == {"n" * 4477: [1, "0123456789ab"]}
    over = {"n" * 4478: {"rows": 1, "sha256": sha}, "m": {"rows": 2, "sha256": sha}}
    compact = json.dumps({k: [v["rows"], sha[:12]] for k, v in over.items()}, separators=(",", ":"))
    digest = hashlib.sha256(compact.encode()).hexdigest()[:16]
    assert changes.data_tag(over) == f'{{"files": 2, "rows": 3, "digest": "{digest}"}}'


def test_data_changes_name_each_file_new_removed_grown_or_edited() -> None:
    sha, other = "a" * 64, "b" * 64
    then = changes.data_tag({"gone.csv": {"rows": 4, "sha256": sha}, "grew.csv": {"rows": 2, "sha256": sha},
                         "edit.csv": {"rows": 5, "sha256": sha}, "same.csv": {"rows": 1, "sha256": sha}})  # fmt: skip
    now = {"grew.csv": {"rows": 3, "sha256": other}, "edit.csv": {"rows": 5, "sha256": other},
           "same.csv": {"rows": 1, "sha256": sha}, "new.csv": {"rows": 7, "sha256": sha}}  # fmt: skip
    assert changes._data_changes(then, now) == [
        "edit.csv: the same 5 rows, other content",
        "gone.csv: removed (4 rows)",
        "grew.csv: +1 rows (2 -> 3)",
        "new.csv: new file, 7 rows",
    ]
    assert changes._data_changes(None, now) is None
    assert changes._data_changes(changes.data_tag(now), now) == []


def test_data_changes_against_a_digest_tag_are_one_sentence_with_question_marks_for_what_a_list_lacks() -> None:
    many = {f"p{i:04d}-{'x' * 20}.csv": {"rows": 10, "sha256": "f" * 64} for i in range(200)}
    assert "digest" in changes.data_tag(many)
    listed = changes.data_tag({"a.csv": {"rows": 1, "sha256": "f" * 64}})
    assert changes._data_changes(listed, many) == [
        "the data changed (? -> 2000 rows over ? -> 200 files; too many files to list)"
    ]
    assert changes._data_changes(changes.data_tag(many), {"a.csv": {"rows": 1, "sha256": "f" * 64}}) == [
        "the data changed (2000 -> ? rows over 200 -> ? files; too many files to list)"
    ]
    assert changes._data_changes(changes.data_tag(many), many) == []


def test_param_changes_are_old_to_new_sorted_with_unset_for_a_missing_side() -> None:
    assert changes._param_changes({"a": "1", "b": "2", "d": "5"}, {"b": "3", "c": "4", "d": "5"}) == [
        "a: 1 -> (unset)",
        "b: 2 -> 3",
        "c: (unset) -> 4",
    ]
    assert changes._param_changes(None, {"a": "1"}) is None
    assert changes._param_changes({}, {}) == []


def test_code_changes_are_the_package_and_root_modules_git_changed_and_unknown_without_a_commit(tmp_path: Path) -> None:
    assert changes._code_changes(tmp_path, None, "c1", False) is None
    assert changes._code_changes(tmp_path, "", "c1", False) is None
    assert changes._code_changes(tmp_path, "unknown", "c1", False) is None
    assert changes._code_changes(tmp_path, "c1", "unknown", False) is None
    assert changes._code_changes(tmp_path, "c1", "c1", False) == []  # same commit, clean: no git needed
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@t")
    _git(tmp_path, "config", "user.name", "t")
    for name in ("model.py", "trainflow/a.py", "sub/b.py", "notes.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("1\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "one")
    one = _git(tmp_path, "rev-parse", "HEAD")
    for name in ("model.py", "trainflow/a.py", "sub/b.py", "notes.txt"):
        (tmp_path / name).write_text("2\n")
    _git(tmp_path, "commit", "-qam", "two")
    two = _git(tmp_path, "rev-parse", "HEAD")
    assert changes._code_changes(tmp_path, one, two, False) == ["model.py", "trainflow/a.py"]
    assert changes._code_changes(tmp_path, "0" * 40, two, False) is None  # not in this clone
    _git(tmp_path, "tag", "unknown", one)  # even where "unknown" names a commit, it stands for no commit recorded
    assert changes._code_changes(tmp_path, "unknown", two, False) is None
    assert changes._code_changes(tmp_path, one, "unknown", False) is None
    (tmp_path / "model.py").write_text("3\n")
    (tmp_path / "sub/b.py").write_text("3\n")
    assert changes._code_changes(tmp_path, two, two, True) == ["model.py (uncommitted)"]
    assert changes._code_changes(tmp_path, one, two, True) == ["model.py", "trainflow/a.py"]
    assert changes._code_changes(tmp_path, one, two, False) == ["model.py", "trainflow/a.py"]
    # explain asks git in the project it is given, and says what is uncommitted there
    champion = SimpleNamespace(version="1", tags={"git_commit": one})
    assert changes.explain(tmp_path, champion, {}, None, {}, two, True)["code"] == ["model.py", "trainflow/a.py"]
    champion = SimpleNamespace(version="2", tags={"git_commit": two})
    assert changes.explain(tmp_path, champion, {}, None, {}, two, True)["summary"] == (
        "since champion version 2: data: unknown | code: model.py (uncommitted)"
    )


def test_explain_is_the_whole_why_dict_for_a_first_version_a_repeat_and_a_change() -> None:
    root = Path("/nonexistent")  # same commit and a clean tree: git is never asked
    files = {"t.csv": {"rows": 2, "sha256": "a" * 64}}
    params = {"seed": "1"}
    assert changes.explain(root, None, None, files, params, "c1", False) == {
        "compared_with": None,
        "summary": "the first version of this model: nothing to compare with",
    }
    champion = SimpleNamespace(version="4", tags={changes.DATA_TAG: changes.data_tag(files), "git_commit": "c1"})
    assert changes.explain(root, champion, params, files, params, "c1", False) == {
        "compared_with": 4,
        "data": [],
        "params": [],
        "code": [],
        "summary": "nothing changed since champion version 4 (data, params and code are the same): a scheduled or "
        "repeated run",
    }
    assert changes.explain(root, champion, params, None, {"seed": "2"}, "c1", False) == {
        "compared_with": 4,
        "data": None,
        "params": ["seed: 1 -> 2"],
        "code": [],
        "summary": "since champion version 4: data: unknown | params: seed: 1 -> 2",
    }
    # the data and code the same but the champion's params unknown: not "nothing changed"
    unknown_params = changes.explain(root, champion, None, files, params, "c1", False)
    assert unknown_params["summary"] == "since champion version 4: params: unknown"
    no_data_tag = SimpleNamespace(version="4", tags={"git_commit": "c1"})
    assert changes.explain(root, no_data_tag, params, files, params, "c1", False)["summary"] == (
        "since champion version 4: data: unknown"
    )
    no_commit = SimpleNamespace(version="4", tags={changes.DATA_TAG: changes.data_tag(files)})
    assert changes.explain(root, no_commit, params, files, params, "c1", False)["summary"] == (
        "since champion version 4: code: unknown"
    )


def test_explain_lists_twenty_changes_of_a_kind_and_counts_the_rest() -> None:
    then = {f"p{i:02d}": "0" for i in range(22)}
    now = {f"p{i:02d}": "1" for i in range(22)}
    champion = SimpleNamespace(version="1", tags={"git_commit": "c"})
    got = changes.explain(Path("/nonexistent"), champion, then, None, now, "c", False)
    assert got["params"] == [f"p{i:02d}: 0 -> 1" for i in range(22)]
    shown = "; ".join(f"p{i:02d}: 0 -> 1" for i in range(20))
    assert got["summary"] == f"since champion version 1: data: unknown | params: {shown}; ... and 2 more"
    twenty = changes.explain(Path("/nonexistent"), champion, {k: then[k] for k in list(then)[:20]},
                         None, {k: now[k] for k in list(now)[:20]}, "c", False)  # fmt: skip
    assert twenty["summary"] == f"since champion version 1: data: unknown | params: {shown}"


# --------------------------------------------------------------------------------------------------------------------
# gate: the paired comparison and the decision
# --------------------------------------------------------------------------------------------------------------------


def test_per_row_values_are_hit_or_miss_log_loss_absolute_and_squared_errors() -> None:
    clf = gate.Scored(np.array([0, 1, 1]), np.array([[0.9, 0.1], [0.2, 0.8], [1.0, 0.0]]))
    np.testing.assert_array_equal(gate.per_row("accuracy", clf), [1.0, 1.0, 0.0])
    assert gate.per_row("accuracy", clf).dtype == np.float64
    np.testing.assert_allclose(gate.per_row("log_loss", clf), [-math.log(0.9), -math.log(0.8), -math.log(1e-15)])
    # a probability rounded a hair above 1 (softmax in float32) is 1: no row's loss is negative
    over = gate.Scored(np.array([0]), np.array([[1.0 + 1e-6, -1e-6]]))
    assert gate.per_row("log_loss", over).tolist() == [0.0]
    reg = gate.Scored(np.array([1.0, 2.0, 4.0]), np.array([2.0, 2.0, 1.0]))
    np.testing.assert_array_equal(gate.per_row("mae", reg), [1.0, 0.0, 3.0])
    np.testing.assert_array_equal(gate.per_row("rmse", reg), [1.0, 0.0, 9.0])
    np.testing.assert_array_equal(gate.per_row("r2", reg), [1.0, 0.0, 9.0])
    assert gate.per_row("f1_macro", clf) is None


def test_resampled_metrics_on_hand_picked_resamples() -> None:
    reg = gate.Scored(np.array([1.0, 2.0, 4.0]), np.array([2.0, 2.0, 1.0]))  # squared errors 1, 0, 9
    idx = np.array([[0, 1, 2], [2, 2, 1], [1, 1, 1]])
    np.testing.assert_allclose(gate.resampled("rmse", reg, idx), [math.sqrt(10 / 3), math.sqrt(6), 0.0])
    np.testing.assert_allclose(gate.resampled("mae", reg, idx), [4 / 3, 2.0, 0.0])
    # r2 = 1 - mse / variance of the resample's labels: [1,2,4] var 14/9; [4,4,2] var 8/9; [2,2,2] var 0 (0/0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a resample of equal labels is an r2 of nan or -inf, not a RuntimeWarning
        r2 = gate.resampled("r2", reg, idx)
        constant = gate.resampled("r2", reg, np.array([[2, 2, 2]]))  # squared error 9 over a variance of 0
    np.testing.assert_allclose(r2[:2], [1 - (10 / 3) / (14 / 9), 1 - 6 / (8 / 9)])
    assert math.isnan(r2[2])
    assert constant.tolist() == [-math.inf]
    assert gate.metric_value("rmse", reg) == pytest.approx(math.sqrt(10 / 3))


def test_mcnemar_counts_the_rows_only_one_model_gets_right_and_its_exact_p_values() -> None:
    labels = np.array([0, 0, 0, 0, 0])
    right, wrong = [0.9, 0.1], [0.1, 0.9]
    new = gate.Scored(labels, np.array([right, right, right, right, wrong]))
    old = gate.Scored(labels, np.array([wrong, wrong, wrong, right, wrong]))
    # 3 rows only the challenger gets right, none only the champion: P(X <= 0) = 1/8 of Binomial(3, 1/2)
    assert gate.mcnemar(new, old) == {
        "challenger_only": 3, "champion_only": 0, "p_value": 0.25, "p_better": 0.125, "p_worse": 1.0,
    }  # fmt: skip
    # 2 and 1 of n = 3: P(X <= 1) = 4/8, two-sided 1.0; P(X <= 2) = 7/8
    mixed = gate.Scored(labels, np.array([right, right, wrong, right, wrong]))
    old2 = gate.Scored(labels, np.array([wrong, wrong, right, right, wrong]))
    assert gate.mcnemar(mixed, old2) == {
        "challenger_only": 2, "champion_only": 1, "p_value": 1.0, "p_better": 0.5, "p_worse": 0.875,
    }  # fmt: skip
    assert gate.mcnemar(new, new) == {
        "challenger_only": 0, "champion_only": 0, "p_value": 1.0, "p_better": 1.0, "p_worse": 1.0,
    }  # fmt: skip


def test_the_comparison_tags_hold_the_evidence_with_mcnemar_only_for_accuracy() -> None:
    c = gate.Comparison(metric="mae", challenger=0.5, champion=0.75, improvement=0.25, low=0.125, high=0.5,
                        confidence=0.9, rows=4, resamples=10, seed=1, test="t")  # fmt: skip
    assert c.tags() == {"gate.improvement": "0.25", "gate.bounds": "[0.125, 0.5] at 0.9 one-sided", "gate.test": "t"}
    c.mcnemar = {"challenger_only": 3, "champion_only": 0, "p_value": 0.25, "p_better": 0.125, "p_worse": 1.0}
    assert c.tags() == {
        "gate.improvement": "0.25",
        "gate.bounds": "[0.125, 0.5] at 0.9 one-sided",
        "gate.test": "t",
        "gate.mcnemar": "challenger only right on 3 rows, champion only on 0; p = 0.25",
    }


def test_slicing_names_new_and_old_rows_and_each_class() -> None:
    """New since the champion's split: the rows its split never held (-1), whatever split it held the others in."""
    labels = np.array([0, 1, 1, 0])
    s = gate.Slicing(classes=["x", "y"])
    masks = s.masks(labels, held=np.array([2, 0, -1, 1]))
    assert list(masks) == ["rows new since the champion's split", "rows the champion's split had", "class x", "class y"]
    assert {k: v.tolist() for k, v in masks.items()} == {
        "rows new since the champion's split": [False, False, True, False],
        "rows the champion's split had": [True, True, False, True],
        "class x": [True, False, False, True],
        "class y": [False, True, True, False],
    }
    assert list(s.masks(labels, held=None)) == ["class x", "class y"]
    assert list(gate.Slicing(None).masks(labels, np.array([0, -1]))) == []  # held of other rows
    assert list(gate.Slicing(None).masks(labels, None)) == []


def test_sliced_scores_both_models_on_each_nonempty_slice() -> None:
    labels = np.array([0, 1, 1, 0])
    right, wrong = {0: [0.9, 0.1], 1: [0.1, 0.9]}, {0: [0.1, 0.9], 1: [0.9, 0.1]}
    new = gate.Scored(labels, np.array([right[0], right[1], wrong[1], right[0]]))
    old = gate.Scored(labels, np.array([wrong[0], right[1], right[1], right[0]]))
    c = gate.Comparison("f1_macro", 0.0, 0.0, 0.0, 0.0, 0.0, 0.9, 4, 10, 0, "t")  # no per-row f1: slices use accuracy
    masks = {"class 0": labels == 0, "none": np.zeros(4, dtype=bool), "class 1": labels == 1}
    gate.sliced(c, new, old, masks)
    assert c.slices == [
        {"slice": "class 0", "rows": 2, "metric": "accuracy", "challenger": 1.0, "champion": 0.5, "improvement": 0.5,
         "challenger_only": 1, "champion_only": 0},
        {"slice": "class 1", "rows": 2, "metric": "accuracy", "challenger": 0.5, "champion": 1.0,
         "improvement": -0.5, "challenger_only": 0, "champion_only": 1},
    ]  # fmt: skip
    # a per-row gate metric is kept for the slices; log_loss is lower-is-better, so improvement is champion - new
    ll = gate.Comparison("log_loss", 0.0, 0.0, 0.0, 0.0, 0.0, 0.9, 4, 10, 0, "t")
    gate.sliced(ll, new, old, {"class 0": labels == 0})
    loss_new, loss_old = -math.log(0.9), (-math.log(0.1) - math.log(0.9)) / 2
    assert ll.slices == [
        {"slice": "class 0", "rows": 2, "metric": "log_loss", "challenger": pytest.approx(loss_new),
         "champion": pytest.approx(loss_old), "improvement": pytest.approx(loss_old - loss_new),
         "challenger_only": 1, "champion_only": 0},
    ]  # fmt: skip
    y = np.array([1.0, 2.0, 3.0])
    r = gate.Comparison("mae", 0.0, 0.0, 0.0, 0.0, 0.0, 0.9, 3, 10, 0, "t")
    gate.sliced(r, gate.Scored(y, y + 1), gate.Scored(y, y + 3), {"all": np.ones(3, dtype=bool)})
    assert r.slices == [{"slice": "all", "rows": 3, "metric": "mae", "challenger": 1.0, "champion": 3.0,
                         "improvement": 2.0}]  # fmt: skip


def _c(
    low: float, high: float, metric: str = "mae", mcnemar: dict[str, float] | None = None, confidence: float = 0.95
) -> gate.Comparison:
    return gate.Comparison(metric=metric, challenger=0.5, champion=1.0, improvement=0.5, low=low, high=high,
                           confidence=confidence, rows=40, resamples=10, seed=0, test="t", mcnemar=mcnemar)  # fmt: skip


HEAD = "mae 0.5 vs the champion's 1 on the same 40 test rows"


def test_decide_better_promotes_only_when_the_lower_bound_clears_the_margin() -> None:
    assert gate.decide(_c(0.2, 0.8), "better", 0.1) == (
        True,
        f"{HEAD}, improvement +0.5, 95% bounds [+0.2, +0.8]: better by more than 0.1 with 95% confidence "
        "(the lower bound is +0.2)",
    )
    assert gate.decide(_c(0.2, 0.8), "better", 0.2) == (
        False,
        f"{HEAD}, improvement +0.5, 95% bounds [+0.2, +0.8]: not shown better by more than 0.2 with 95% confidence "
        "(the lower bound is +0.2)",
    )


def test_decide_better_on_accuracy_needs_mcnemar_below_one_minus_the_confidence_too() -> None:
    head = "accuracy 0.5 vs the champion's 1 on the same 40 test rows, improvement +0.5, 95% bounds [+0.2, +0.8]"
    m = {"p_better": 0.04, "p_worse": 0.9}
    assert gate.decide(_c(0.2, 0.8, "accuracy", m), "better", 0.0) == (
        True,
        f"{head}: better by more than 0 with 95% confidence (the lower bound is +0.2, McNemar's one-sided p 0.04)",
    )
    m = {"p_better": 0.25, "p_worse": 0.9}  # alpha = 1 - 0.75 = 0.25: McNemar's p must be below it, not at it
    assert gate.decide(_c(0.2, 0.8, "accuracy", m, confidence=0.75), "better", 0.0) == (
        False,
        "accuracy 0.5 vs the champion's 1 on the same 40 test rows, improvement +0.5, 75% bounds [+0.2, +0.8]: "
        "not shown better by more than 0 with 75% confidence (the lower bound is +0.2, McNemar's one-sided p 0.25)",
    )


def test_decide_not_worse_keeps_the_challenger_unless_the_upper_bound_is_below_minus_the_margin() -> None:
    assert gate.decide(_c(-0.5, -0.3), "not_worse", 0.1) == (
        False,
        f"{HEAD}, improvement +0.5, 95% bounds [-0.5, -0.3]: worse by more than 0.1 with 95% confidence "
        "(the upper bound is -0.3)",
    )
    assert gate.decide(_c(-0.5, -0.1), "not_worse", 0.1) == (
        True,
        f"{HEAD}, improvement +0.5, 95% bounds [-0.5, -0.1]: not shown worse by more than 0.1 with 95% confidence "
        "(the upper bound is -0.1)",
    )
    unsure = {"p_better": 1.0, "p_worse": 0.2}  # the bound is below, McNemar does not agree
    assert gate.decide(_c(-0.5, -0.3, "accuracy", unsure), "not_worse", 0.1) == (
        True,
        "accuracy 0.5 vs the champion's 1 on the same 40 test rows, improvement +0.5, 95% bounds [-0.5, -0.3]: "
        "not shown worse by more than 0.1 with 95% confidence (the upper bound is -0.3, McNemar's one-sided p 0.2)",
    )
    sure = {"p_better": 1.0, "p_worse": 0.01}
    assert gate.decide(_c(-0.5, -0.3, "accuracy", sure), "not_worse", 0.1)[0] is False
    at_alpha = {"p_better": 1.0, "p_worse": 0.25}  # alpha = 1 - 0.75: at it is not below it
    assert gate.decide(_c(-0.5, -0.3, "accuracy", at_alpha, confidence=0.75), "not_worse", 0.1)[0] is True


@pytest.mark.parametrize(
    ("tags", "said"),
    [
        ({"git_dirty": "true", "code_dirty": "false"}, "abc (the commit's code; params.yaml or data changed since)"),
        ({"git_dirty": "true", "code_dirty": "true"}, "abc (uncommitted code changes)"),
        ({"git_dirty": "true"}, "abc (uncommitted changes)"),  # registered before code_dirty was recorded
        ({"git_dirty": "false", "code_dirty": "false"}, "abc"),
    ],
)
def test_the_cards_commit_row_says_whether_the_code_was_the_commits(
    tmp_path: Path, tags: dict[str, str], said: str
) -> None:
    """A version trained by `trainflow run -S` (params.yaml rewritten, code committed) is not called uncommitted."""
    reg = {"model_name": "m", "version": 1, "tags": {"git_commit": "abc", **tags}, "why": {}}
    [lineage, *_] = card.sections(Paths(tmp_path), reg, {"accuracy": 1.0}, None, seed=0)
    assert lineage.tables[0][1][0] == ["git commit", said]


def test_the_registry_artifact_names_the_params_by_their_hash_not_their_whole_record() -> None:
    reg = {"model_name": "digits", "version": 3, "model_uri": "models:/digits/3", "gate_metric": "accuracy",
           "value": 0.97, "previous_champion": None, "previous_value": None, "champion": True, "champion_version": 3,
           "tags": {"git_commit": "abc123", "params": '{"train":{"lr":0.1}}', "params_hash": "p1"}}  # fmt: skip
    lines = report.registry_markdown(reg).splitlines()
    at = lines.index("Lineage tags of this version:")
    assert lines[at + 4 :] == ["| git_commit | abc123 |", "| params_hash | p1 |"]
