"""A column whose name is a number (seaborn's brain_networks, a pivoted table: columns "1", "2", ...) can be named in
-S and in params.yaml as YAML writes it: `-S data.target=1` gives YAML's integer 1, which is the column "1"."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from support.projects import REPO

from trainflow.params import load_params, write_overrides


@pytest.fixture
def params_file(tmp_path: Path) -> Path:
    path = tmp_path / "params.yaml"
    shutil.copyfile(REPO / "params.yaml", path)
    return path


def test_a_number_given_for_a_column_name_is_that_name(params_file: Path) -> None:
    p = load_params(params_file, ["data.target=1", "data.exclude=[2, b]", "split.group_by=3", "split.key=[4]"])
    assert (p.data.target, p.data.exclude, p.split.group_by, p.split.key) == ("1", ["2", "b"], "3", ["4"])


def test_the_override_written_into_params_yaml_reads_back_as_the_same_name(params_file: Path) -> None:
    write_overrides(params_file, ["data.target=1"])
    assert yaml.safe_load(params_file.read_text())["data"]["target"] == 1  # YAML's integer, as -S gave it
    assert load_params(params_file).data.target == "1"


def test_numbers_stay_numbers_and_choices_stay_checked(params_file: Path) -> None:
    p = load_params(params_file, ["train.lr=0.01", "train.epochs=3"])
    assert (p.train.lr, p.train.epochs) == (0.01, 3)
    with pytest.raises(Exception, match="data.task"):
        load_params(params_file, ["data.task=1"])  # a choice (auto, classification, regression), not free text
