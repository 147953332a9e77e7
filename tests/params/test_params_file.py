"""params.yaml as a file (trainflow.params): missing, broken or not a mapping, a key given twice at any depth named
with both its lines, and the JSON schema of every section."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainflow import params as pm
from trainflow.core.errors import ParamsError
from trainflow.params import duplicate_keys


def test_a_params_file_that_is_missing_broken_or_not_a_mapping_says_so(tmp_path: Path) -> None:
    from trainflow.params import read_raw

    path = tmp_path / "params.yaml"
    with pytest.raises(ParamsError) as missing:
        read_raw(path)
    assert missing.value.problems == [("<file>", "file not found; run from the project root or create params.yaml")]
    path.write_text("- a\n- b\n")
    with pytest.raises(ParamsError) as listed:
        read_raw(path)
    assert listed.value.problems == [("<root>", "params.yaml must be a mapping of sections")]
    path.write_text("a: [1\n")
    with pytest.raises(ParamsError) as broken:
        read_raw(path)
    assert broken.value.problems[0][0] == "<file>" and broken.value.problems[0][1].startswith("not valid YAML: ")
    path.write_text("")
    assert read_raw(path) == {}


def test_a_params_file_with_a_key_twice_names_both_lines(tmp_path: Path) -> None:
    from trainflow.params import read_raw

    path = tmp_path / "params.yaml"
    path.write_text("train:\n  lr: 1\n  lr: 2\nseed: 1\nlist:\n  - {a: 1, a: 2}\n")
    with pytest.raises(ParamsError) as bad:
        read_raw(path)
    assert bad.value.source == str(path)
    assert bad.value.problems == [
        ("train.lr", "given twice (lines 2 and 3); keep one of them"),
        ("list[0].a", "given twice (lines 6 and 6); keep one of them"),
    ]


def test_duplicate_keys_at_every_depth() -> None:
    text = "a: 1\nb:\n  c: 1\n  c: 2\n  d:\n    - {e: 1}\n    - {e: 1, e: 2}\na: 3\n"
    assert duplicate_keys(text) == [
        ("b.c", "given twice (lines 3 and 4); keep one of them"),
        ("b.d[1].e", "given twice (lines 7 and 7); keep one of them"),
        ("a", "given twice (lines 1 and 8); keep one of them"),
    ]
    assert duplicate_keys("a: 1\na: 2\na: 3\n") == [
        ("a", "given twice (lines 1 and 2); keep one of them"),
        ("a", "given twice (lines 1 and 3); keep one of them"),
    ]
    assert duplicate_keys("") == [] and duplicate_keys("a: [1, 2]\nb: {c: 1}\n") == []
    assert duplicate_keys("- {x: 1, x: 2}\n") == [("[0].x", "given twice (lines 1 and 1); keep one of them")]


def test_schema_is_the_json_schema_of_every_section() -> None:
    s = pm.schema()
    assert s["title"] == "PipelineParams" and s["type"] == "object"
    assert list(s["properties"]) == ["seed", "data", "features", "split", "model", "train", "evaluate", "register",
                                     "tracking", "deploy", "tune"]  # fmt: skip
