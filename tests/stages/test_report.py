"""The markdown a flow run publishes as Prefect artifacts, built from the reports alone (no Prefect needed), and the
summary a pipeline run prints: each page, table and line whole, written out here by hand from hand-made inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainflow.core.io import write_json
from trainflow.core.paths import Paths
from trainflow.data.schema import Schema
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
    """Killed mutants of the sampled mutation run (benchmarks/mutation.md): the fallback texts and the lineage table's
    header."""
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


# --- each artifact and the run summary, whole, on hand-made inputs ----------------------------------------------


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


def test_the_paired_comparison_by_slice_has_its_header_row() -> None:
    comparison = {
        "confidence": 0.95,
        "challenger": 0.9,
        "champion": 0.85,
        "improvement": 0.05,
        "low": 0.01,
        "high": 0.09,
        "test": "paired bootstrap",
        "rows": 200,
        "metric": "accuracy",
        "slices": [
            {"slice": "region=north", "rows": 120, "metric": "accuracy", "challenger": 0.9, "champion": 0.8,
             "improvement": 0.1, "challenger_only": 14, "champion_only": 2},
        ],
    }  # fmt: skip
    md = report.comparison_markdown(comparison)
    by_slice = md.split("By slice (for reading; the decision is on all the rows):\n\n")[1].splitlines()
    assert by_slice[0] == (
        "| slice | rows | metric | challenger | champion | improvement | only challenger right | only champion right |"
    )
    assert by_slice[1] == "|---|---|---|---|---|---|---|---|"
    assert by_slice[2] == "| region=north | 120 | accuracy | 0.9000 | 0.8000 | 0.1000 | 14 | 2 |"


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


def test_the_registry_artifact_names_the_params_by_their_hash_not_their_whole_record() -> None:
    reg = {"model_name": "digits", "version": 3, "model_uri": "models:/digits/3", "gate_metric": "accuracy",
           "value": 0.97, "previous_champion": None, "previous_value": None, "champion": True, "champion_version": 3,
           "tags": {"git_commit": "abc123", "params": '{"train":{"lr":0.1}}', "params_hash": "p1"}}  # fmt: skip
    lines = report.registry_markdown(reg).splitlines()
    at = lines.index("Lineage tags of this version:")
    assert lines[at + 4 :] == ["| git_commit | abc123 |", "| params_hash | p1 |"]


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
