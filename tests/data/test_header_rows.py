"""data.header_rows: a csv header of several lines (names over names, as seaborn's brain_networks has network / node
/ hemi) is read into one name per column, its cells joined by '.', in memory and streamed alike. The reference is
pandas' read_csv(header=[0, 1, 2]), its column tuples joined the same way."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pydantic
import pytest
from support.projects import make_project

from trainflow.core.errors import DataError
from trainflow.core.paths import Paths
from trainflow.data import sources, spill
from trainflow.params import DataParams, load_params, write_overrides
from trainflow.stages import run_stage

HINT = (
    "; if the header spans several lines (names over names, as a spreadsheet exports them), set data.header_rows to "
    "their count: each column is then named by its cells on them joined by '.'"
)


def networks(n: int = 300, seed: int = 0) -> str:
    """A brain_networks-like csv: three header lines (a quoted cell holding the delimiter and a line break among
    them, a blank line between two of them), then n rows of numbers and a label."""
    rng = np.random.default_rng(seed)
    header = [
        ["network", "1", "1", "2", "2", '"3,b"', "label"],
        ["node", "1", "1", "1", "1", '"x\ny"', "kind"],
        ["hemi", "lh", "rh", "lh", "rh", "lh", "name"],
    ]
    rows = [[str(i), *(f"{v:.5f}" for v in rng.normal(0, 1, 5)), ["a", "b"][i % 2]] for i in range(n)]
    lines = [",".join(r) for r in header[:2]] + [""] + [",".join(r) for r in [header[2], *rows]]
    return "\n".join(lines) + "\n"


def params(source: str = "x.csv", **kw: object) -> DataParams:
    return DataParams.model_validate({"source": source, "target": "label.kind.name", **kw})


def test_the_names_are_pandas_multi_row_header_joined_and_the_values_pandas_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "x.csv").write_text(networks())
    reference = pd.read_csv(tmp_path / "x.csv", header=[0, 1, 2])
    names = [".".join(levels) for levels in reference.columns]
    assert names[0] == "network.node.hemi" and names[5] == "3,b.x\ny.lh"
    reference.columns = pd.Index(names)
    memory = sources.read_source(params(header_rows=3), tmp_path)
    pd.testing.assert_frame_equal(memory.frame, reference, check_dtype=False)
    assert memory.where(0, "1.1.lh") == "x.csv, line 6, column '1.1.lh'"  # 3 header lines, one blank, a line break
    assert memory.where(299) == "x.csv, line 305"
    monkeypatch.setattr(sources, "CHUNK_BYTES", 512)
    streamed = sources.read_source(params(header_rows=3, memory_budget_mb=1e-6), tmp_path, tmp_path / "spill")
    assert isinstance(streamed.frame, spill.SpilledFrame) and len(streamed.frame.parts[0]) > 10
    assert streamed.frame.columns == names
    for name in names:
        pd.testing.assert_series_equal(streamed.frame[name], memory.frame[name])
    assert streamed.where(299) == "x.csv, line 305"


def test_a_repeated_header_name_says_so_and_following_it_ingests_in_memory_and_streamed_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table with three levels of column names (named network, node, hemi), as pandas writes it: read with a
    one-line header, its first line repeats names, and the error says data.header_rows. Set to 3, both ingests write
    the same table, the columns named as pandas reads them back with header=[0, 1, 2]."""
    rng = np.random.default_rng(1)
    levels = [("1", "1", "lh"), ("1", "1", "rh"), ("2", "1", "lh"), ("2", "1", "rh"), ("label", "kind", "name")]
    frame = pd.DataFrame(rng.normal(0, 1, (600, 5)).round(5), columns=pd.MultiIndex.from_tuples(levels))
    frame.columns.names = ["network", "node", "hemi"]
    frame[("label", "kind", "name")] = np.where(frame[("1", "1", "lh")] > 0, "a", "b")
    made = []
    for name, budget in (("memory", "null"), ("streamed", "0.000001")):
        root = make_project(tmp_path / name, {"data.source": "data/raw/x.csv", "data.target": "label.kind.name",
                                               "data.memory_budget_mb": budget})  # fmt: skip
        frame.to_csv(root / "data/raw/x.csv")
        assert (root / "data/raw/x.csv").read_text().splitlines()[0] == "network,1,1,2,2,label"
        paths = Paths(root)
        with pytest.raises(DataError) as error:
            run_stage("ingest", load_params(paths.params), paths)
        assert str(error.value) == (
            f"data.source: data/raw/x.csv, line 1: the header names '1', '2' more than once; column names must be "
            f"unique{HINT}"
        )
        write_overrides(paths.params, ["data.header_rows=3"])  # as it says: the header's three lines
        with monkeypatch.context() as m:
            m.setattr(sources, "CHUNK_BYTES", 2048)
            run_stage("ingest", load_params(paths.params), paths)
        made.append(paths)
    memory, streamed = made
    a, b = pd.read_parquet(memory.table), pd.read_parquet(streamed.table)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert json.loads(memory.schema.read_text()) == json.loads(streamed.schema.read_text())
    reference = pd.read_csv(memory.root / "data/raw/x.csv", header=[0, 1, 2])
    names = [".".join(levels) for levels in reference.columns]
    assert names[:2] == ["network.node.hemi", "1.1.lh"]
    assert json.loads(memory.schema.read_text())["features"] == names[:-1]
    for levels, name in zip(reference.columns[1:-1], names[1:-1], strict=True):
        np.testing.assert_array_equal(a[name].to_numpy(), reference[levels].to_numpy())
    files = json.loads((streamed.processed / "sources.json").read_text())
    assert files == json.loads((memory.processed / "sources.json").read_text())  # the header hashed too


def test_a_row_after_a_header_of_several_lines_is_named_by_its_line(tmp_path: Path) -> None:
    lines = networks(20).splitlines()
    fields = lines[10].split(",")
    lines[10] = ",".join([fields[0], "inf", *fields[2:]])  # line 11: data record 5, after 5 lines of header
    (tmp_path / "x.csv").write_text("\n".join(lines) + "\n")
    raw = sources.read_source(params(header_rows=3), tmp_path)
    assert raw.frame["1.1.lh"].tolist()[5] == np.inf and raw.where(5, "1.1.lh") == "x.csv, line 11, column '1.1.lh'"


def test_header_rows_without_a_header_or_outside_csv_is_refused(tmp_path: Path) -> None:
    with pytest.raises(pydantic.ValidationError, match="data.header_rows counts the lines of a header: set data.hea"):
        params(header=False, columns=["a"], header_rows=2)
    with pytest.raises(pydantic.ValidationError, match="greater than or equal to 1"):
        params(header_rows=0)
    (tmp_path / "x.jsonl").write_text('{"a": 1}\n')
    with pytest.raises(DataError) as error:
        sources.read_source(params("x.jsonl", header_rows=2), tmp_path)
    assert str(error.value) == (
        "data.header/data.columns/data.header_rows apply to csv and tsv files, but x.jsonl is jsonl; remove them (its "
        "column names come from the file)"
    )


def test_a_header_of_several_lines_in_utf16_is_refused_with_a_fix_that_works(tmp_path: Path) -> None:
    (tmp_path / "x.csv").write_bytes(networks(30).encode("utf-16"))
    with pytest.raises(DataError) as error:
        sources.read_source(params(header_rows=3, encoding="utf-16"), tmp_path)
    assert str(error.value) == (
        "data.header_rows: a header of several lines is found as bytes, and x.csv is in utf-16, where they are not; "
        "convert it to UTF-8 (iconv -f utf-16 -t utf-8 < old > new) and set data.encoding: utf-8, or join the "
        "header's lines into one"
    )
    (tmp_path / "x.csv").write_text((tmp_path / "x.csv").read_bytes().decode("utf-16"), encoding="utf-8")  # iconv
    raw = sources.read_source(params(header_rows=3, encoding="utf-8"), tmp_path)
    assert list(raw.frame.columns)[:2] == ["network.node.hemi", "1.1.lh"] and len(raw.frame) == 30
