"""The markdown a flow run publishes as Prefect artifacts, built from the reports alone (no Prefect needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainflow.core.io import write_json
from trainflow.core.paths import Paths
from trainflow.stages import report

METRICS = {"accuracy": 0.9704, "f1_macro": 0.9701, "log_loss": 0.1012, "n_test": 270}


def registration(**changes: Any) -> dict[str, Any]:
    reg = {
        "model_name": "digits",
        "version": 3,
        "model_uri": "models:/digits/3",
        "gate_metric": "accuracy",
        "value": 0.9704,
        "previous_champion": 2,
        "previous_value": 0.9667,
        "champion": True,
        "champion_version": 3,
        "tags": {"git_commit": "abc123", "data_hash": "d41d8.dir"},
    }
    return reg | changes


def test_metrics_beside_the_champion_gate_metric_only_without_previous_metrics() -> None:
    md = report.metrics_markdown(METRICS, registration())
    assert "## Test metrics: digits v3" in md
    assert "| metric | this run (v3) | champion before it (v2) |" in md
    assert "| **accuracy** (gate, higher is better) | 0.9704 | 0.9667 |" in md
    assert "| f1_macro | 0.9701 | — |" in md
    assert "| n_test | 270 | — |" in md
    assert "recorded when it was registered" in md


def test_metrics_beside_every_champion_metric_when_registration_has_them() -> None:
    previous = {"accuracy": 0.9667, "f1_macro": 0.9650, "log_loss": 0.1200, "n_test": 270}
    md = report.metrics_markdown(METRICS, registration(previous_metrics=previous, rescored=True))
    assert "| f1_macro | 0.9701 | 0.9650 |" in md
    assert "| log_loss | 0.1012 | 0.1200 |" in md
    assert "rescored on this run's test data" in md


def test_metrics_of_a_first_version_and_a_lower_is_better_gate() -> None:
    reg = registration(version=1, previous_champion=None, previous_value=None, champion_version=1, gate_metric="rmse")
    md = report.metrics_markdown({"rmse": 0.5, "r2": 0.9}, reg)
    assert "| **rmse** (gate, lower is better) | 0.5000 | — |" in md
    assert "first version" in md
    assert "| metric | this run |" in report.metrics_markdown({"rmse": 0.5}, None)


def test_a_first_version_says_there_was_no_earlier_champion() -> None:
    reg = registration(version=1, previous_champion=None, previous_value=None, champion_version=1)
    lines = report.metrics_markdown(METRICS, reg).splitlines()
    assert lines[-2:] == ["", "No earlier champion: this is the first version of the model."]


def test_mlflow_run_is_a_link_on_a_tracking_server() -> None:
    run = {"run_id": "r1", "experiment_id": "7", "tracking_uri": "https://mlflow.example.com/", "model_uri": "m"}
    md = report.mlflow_run_markdown(run)
    assert "[r1](https://mlflow.example.com/#/experiments/7/runs/r1)" in md
    assert "mlflow ui" not in md


def test_mlflow_run_in_a_local_store_says_how_to_browse_it() -> None:
    run = {"run_id": "r1", "experiment_id": "7", "tracking_uri": "sqlite:////srv/proj/mlflow.db"}
    md = report.mlflow_run_markdown(run)
    assert "mlflow ui --backend-store-uri sqlite:////srv/proj/mlflow.db" in md
    assert "http://127.0.0.1:5000/#/experiments/7/runs/r1" in md


def test_registry_decision_is_the_register_stage_s() -> None:
    assert report.decision_line(registration(decision="v3 ties v2; v2 stays")) == "v3 ties v2; v2 stays"
    assert "no decision recorded" in report.decision_line(registration())
    kept = registration(
        champion=False, champion_version=2, value=0.95, decision="The champion stays v2: v3 does not beat it."
    )

    md = report.registry_markdown(kept)
    assert "**The champion stays v2" in md
    assert "| previous champion | v2 (0.9667) |" in md
    assert "| champion now | v2 |" in md
    assert "models:/digits@champion" in md
    assert "| git_commit | abc123 |" in md


def test_cells_cannot_break_a_table() -> None:
    assert report.fmt("a|b") == "a\\|b"
    assert report.fmt(None) == "—"
    assert report.fmt(3) == "3"


def test_artifacts_come_from_the_reports_that_exist(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    assert report.artifacts(paths) == []
    write_json(paths.metrics, METRICS)
    assert [a.key for a in report.artifacts(paths)] == ["training-metrics"]
    write_json(paths.train_run, {"run_id": "r", "experiment_id": "1", "tracking_uri": "sqlite:///x.db"})
    write_json(paths.registration, registration())
    keys = [a.key for a in report.artifacts(paths)]
    assert keys == ["training-metrics", "mlflow-run", "registry-decision"]
    assert all(k.replace("-", "").isalnum() and k.islower() for k in keys)  # Prefect's rule for artifact keys
    paths.reports.mkdir(parents=True, exist_ok=True)
    (paths.reports / "card.md").write_text("# Model card: digits v3\n", encoding="utf-8")
    # Each is shown in Prefect's UI under its description.
    assert [(a.key, a.description) for a in report.artifacts(paths)] == [
        ("training-metrics", "Test metrics of this run's model beside the champion's"),
        ("mlflow-run", "The MLflow run that trained the model"),
        ("model-card", "The registered version's model card"),
        ("registry-decision", "Registry version and champion decision"),
    ]


def test_a_champion_that_could_not_be_scored_is_said_so() -> None:
    reg = registration(champion=False, champion_version=2, previous_value=None, previous_metrics=None)
    md = report.metrics_markdown(METRICS, reg)
    assert "could not be scored on this run's test data" in md
    assert "recorded when it was registered" not in md


def test_a_training_run_that_lost_tracking_says_where_things_are() -> None:
    down = {"run_id": None, "model_uri": None, "tracking_uri": "http://mlflow:5000", "tracking_error": "boom"}
    text = report.mlflow_run_markdown(down)
    assert "failed during training (boom)" in text and "reports/train_metrics_local.json" in text
    assert "register stage logs the model" in text and "None" not in text


def test_the_markdown_without_a_registration_and_from_an_older_registration_says_so() -> None:
    """Killed mutants of the sampled mutation run (BENCHMARKS.md): the fallback texts and the lineage table's header."""
    md = report.metrics_markdown(METRICS, None)
    assert md.splitlines()[0] == "## Test metrics"
    older = registration()  # written by a trainflow that recorded no decision
    assert report.decision_line(older) == "no decision recorded (registered by an older trainflow)"
    lines = report.registry_markdown(older).splitlines()
    at = lines.index("Lineage tags of this version:")
    assert lines[at + 2] == "| tag | value |"
    assert lines[at + 4 :] == ["| git_commit | abc123 |", "| data_hash | d41d8.dir |"]


def test_the_registry_artifact_shows_the_paired_evidence_and_none_without_it() -> None:
    comparison = {
        "metric": "accuracy", "challenger": 0.9704, "champion": 0.9667, "improvement": 0.0037, "low": -0.0074,
        "high": 0.0148, "confidence": 0.95, "rows": 540, "resamples": 2000, "seed": 42,
        "test": "paired bootstrap of the accuracy difference, 2000 resamples of the 540 test rows",
        "mcnemar": {"challenger_only": 9, "champion_only": 7, "p_value": 0.8036},
    }  # fmt: skip
    md = report.registry_markdown(registration(comparison=comparison))
    assert "Paired comparison on the same 540 test rows (accuracy):" in md
    assert "| 95% one-sided bounds | [-0.0074, 0.0148] |" in md
    assert "| McNemar (exact) | only the challenger right on 9 rows, only the champion on 7: p = 0.8036 |" in md
    assert "Paired comparison" not in report.registry_markdown(registration(comparison=None))
