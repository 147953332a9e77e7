"""`trainflow models`: `promote` and `rollback` (the name, version and reason passed on, the line saying who is
champion now), `list` (the table of versions: counts as integers, other metrics to four decimals, what each version
predicts and on which data) and `show` (a version's model card, its HTML page copied; how to get one without)."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
from support.cli import CONFIGURED, recorder, registry_version

from trainflow import cli
from trainflow.cli import models as models_cmd
from trainflow.core.paths import Paths
from trainflow.registry import registry


def test_models_promote_and_rollback_pass_the_name_version_and_reason_and_say_who_is_champion(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--name defaults to register.model_name; --reason to "(no reason given)"."""
    promoted: list[Any] = []
    rolled: list[Any] = []
    monkeypatch.setattr(registry, "promote", recorder(promoted, {"champion": 4, "previous_champion": 2}))
    monkeypatch.setattr(registry, "rollback", recorder(rolled, {"champion": 2, "previous_champion": None}))
    assert cli.main(["models", "promote", "4"]) == 0
    assert cli.main(["models", "promote", "5", "--name", "iris", "--reason", "better"]) == 0
    assert promoted == [(("penguins", 4, "(no reason given)"), {}), (("iris", 5, "better"), {})]
    assert cli.main(["models", "rollback"]) == 0
    assert cli.main(["models", "rollback", "--name", "iris", "--reason", "bad week"]) == 0
    assert rolled == [(("penguins", "(no reason given)"), {}), (("iris", "bad week"), {})]
    assert capsys.readouterr() == (
        "penguins: champion is now version 4 (was 2)\n"
        "iris: champion is now version 4 (was 2)\n"
        "penguins: champion is now version 2 (was None)\n"
        "iris: champion is now version 2 (was None)\n",
        "",
    )
    assert [project.root] * 4 == CONFIGURED


def version(number: int, **more: Any) -> dict[str, Any]:
    return {"version": number, "aliases": [], "metrics": {}, "data_hash": "", "run_id": "", "champion_change": "",
            **more}  # fmt: skip


def test_models_list_prints_the_table_of_the_named_model_s_versions(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked: list[Any] = []
    versions = [
        version(
            12,
            aliases=["champion", "challenger"],
            metrics={"accuracy": 0.91234, "n_test": 40.0},
            data_hash="0123456789abcdef.dir",
            run_id="fedcba9876543210",
            champion_change="2026-11-01 promoted",
            target="species",
            task="classification",
        ),
        version(3, metrics={"accuracy": 1.0, "n_test": 7.5}, run_id="r1"),
    ]
    monkeypatch.setattr(registry, "list_versions", recorder(asked, versions))
    assert cli.main(["models", "list"]) == 0
    assert asked == [(("penguins",), {})]
    assert capsys.readouterr().out == (
        "penguins: 2 versions\n"
        "version  aliases              accuracy  n_test  target   task            data_hash     run           "
        "became champion\n"
        "12       champion,challenger  0.9123    40      species  classification  0123456789ab  fedcba987654  "
        "2026-11-01 promoted\n"
        "3        -                    1.0000    7.5000  -        -               -             r1            -\n"
    )


def test_a_one_version_table_says_version_and_a_missing_metric_is_a_dash() -> None:
    table = models_cmd.models_table("m", [version(1, metrics={"r2": 0.5}), version(2, metrics={"n_rows": 3.0})][:1])
    assert table == (
        "m: 1 version\n"
        "version  aliases  r2      target  task  data_hash  run  became champion\n"
        "1        -        0.5000  -       -     -               -"
    )
    two = models_cmd.models_table("m", [version(1, metrics={"r2": 0.5}), version(2, metrics={"n_rows": 3.0})])
    assert two.splitlines()[2:] == [
        "1        -        -       0.5000  -       -     -               -",
        "2        -        3       -       -       -     -               -",
    ]


def test_models_list_shows_counts_as_integers_and_what_each_version_predicts() -> None:
    text = models_cmd.models_table(
        "m",
        [
            registry_version(2, aliases=["champion"], target="species", task="classification"),
            registry_version(1, target="body_mass_g", task="regression", metrics={"r2": 1.0, "n_test": 40.0}),
            registry_version(0),  # registered before target and task were tagged
        ],
    )
    header, *rows = [line.split() for line in text.splitlines()[1:]]
    cells = [dict(zip(header, row)) for row in rows]
    assert cells[0]["n_test"] == "41" and cells[0]["accuracy"] == "0.9512"  # was 41.0000
    assert cells[1]["n_test"] == "40" and cells[1]["r2"] == "1.0000"  # a metric that happens to be whole stays one
    assert (cells[0]["target"], cells[0]["task"]) == ("species", "classification")
    assert (cells[1]["target"], cells[1]["task"]) == ("body_mass_g", "regression")
    assert (cells[2]["target"], cells[2]["task"]) == ("-", "-")


@pytest.mark.parametrize(
    ("name", "value", "cell"),
    [("n_test", 41.0, "41"), ("n_test", 2.5, "2.5000"), ("accuracy", 3.0, "3.0000"), ("xn_test", 4.0, "4.0000")],
)
def test_a_whole_count_shows_as_an_integer_anything_else_to_four_decimals(name: str, value: float, cell: str) -> None:
    assert models_cmd.metric_cell(name, value) == cell


def card_download(files: dict[str, str] | None, seen: list[Any]) -> Any:
    def download(**kwargs: Any) -> str:
        seen.append({k: v for k, v in kwargs.items() if k != "dst_path"})
        if files is None:
            from mlflow.exceptions import MlflowException

            raise MlflowException("no such artifact")
        folder = Path(kwargs["dst_path"]) / "card"
        folder.mkdir()
        for name, text in files.items():
            (folder / name).write_text(text)
        return str(folder)

    return download


def test_models_show_prints_the_version_s_card_and_copies_its_html_page(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import mlflow.artifacts

    from trainflow.registry import verify

    seen: list[Any] = []
    looked: list[Any] = []
    monkeypatch.setattr(verify, "version_of", recorder(looked, types.SimpleNamespace(run_id="run9", version="9")))
    card = {"card.md": "# m v9\n", "card.html": "<p>m</p>"}
    monkeypatch.setattr(mlflow.artifacts, "download_artifacts", card_download(card, seen))
    assert cli.main(["models", "show", "m@champion"]) == 0
    assert capsys.readouterr() == ("# m v9\n\n", "")
    html = tmp_path / "card.html"
    assert cli.main(["models", "show", "m/9", "--html", str(html)]) == 0
    assert capsys.readouterr() == ("# m v9\n\n", f"models show: the HTML card is in {html}\n")
    assert html.read_text() == "<p>m</p>"
    assert looked == [(("m@champion",), {}), (("m/9",), {})]
    assert seen == [{"run_id": "run9", "artifact_path": "card"}] * 2
    assert [project.root] * 2 == CONFIGURED


@pytest.mark.parametrize("files", [None, {"other.md": "x"}])
def test_models_show_of_a_version_without_a_card_says_how_one_is_written(
    files: dict[str, str] | None, project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import mlflow.artifacts

    from trainflow.registry import verify

    monkeypatch.setattr(verify, "version_of", lambda model: types.SimpleNamespace(run_id="r", version="3"))
    monkeypatch.setattr(mlflow.artifacts, "download_artifacts", card_download(files, []))
    assert cli.main(["models", "show", "m/3"]) == 2
    assert capsys.readouterr() == (
        "",
        "error: m/3: version 3 has no model card (registered before cards); `trainflow stage register` writes one "
        "for the run it registers\n",
    )
