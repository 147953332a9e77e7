"""The summary `trainflow run` ends with: which model to load (the champion alias, or this run's version when it did
not become champion) and which features data.features or data.exclude left."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainflow.core.io import write_json
from trainflow.core.paths import Paths
from trainflow.data.schema import Schema
from trainflow.stages import report


def registration(champion: bool) -> dict[str, Any]:
    return {
        "model_name": "penguins",
        "version": 3,
        "model_uri": "models:/penguins/3",
        "gate_metric": "accuracy",
        "value": 0.9,
        "previous_champion": 2,
        "previous_value": 0.95,
        "champion": champion,
        "champion_version": 3 if champion else 2,
        "decision": "...",
    }


@pytest.mark.parametrize(("champion", "uri"), [(True, "models:/penguins@champion"), (False, "models:/penguins/3")])
def test_load_it_loads_this_run_s_model(tmp_path: Path, champion: bool, uri: str) -> None:
    """A version that did not become champion is not what `@champion` loads: the line names the version."""
    paths = Paths(tmp_path)
    write_json(paths.registration, registration(champion))
    lines = report.summary(paths, {}).splitlines()
    assert f"  load it:  trainflow.serving.load('{uri}')" in lines
    md = report.registry_markdown(registration(champion))
    assert ("Load this run's version: `trainflow.serving.load('models:/penguins/3')`" in md) is not champion


def split_schema(paths: Paths, used: list[str], **data_params: Any) -> None:
    params = {"source": "data/raw/p.csv", "target": "species", "features": None, "exclude": [], **data_params}
    schema = Schema(
        source="data/raw/p.csv",
        target="species",
        task="classification",
        features=used,
        kinds=dict.fromkeys(used, "numeric"),  # type: ignore[arg-type]
        classes=["Adelie", "Gentoo"],
        n_rows=10,
        data_params=params,
    )
    write_json(paths.split_schema, schema.to_json())


def test_the_summary_shows_the_features_data_features_or_data_exclude_left(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    split_schema(paths, ["bill_length_mm", "flipper_length_mm"], exclude=["id", "island"])
    lines = report.summary(paths, {}).splitlines()
    assert "  features: 2 used: bill_length_mm, flipper_length_mm (data.exclude: [id, island])" in lines
    split_schema(paths, ["bill_length_mm"], features=["bill_length_mm"])
    assert "  features: 1 used: bill_length_mm (data.features: [bill_length_mm])" in report.summary(paths, {})
    many = [f"f{i}" for i in range(15)]
    split_schema(paths, many, exclude=["id"])
    assert "  features: 15 used: f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, ... (3 more)" in report.summary(
        paths, {}
    )
    split_schema(paths, many)  # every column: nothing chosen, nothing to say
    assert "features:" not in report.summary(paths, {})
