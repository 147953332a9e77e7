"""-S overrides (trainflow.params): a dotted key and a YAML value, refused whole with what it must look like, set into a
copy of the raw params, named as the source of a problem; and overrides written into params.yaml keeping the file's
comments, nulls and quotes, in flow style, validated first (the file's whole text compared)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainflow import params as pm
from trainflow.core.errors import ParamsError
from trainflow.params import load_params, write_overrides


@pytest.mark.parametrize(
    ("text", "keys", "value"),
    [("train.lr=3.0e-4", ["train", "lr"], 3e-4), ("train.lr=3e-4", ["train", "lr"], "3e-4"),  # YAML 1.1: a string
     (" seed =7", ["seed"], 7), ("data.target=", ["data", "target"], ""),
     ("a.b=[1, 2]", ["a", "b"], [1, 2]), ("a=x=y", ["a"], "x=y")],
)  # fmt: skip
def test_an_override_is_a_dotted_key_and_a_yaml_value(text: str, keys: list[str], value: Any) -> None:
    from trainflow.params import parse_override

    assert parse_override(text) == (keys, value)


@pytest.mark.parametrize("text", ["train.lr", "=3", "a..b=1", ".a=1", "a.=1"])
def test_an_override_without_a_whole_key_says_what_it_must_look_like(text: str) -> None:
    from trainflow.params import parse_override

    with pytest.raises(ParamsError) as bad:
        parse_override(text)
    assert bad.value.source == "-S"
    assert bad.value.problems == [(text, "an override must look like key.subkey=value, e.g. -S train.lr=3e-4")]


def test_an_override_with_invalid_yaml_names_the_key_and_the_value() -> None:
    from trainflow.params import parse_override

    with pytest.raises(ParamsError) as bad:
        parse_override("train.lr=[1")
    ((key, message),) = bad.value.problems
    assert key == "train.lr" and message.startswith("value '[1' is not valid YAML: ")


def test_apply_overrides_sets_nested_keys_in_a_copy() -> None:
    from trainflow.params import apply_overrides

    raw = {"train": {"lr": 1}, "seed": 1, "data": "flat"}
    out = apply_overrides(raw, ["train.lr=2", "model.name=mlp", "data.target=y"])
    assert out == {"train": {"lr": 2}, "seed": 1, "data": {"target": "y"}, "model": {"name": "mlp"}}
    assert raw == {"train": {"lr": 1}, "seed": 1, "data": "flat"}


def test_loaded_params_with_overrides_name_the_overrides_as_their_source(tmp_path: Path) -> None:
    from trainflow.params import load_params

    path = tmp_path / "params.yaml"
    path.write_text("seed: 1\n")
    assert load_params(path, ["seed=5"]).seed == 5
    with pytest.raises(ParamsError) as bad:
        load_params(path, ["seed=-1"])
    assert bad.value.source == f"{path} with -S overrides"
    path.write_text("seed: -1\n")
    with pytest.raises(ParamsError) as plain:
        load_params(path)
    assert plain.value.source == str(path)


def test_overrides_set_into_a_copy_through_non_mappings() -> None:
    raw: dict[str, Any] = {"a": {"b": 1}, "c": None}
    assert pm.apply_overrides(raw, ["a.b.c=2", "c.d=[1]"]) == {"a": {"b": {"c": 2}}, "c": {"d": [1]}}
    assert raw == {"a": {"b": 1}, "c": None}
    node: dict[str, Any] = {}
    pm.pipeline._set(node, ["x"], 1)
    assert node == {"x": 1}


# --- overrides written into params.yaml ------------------------------------------------------------------------


def test_write_overrides_keeps_comments_and_writes_flow_style(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text(
        "seed: 1  # the seed\ndata:\n  target: y\n  exclude: []  # leaks\n  delimiter: null\ntrain:\nmodel:\n"
    )
    space = "tune.space={train.lr: {type: float, low: 0.0001, high: 0.01, log: true}}"
    write_overrides(path, ["data.exclude=[a, b]", "seed=2", "model.kwargs={depth: 3, widths: [4, 5]}", "train.lr=0.001",
                           space])  # fmt: skip
    assert path.read_text() == (
        "seed: 2  # the seed\n"
        "data:\n"
        "  target: y\n"
        "  exclude: [a, b] # leaks\n"
        "  delimiter: null\n"
        "train:\n"
        "  lr: 0.001\n"
        "model:\n"
        "  kwargs: {depth: 3, widths: [4, 5]}\n"
        "tune:\n"
        "  space: {train.lr: {type: float, low: 0.0001, high: 0.01, log: true}}\n"
    )
    assert load_params(path).tune.space["train.lr"].log is True


def test_write_overrides_does_nothing_without_overrides_and_validates_first(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    write_overrides(path, [])  # not even read
    assert not path.exists()
    path.write_text("seed: 1\n")
    with pytest.raises(ParamsError) as bad:
        write_overrides(path, ["seed=-2"])
    assert bad.value.problems == [("seed", "Input should be greater than or equal to 0 (got -2)")]
    assert path.read_text() == "seed: 1\n"
    long = "x" * 300
    write_overrides(path, [f"tracking.experiment={long}", "data.exclude=[" + ", ".join(["c" * 50] * 5) + "]"])
    assert path.read_text() == (
        f"seed: 1\ntracking:\n  experiment: {long}\ndata:\n  exclude: [{', '.join(['c' * 50] * 5)}]\n"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["params.yaml"]


def test_flow_makes_nested_lists_and_mappings_flow_style() -> None:
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    got = pm.pipeline._flow({"a": [1, {"b": 2}], "c": "x"})
    assert isinstance(got, CommentedMap) and got.fa.flow_style() is True
    assert isinstance(got["a"], CommentedSeq) and got["a"].fa.flow_style() is True
    assert isinstance(got["a"][1], CommentedMap) and got["a"][1].fa.flow_style() is True
    assert got == {"a": [1, {"b": 2}], "c": "x"}
    assert pm.pipeline._flow(3) == 3 and pm.pipeline._flow(None) is None


def test_write_overrides_keeps_the_quotes_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text("data:\n  target: 'y'\n  source: \"data/raw/t.csv\"\nseed: 1\n")
    (tmp_path / "data/raw").mkdir(parents=True)
    write_overrides(path, ["seed=3"])
    assert path.read_text() == "data:\n  target: 'y'\n  source: \"data/raw/t.csv\"\nseed: 3\n"


def test_written_overrides_keep_the_file_s_nulls_and_comments(tmp_path: Path) -> None:
    from trainflow.params import write_overrides

    path = tmp_path / "params.yaml"
    path.write_text("seed: 1  # the seed\ntrain:\n  max_time: null\n  lr: 0.1\n")
    write_overrides(path, ["seed=2", "train.lr=0.5", "data.exclude=[a, b]"])
    assert path.read_text() == ("seed: 2  # the seed\ntrain:\n  max_time: null\n  lr: 0.5\ndata:\n  exclude: [a, b]\n")
