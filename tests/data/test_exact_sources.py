"""Exact behaviour of the data readers (trainflow.data.sources, and the stream/spill/io helpers they use), on files
small enough to work out by hand: every message in full, the frames and provenance they return, both sides of each
branch (header or not, quoted or not, in memory or spilled, index column or data), checked against hand computation,
the csv/json modules and pyarrow's own reads."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pv
import pyarrow.parquet as pq
import pytest
from PIL import Image

from trainflow.core.errors import DataError
from trainflow.data import sources, spill
from trainflow.data.sources import RawTable, read_source
from trainflow.params import DataParams

UTF8_HINT = "set data.encoding to the file's encoding (latin-1 or cp1252 for most Western exports)"
INDEX_NOTE = (
    ": dropped its first column: it has no header and holds a different integer in every row, the index pandas' "
    "to_csv writes by default (row labels, not data)"
)
QUOTED = pv.ParseOptions(newlines_in_values=True)
HEADER_ROWS = (  # what a header's repeated names add about data.header_rows
    "; if the header spans several lines (names over names, as a spreadsheet exports them), set data.header_rows to "
    "their count: each column is then named by its cells on them joined by '.'"
)
IMAGE_KINDS = ".bmp, .gif, .jpeg, .jpg, .png, .tif, .tiff, .webp"


def params(source: str = "x.csv", **kw: Any) -> DataParams:
    return DataParams.model_validate({"source": source, **kw})


def write(root: Path, rel: str, content: str | bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def read(root: Path, source: str = "x.csv", **kw: Any) -> RawTable:
    return read_source(params(source, **kw), root)


def error(root: Path, source: str = "x.csv", spill_to: Path | None = None, **kw: Any) -> str:
    with pytest.raises(DataError) as info:
        read_source(params(source, **kw), root, spill_to)
    return str(info.value)


def spilled(root: Path, source: str = "x.csv", **kw: Any) -> RawTable:
    return read_source(params(source, memory_budget_mb=0.000001, **kw), root, root / "spill")


def png_bytes(pixels: list[list[int]]) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.array(pixels, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def as_dict(frame: Any) -> dict[str, list[Any]]:
    """The frame's columns as lists, a missing value as None."""
    return {c: [None if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)) else v
                for v in frame[c].tolist()] for c in frame.columns}  # fmt: skip


# === RawTable: provenance ========================================================================================


def test_position_file_index_and_record_skip_a_file_of_no_rows() -> None:
    t = RawTable(pd.DataFrame({"a": range(5)}), "s", [Path("a"), Path("b"), Path("c")], [2, 0, 3], "parquet")
    assert [t.position(r) for r in range(5)] == [(0, 0), (0, 1), (2, 0), (2, 1), (2, 2)]
    assert t.file_index.tolist() == [0, 0, 2, 2, 2] and t.file_index.dtype == np.int32
    assert t.record.tolist() == [0, 1, 0, 1, 2] and t.record.dtype == np.int64
    assert t.where_many([0, 1, 2, 4], "a") == ["a, row 1, column 'a'", "a, row 2, column 'a'", "c, row 1, column 'a'",
                                                 "c, row 3, column 'a'"]  # fmt: skip


def test_raw_table_defaults() -> None:
    t = RawTable(pd.DataFrame(), "s", [], [0], "csv")
    assert (t.root, t.delimiter, t.encoding, t.header, t.image_column, t.notes) == (None, ",", "utf-8", True, None, [])
    assert t._lines == {}


def test_where_of_a_raw_table_built_with_its_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "x.csv", "a,b\n\n1,2\n3,4\n")
    t = RawTable(pd.DataFrame({"a": [1, 3]}), "x.csv", [path], [2], "csv", tmp_path)
    assert t.where_many([1, 0], "a") == ["x.csv, line 4, column 'a'", "x.csv, line 3, column 'a'"]
    assert t.shown(0) == "x.csv"
    outside = RawTable(pd.DataFrame({"a": [1, 3]}), "x.csv", [path], [2], "csv")
    assert outside.where(0) == f"{path}, line 3"


def test_where_for_builtin_and_images() -> None:
    b = RawTable(pd.DataFrame({"a": range(3)}), "builtin:iris", [], [3], "builtin")
    assert b.where_many([2, 0]) == ["builtin:iris, row 3", "builtin:iris, row 1"]
    assert b.where(1, "a") == "builtin:iris, row 2, column 'a'"
    root = Path("/p")
    files = [root / "imgs/a/1.png", root / "imgs/b/2.png"]
    i = RawTable(pd.DataFrame({"a": range(2)}), "imgs", files, [1, 1], "images", root)
    assert i.where_many([1, 0], "image") == ["imgs/b/2.png, column 'image'", "imgs/a/1.png, column 'image'"]
    assert i.where(0) == "imgs/a/1.png"


def test_where_rescans_when_a_later_record_is_asked_for(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", "a\n1\n\n2\n\n\n3\n4\n")
    t = read(tmp_path)
    assert t.where(0) == "x.csv, line 2"
    assert list(t._lines[0]) == [2]  # the scan stops at the record asked for
    assert t.where(2) == "x.csv, line 7"
    assert list(t._lines[0]) == [2, 4, 7]
    assert t.where(1) == "x.csv, line 4"
    assert t.where_many([3, 3]) == ["x.csv, line 8", "x.csv, line 8"]


def test_where_of_a_file_that_lost_rows_since_it_was_read(tmp_path: Path) -> None:
    path = write(tmp_path, "x.csv", "a\n1\n2\n3\n")
    t = read(tmp_path)
    path.write_text("a\n1\n")
    assert t.where_many([0, 2], "a") == ["x.csv, line 2, column 'a'", "x.csv, row 3, column 'a'"]


def test_where_in_jsonl_and_tsv(tmp_path: Path) -> None:
    write(tmp_path, "x.jsonl", '\n{"a": 1}\n\n  \n{"a": 2}\n{"a": 3}\n')
    t = read(tmp_path, "x.jsonl")
    assert t.where_many([2, 0, 1], "a") == ["x.jsonl, line 6, column 'a'", "x.jsonl, line 2, column 'a'",
                                             "x.jsonl, line 5, column 'a'"]  # fmt: skip
    # a tsv's quotes are characters: a quote never closed does not swallow the lines after it when locating a row
    write(tmp_path, "y.tsv", 'a\tb\n1\t"open\n2\tx\n3\ty\n')
    y = read(tmp_path, "y.tsv")
    assert as_dict(y.frame) == {"a": [1, 2, 3], "b": ['"open', "x", "y"]}
    assert y.where_many([2, 1]) == ["y.tsv, line 4", "y.tsv, line 3"]


def test_where_in_a_headerless_csv_with_a_multiline_value(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", '1,"a\nb"\n\n2,c\n')
    t = read(tmp_path, header=False)
    assert as_dict(t.frame) == {"column_1": [1, 2], "column_2": ["a\nb", "c"]}
    assert t.where_many([1, 0]) == ["x.csv, line 4", "x.csv, line 1"]
    assert t.header is False and t.delimiter == "," and t.encoding == "utf-8" and t.root == tmp_path


# === read_source: options and their checks ========================================================================


def test_unknown_encoding_message(tmp_path: Path) -> None:
    write(tmp_path, "x.jsonl", '{"a": 1}\n')
    assert error(tmp_path, "x.jsonl", encoding="klingon") == (
        "data.encoding: unknown encoding 'klingon'; use a Python codec name such as utf-8, latin-1 or cp1252"
    )


@pytest.mark.parametrize("kw", [{"header": False}, {"header": False, "columns": ["a"]}], ids=["header", "columns"])
def test_header_and_columns_are_refused_for_parquet(tmp_path: Path, kw: dict[str, Any]) -> None:
    pd.DataFrame({"a": [1]}).to_parquet(tmp_path / "x.parquet")
    assert error(tmp_path, "x.parquet", **kw) == (
        "data.header/data.columns/data.header_rows apply to csv and tsv files, but x.parquet is parquet; remove them "
        "(its column names come from the file)"
    )


def test_header_false_is_allowed_for_jsonl_and_its_empty_file_has_no_rows(tmp_path: Path) -> None:
    write(tmp_path, "x.jsonl", '{"a": 1}\n')
    assert as_dict(read(tmp_path, "x.jsonl", header=False).frame) == {"a": [1]}


@pytest.mark.parametrize(
    ("name", "content", "kw", "what"),
    [
        ("x.csv", "a,b\n", {}, "a header line but no rows"),
        ("x.tsv", "a\tb\n\n", {}, "a header line but no rows"),
        ("x.csv", "\n\n", {"header": False, "columns": ["a"]}, "no rows"),
    ],
)
def test_a_file_without_rows_is_named(tmp_path: Path, name: str, content: str, kw: dict[str, Any], what: str) -> None:
    write(tmp_path, name, content)
    assert error(tmp_path, name, **kw) == f"data.source: {name} has {what}; fill it, or remove it from data.source"


def test_a_parquet_file_without_rows(tmp_path: Path) -> None:
    pd.DataFrame({"a": pd.Series([], dtype="int64")}).to_parquet(tmp_path / "x.parquet")
    assert error(tmp_path, "x.parquet") == "data.source: x.parquet has no rows; fill it, or remove it from data.source"


def test_a_csv_read_keeps_its_options_and_notes(tmp_path: Path) -> None:
    write(tmp_path, "x.txt", "a;b\n1;x\n2;y\n")
    t = read(tmp_path, "x.txt", delimiter=";", encoding="latin-1")
    assert (t.fmt, t.delimiter, t.encoding, t.header, t.notes, t.rows, t.files) == (
        "csv", ";", "latin-1", True, [], [2], [tmp_path / "x.txt"])  # fmt: skip
    assert as_dict(t.frame) == {"a": [1, 2], "b": ["x", "y"]}
    write(tmp_path, "y.tsv", "a\tb\n1\tx\n")
    assert read(tmp_path, "y.tsv").delimiter == "\t"


def test_an_index_column_is_dropped_with_a_note(tmp_path: Path) -> None:
    write(tmp_path, "d/a.csv", ",x,y\n2,5,p\n0,6,q\n1,7,r\n")
    write(tmp_path, "d/b.csv", ",x,y\n0,8,s\n")
    t = read(tmp_path, "d")
    assert as_dict(t.frame) == {"x": [5, 6, 7, 8], "y": ["p", "q", "r", "s"]}
    assert t.notes == [f"d/a.csv{INDEX_NOTE}", f"d/b.csv{INDEX_NOTE}"]
    assert t.rows == [3, 1]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (",x\n0,5\n0,6\n", {"column_1": [0, 0], "x": [5, 6]}),  # repeated integers: data
        (",x\n0,5\n,6\n", {"column_1": [0.0, None], "x": [5, 6]}),  # a missing value: data
        (",x\n1,5\n0,6\n", {"x": [5, 6]}),  # two columns, the first an index
        (",x\n0.5,5\n1.5,6\n", {"column_1": [0.5, 1.5], "x": [5, 6]}),  # not integers: data
        (",x\na,5\nb,6\n", {"column_1": ["a", "b"], "x": [5, 6]}),
        ("x,\n0,5\n1,6\n", {"x": [0, 1], "column_2": [5, 6]}),  # the unnamed column is not the first
    ],
)
def test_what_is_not_an_index_column(tmp_path: Path, text: str, expected: dict[str, list[Any]]) -> None:
    write(tmp_path, "x.csv", text)
    t = read(tmp_path)
    assert as_dict(t.frame) == expected
    assert t.notes == ([] if "column_1" in expected or "column_2" in expected else [f"x.csv{INDEX_NOTE}"])
    assert sources._pandas_index(pa.table({"": [0, 1]})) is False  # one column: never an index


def test_an_index_then_names_given_twice_names_the_header_line(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", "\n,a,a,b,b,a\n0,1,2,3,4,5\n1,1,2,3,4,5\n")
    assert error(tmp_path) == (
        "data.source: x.csv, line 2: the header names 'a', 'b' more than once; column names must be unique"
        + HEADER_ROWS
    )


def test_an_empty_header_name_becoming_a_name_taken(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", "a,,column_2\n1,2,3\n")
    assert error(tmp_path) == (
        "data.source: x.csv, line 1: the header names 'column_2' more than once; column names must be unique"
        + HEADER_ROWS
    )


def test_data_columns_given_twice(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", "1,2,3\n")
    assert error(tmp_path, header=False, columns=["a", "b", "a"]) == (
        "data.columns names 'a' more than once; column names must be unique"
    )


def test_quoting_options(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", 'a,b\n"1,5","say ""x"""\n"NA",n\n')
    assert as_dict(read(tmp_path).frame) == {"a": ["1,5", None], "b": ['say "x"', "n"]}  # quoted NA: missing
    write(tmp_path, "q.csv", 'a\n"x"\n')
    assert as_dict(read(tmp_path, "q.csv", quoting="none").frame) == {"a": ['"x"']}
    write(tmp_path, "q.tsv", 'a\tb\n"x\ty"\t1\n')
    assert as_dict(read(tmp_path, "q.tsv", quoting="double").frame) == {"a": ["x\ty"], "b": [1]}


def test_dates_become_datetimes_not_objects(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", "d,n\n2024-01-02,1\n2024-03-04,2\n")
    f = read(tmp_path).frame
    assert pd.api.types.is_datetime64_any_dtype(f["d"])
    assert f["d"].tolist() == [pd.Timestamp("2024-01-02"), pd.Timestamp("2024-03-04")]


# === resolve_files, formats ========================================================================================


def test_resolve_a_directory_leaves_out_hidden_dvc_files_and_folders(tmp_path: Path) -> None:
    for name in ("b.csv", "a.csv", ".hidden.csv", "a.csv.dvc"):
        write(tmp_path, f"d/{name}", "a\n1\n")
    (tmp_path / "d/sub").mkdir()
    write(tmp_path, "d/sub/c.csv", "a\n1\n")
    assert sources.resolve_files("d", tmp_path) == [tmp_path / "d/a.csv", tmp_path / "d/b.csv"]
    assert sources.resolve_files("d/a.csv", tmp_path) == [tmp_path / "d/a.csv"]
    assert sources.resolve_files(str(tmp_path / "d/b.csv"), Path("/elsewhere")) == [tmp_path / "d/b.csv"]


def test_resolve_a_glob(tmp_path: Path) -> None:
    for name in ("d/b.csv", "d/a.csv", "d/x.csv.dvc", "d/sub/c.csv", "d/dir.csv/keep"):
        write(tmp_path, name, "a\n1\n")
    assert sources.resolve_files("d/*.csv", tmp_path) == [tmp_path / "d/a.csv", tmp_path / "d/b.csv"]
    assert sources.resolve_files("d/**/*.csv", tmp_path) == [tmp_path / "d/a.csv", tmp_path / "d/b.csv",
                                                              tmp_path / "d/sub/c.csv"]  # fmt: skip
    assert sources.resolve_files("d/?.csv*", tmp_path) == [tmp_path / "d/a.csv", tmp_path / "d/b.csv"]
    assert sources.resolve_files("d/[b].csv", tmp_path) == [tmp_path / "d/b.csv"]


def test_resolve_with_a_home_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    write(tmp_path, "h/x.csv", "a\n1\n")
    assert sources.resolve_files("~/h/x.csv", Path("/elsewhere")) == [tmp_path / "h/x.csv"]


def test_resolve_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    write(tmp_path, "only/.hidden", "x")
    write(tmp_path, "only/x.dvc", "x")
    messages = []
    for source in ("empty", "only", "d/*.csv", "missing.csv"):
        with pytest.raises(DataError) as info:
            sources.resolve_files(source, tmp_path)
        messages.append(str(info.value))
    assert messages == [
        "data.source: directory empty holds no files; put the data there or fix data.source",
        "data.source: directory only holds no files; put the data there or fix data.source",
        f"data.source: no file matches d/*.csv (under {tmp_path}); put the data there or fix it",
        f"data.source: missing.csv does not exist (looked for {tmp_path / 'missing.csv'}); put the data there or fix "
        "data.source",
    ]
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(DataError) as info:
        sources.resolve_files("pipe", tmp_path)
    assert str(info.value) == "data.source: pipe is not a regular file or directory"


def test_format_from_the_extension_and_from_data_format(tmp_path: Path) -> None:
    files = [tmp_path / n for n in ("a.CSV", "b.txt")]
    assert sources._format(files, params("d"), tmp_path) == "csv"
    for suffix, fmt in sources.FORMAT_BY_SUFFIX.items():
        assert sources._format([tmp_path / f"a{suffix}"], params("d"), tmp_path) == fmt
    assert sources._format([tmp_path / "a.dat", tmp_path / "b.csv"], params("d", format="tsv"), tmp_path) == "tsv"
    by_suffix = {".csv": "csv", ".txt": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet", ".pq": "parquet"}
    assert {**by_suffix, ".jsonl": "jsonl", ".ndjson": "jsonl"} == sources.FORMAT_BY_SUFFIX


def test_format_errors(tmp_path: Path) -> None:
    names = ["a.csv", "b.csv", "c.txt", "d.csv", "e.parquet", "f.dat", "g"]
    with pytest.raises(DataError) as info:
        sources._format([tmp_path / n for n in names], params("data/raw"), tmp_path)
    assert str(info.value) == (
        "data.source: data/raw holds files of 4 formats (csv: a.csv, b.csv, c.txt, ...; parquet: e.parquet; unknown "
        "extension .dat: f.dat; unknown extension (none): g); keep one format there or select one with a glob such "
        "as data/raw/*.csv"
    )
    with pytest.raises(DataError) as info:
        sources._format([tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "c.csv", tmp_path / "d.tsv"], params("r"),
                        tmp_path)  # fmt: skip
    assert str(info.value) == (
        "data.source: r holds files of 2 formats (csv: a.csv, b.csv, c.csv; tsv: d.tsv); keep one format there or "
        "select one with a glob such as data/raw/*.csv"
    )
    with pytest.raises(DataError) as info:
        sources._format([tmp_path / "x.dat", tmp_path / "y.dat"], params("r"), tmp_path)
    assert str(info.value) == (
        "data.source: cannot tell the format of x.dat from its extension '.dat' (data.format: auto); set data.format "
        "to csv, tsv, parquet or jsonl, or rename the file (.csv, .tsv, .parquet, .jsonl)"
    )
    with pytest.raises(DataError) as info:
        sources._format([tmp_path / "noext"], params("r"), tmp_path)
    assert str(info.value) == (
        "data.source: cannot tell the format of noext from its extension '(none)' (data.format: auto); set "
        "data.format to csv, tsv, parquet or jsonl, or rename the file (.csv, .tsv, .parquet, .jsonl)"
    )


# === builtin ======================================================================================================


def test_unknown_builtin() -> None:
    with pytest.raises(DataError) as info:
        sources._read_builtin("builtin:nope")
    assert str(info.value) == (
        "data.source: unknown built-in dataset 'nope'; choose one of builtin:digits, builtin:iris, builtin:wine, "
        "builtin:breast_cancer, builtin:diabetes, builtin:digits_images"
    )


def test_builtin_iris_is_sklearns_frame() -> None:
    from sklearn.datasets import load_iris

    t = read_source(params("builtin:iris"), Path("."))
    expected = load_iris(as_frame=True).frame
    pd.testing.assert_frame_equal(t.frame, expected, check_exact=True)
    assert (t.source, t.files, t.rows, t.fmt, t.root, t.image_column) == ("builtin:iris", [], [150], "builtin", None,
                                                                          None)  # fmt: skip
    assert list(t.frame.index) == list(range(150))


def test_builtin_digits_images_table() -> None:
    t = read_source(params("builtin:digits_images"), Path("."))
    assert list(t.frame.columns) == ["image", "target"]
    assert (t.source, t.files, t.rows, t.fmt, t.image_column) == ("builtin:digits_images", [], [1797], "builtin",
                                                                  "image")  # fmt: skip
    assert t.frame["target"].dtype == np.int64 and t.frame["image"].dtype == object
    first = Image.open(io.BytesIO(t.frame["image"][0]))
    assert (first.format, first.mode, first.size) == ("PNG", "L", (8, 8))


# === csv errors ====================================================================================================


def test_field_count_error_hints(tmp_path: Path) -> None:
    cases = {
        "runs.csv": ('a,b\n1,"x\ny",3\n', "line 2: expected 2 fields (the header has 2), found 3 — the record runs "
                     "from line 2 to 3: an unbalanced quote?"),
        "delim.csv": ("a;b\n1;2\n3,4\n", "line 3: expected 1 fields (the header has 1), found 2 — is data.delimiter "
                      "right (',')?"),
        "more.csv": ("a,b\n1,2\n3,4,5\n", "line 3: expected 2 fields (the header has 2), found 3 — a delimiter inside "
                     "an unquoted value? Quote it, or fix the line"),
        "fewer.csv": ("a,b,c\n1,2,3\n\n4,5\n", "line 4: expected 3 fields (the header has 3), found 2 — a value "
                      "missing with its delimiter, or a line cut short?"),
    }  # fmt: skip
    for name, (text, tail) in cases.items():
        write(tmp_path, name, text)
        assert error(tmp_path, name) == f"data.source: {name}, {tail}"


def test_field_count_error_without_a_header(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", "1,2\n3,4\n5\n")
    assert error(tmp_path, header=False) == (
        "data.source: x.csv, line 3: expected 2 fields (the first line has 2), found 1 — a value missing with its "
        "delimiter, or a line cut short?"
    )
    write(tmp_path, "y.csv", "1,2\n3,4\n")
    assert error(tmp_path, "y.csv", header=False, columns=["a", "b", "c"]) == (
        "data.source: y.csv, line 1: expected 3 fields (data.columns names 3), found 2 — fix data.columns or the line"
    )


def test_field_count_error_direct(tmp_path: Path) -> None:
    path = write(tmp_path, "x.csv", "a,b\n1,2\n")
    assert sources._field_count_error(path, "x.csv", ",", params()) is None
    assert sources._field_count_error(tmp_path / "missing.csv", "m", ",", params()) is None


def test_csv_error_fallbacks(tmp_path: Path) -> None:
    path = write(tmp_path, "x.csv", "a,b\n1,2\n")
    d = params()
    assert str(sources._csv_error(path, "x.csv", "csv", ",", d, ValueError("boom\nmore"))) == (
        "data.source: cannot read x.csv as csv (delimiter ','): boom"
    )
    assert str(sources._csv_error(path, "x.csv", "tsv", "\t", d, ValueError())) == (
        "data.source: cannot read x.csv as tsv (delimiter '\\t'): ValueError"
    )
    assert str(sources._csv_error(path, "x.csv", "csv", ",", d, ValueError("Empty CSV file"))) == (
        "data.source: x.csv is empty: no rows"
    )


@pytest.mark.parametrize(
    ("message", "first"), [("other", "count"), ("invalid UTF8 here", "decode"), ("cannot decode", "decode")]
)
def test_csv_error_order_of_checks(tmp_path: Path, message: str, first: str) -> None:
    path = write(tmp_path, "x.csv", b"a,b\n1,2,3\n4,\xe9\n")
    got = str(sources._csv_error(path, "x.csv", "csv", ",", params(), ValueError(message)))
    count = "data.source: x.csv, line 2: expected 2 fields (the header has 2), found 3 — a delimiter inside an "
    decode = f"data.source: x.csv, line 3, column 'b': byte 0xe9 is not valid utf-8 (data.encoding: utf-8); {UTF8_HINT}"
    assert got.startswith(count) if first == "count" else got == decode
    err = UnicodeDecodeError("utf-8", b"\xe9", 0, 1, "invalid")
    assert str(sources._csv_error(path, "x.csv", "csv", ",", params(), err)) == decode


def test_empty_csv_file(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", "")
    assert error(tmp_path) == "data.source: x.csv is empty: no rows"


def test_a_value_not_utf8(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", b"id,city\n1,Paris\n\n3,Orl\xe9ans\n")
    assert error(tmp_path) == (
        f"data.source: x.csv, line 4, column 'city': byte 0xe9 is not valid utf-8 (data.encoding: utf-8); {UTF8_HINT}"
    )
    write(tmp_path, "y.csv", b"id,city\n1,Orl\xe9ans\n")
    assert error(tmp_path, "y.csv", encoding="ascii") == (
        "data.source: y.csv, line 2, column 'city': byte 0xe9 is not valid ascii (data.encoding: ascii); set "
        "data.encoding to the file's encoding"
    )


def test_a_header_not_utf8(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", b"id,cit\xe9\n1,2\n")
    assert (
        error(tmp_path)
        == f"data.source: x.csv, line 1: byte 0xe9 is not valid utf-8 (data.encoding: utf-8); {UTF8_HINT}"
    )


def test_decode_error_direct(tmp_path: Path) -> None:
    cut = write(tmp_path, "cut.csv", b"a\nb\n\xc3")
    assert str(sources._decode_error(cut, "cut.csv", ",", params())) == (
        "data.source: cut.csv, line 3: the file ends inside a character of utf-8; set data.encoding"
    )
    assert str(sources._decode_error(cut, "cut.csv", None, None)) == (
        "data.source: cut.csv, line 3: the file ends inside a character of utf-8; set data.encoding"
    )
    good = write(tmp_path, "good.csv", "a\né\n")
    assert sources._decode_error(good, "good.csv", ",", params()) is None
    assert sources._decode_error(tmp_path / "missing", "m", ",", params()) is None
    bad = write(tmp_path, "bad.csv", b"a,b\n\xff,1\n")
    assert str(sources._decode_error(bad, "bad.csv", ",", params())) == (
        f"data.source: bad.csv, line 2, column 'a': byte 0xff is not valid utf-8 (data.encoding: utf-8); {UTF8_HINT}"
    )
    assert str(sources._decode_error(bad, "bad.csv", None, None, "ascii")) == (
        "data.source: bad.csv, line 2: byte 0xff is not valid ascii (data.encoding: ascii); set data.encoding to the "
        "file's encoding"
    )
    # an encoding named otherwise than its codec: the hint follows the codec
    assert str(sources._decode_error(bad, "bad.csv", None, None, "UTF8")) == (
        f"data.source: bad.csv, line 2: byte 0xff is not valid UTF8 (data.encoding: UTF8); {UTF8_HINT}"
    )


def test_column_of(tmp_path: Path) -> None:
    path = write(tmp_path, "x.csv", "\ufeffid,city,zip\n")
    d = params()
    assert sources._column_of(b"1,Par", path, None, d, "utf-8") == ""
    assert sources._column_of(b"1,Par", path, ",", None, "utf-8") == ""
    assert sources._column_of(b"", path, ",", d, "utf-8") == ", column 'id'"
    assert sources._column_of(b"1,Par", path, ",", d, "utf-8") == ", column 'city'"
    assert sources._column_of(b'1,"a,b', path, ",", d, "utf-8") == ", column 'city'"
    assert sources._column_of(b"1,2,3,", path, ",", d, "utf-8") == ""  # past the header's columns
    assert sources._column_of(b"1,2,", path, ",", params(columns=["p", "q", "r"], header=False), "utf-8") == (
        ", column 'r'"
    )
    assert sources._column_of(b"1,2,", path, ",", params(header=False), "utf-8") == ", column 'column_3'"
    assert sources._column_of(b"1;2", path, ";", params(header=False), "utf-8") == ", column 'column_2'"
    bad_header = write(tmp_path, "h.csv", b"a,b\xe9c\n")
    assert sources._column_of(b"1,", bad_header, ",", d, "utf-8") == ""
    assert sources._column_of(b"", bad_header, ",", d, "utf-8") == ", column 'a'"


def test_a_bad_byte_in_the_first_column_of_a_file_with_a_bom(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", b"\xef\xbb\xbfid,city\n1,a\n\xe92,b\n")
    assert error(tmp_path) == (
        f"data.source: x.csv, line 3, column 'id': byte 0xe9 is not valid utf-8 (data.encoding: utf-8); {UTF8_HINT}"
    )


def test_parse_csv_cannot_open(tmp_path: Path) -> None:
    path = tmp_path / "gone.csv"
    try:
        pv.read_csv(path)
    except OSError as exc:
        expected = f"data.source: cannot read gone.csv: {exc}"
    d = params()
    options = sources._csv_options(path, "csv", ",", d)
    with pytest.raises(DataError) as info:
        sources._parse_csv(path, options, path, "gone.csv", "csv", ",", d)
    assert str(info.value) == expected


def test_csv_options(tmp_path: Path) -> None:
    path = tmp_path / "opts.csv"
    o = sources._csv_options(path, "csv", ";", params(encoding="latin-1"))
    assert (o.read.use_threads, o.read.block_size, o.read.encoding, o.read.column_names,
            o.read.autogenerate_column_names) == (True, 4 << 20, "latin-1", [], False)  # fmt: skip
    assert (o.parse.delimiter, o.parse.quote_char, o.parse.newlines_in_values, o.parse.ignore_empty_lines) == (
        ";", '"', True, True)  # fmt: skip
    assert o.convert.null_values == sources.NA_VALUES
    assert (o.convert.strings_can_be_null, o.convert.quoted_strings_can_be_null, o.quoted) == (True, True, True)
    assert path not in sources._UNQUOTED
    h = sources._csv_options(path, "csv", ",", params(header=False))
    assert (h.read.autogenerate_column_names, h.read.column_names) == (True, [])
    c = sources._csv_options(path, "csv", ",", params(header=False, columns=["a", "b"]))
    assert (c.read.autogenerate_column_names, c.read.column_names) == (False, ["a", "b"])
    t = sources._csv_options(tmp_path / "t.tsv", "tsv", "\t", params())
    assert (t.parse.quote_char, t.parse.newlines_in_values, t.quoted) == (False, False, False)
    assert tmp_path / "t.tsv" in sources._UNQUOTED
    d = sources._csv_options(tmp_path / "d.tsv", "tsv", "\t", params(quoting="double"))
    assert (d.parse.quote_char, d.quoted) == ('"', True)
    n = sources._csv_options(tmp_path / "n.csv", "csv", ",", params(quoting="none"))
    assert (n.parse.quote_char, n.quoted) == (False, False)


def test_later_chunk_options() -> None:
    read = pv.ReadOptions(use_threads=False, block_size=1234, encoding="latin-1", skip_rows=3,
                          autogenerate_column_names=True)  # fmt: skip
    later = sources._later_chunk(read, ["a", "b"])
    assert (later.use_threads, later.block_size, later.encoding, later.column_names, later.skip_rows,
            later.autogenerate_column_names) == (False, 1234, "latin-1", ["a", "b"], 0, False)  # fmt: skip
    again = sources._later_chunk(pv.ReadOptions(use_threads=True, block_size=99), [])
    assert (again.use_threads, again.block_size, again.encoding) == (True, 99, "utf8")


# === open quotes ===================================================================================================


def test_a_quote_left_open(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", 'a,b\n1,ok\n\n2,"open\n3,x\n\n')
    assert error(tmp_path) == (
        "data.source: x.csv, line 4: a quoted value is never closed and runs to the end of the file; add the missing "
        'closing quote (")'
    )
    write(tmp_path, "r.csv", 'a,b\r1,"open\r2,x\r')  # carriage returns only
    assert error(tmp_path, "r.csv") == (
        "data.source: r.csv, line 2: a quoted value is never closed and runs to the end of the file; add the missing "
        'closing quote (")'
    )


def test_a_closed_multiline_value_at_the_end_with_trailing_blanks(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", 'a,b\n1,"x\ny" \t\r\n\r\n')
    assert read(tmp_path).frame["b"].tolist() == ["x\ny \t"]
    write(tmp_path, "z.csv", 'a,b\n1,"x\ny"\x00\n')
    assert read(tmp_path, "z.csv").frame["b"].tolist() == ["x\ny\x00"]


def test_a_last_value_with_a_line_break_and_a_long_tail(tmp_path: Path) -> None:
    tail = "z" * 40
    write(tmp_path, "x.csv", f'a,b\n1,"x\n{tail}"\n')
    assert read(tmp_path).frame["b"].tolist() == [f"x\n{tail}"]


def test_check_closed_quotes_direct(tmp_path: Path) -> None:
    path = write(tmp_path, "x.csv", 'a,b\n1,"open\n2\n')
    d = params()
    ok = [pa.table({}), pa.table({"a": pa.array([], pa.string())}), pa.table({"a": [1]}), pa.table({"a": [None]}),
          pa.table({"a": ["no break"]}), pa.table({"a": ["x\ny"], "b": [1]})]  # fmt: skip
    for table in ok:
        sources._check_closed_quotes(table, path, "x.csv", ",", d)
    for table in (pa.table({"a": ["x\ny"]}), pa.table({"a": pa.array(["x\ry"], pa.large_string())})):
        with pytest.raises(DataError, match=r"^data\.source: x\.csv, line 2: a quoted value is never closed"):
            sources._check_closed_quotes(table, path, "x.csv", ",", d)
    with pytest.raises(DataError, match=r"^data\.source: x\.csv, line 2: a quoted"):
        sources._check_closed_quotes(pa.table({"a": ["p", "x\ny"]}), path, "x.csv", ",", d, -1)
    # the record cannot be found (the file is shorter): no line
    with pytest.raises(DataError, match=r"^data\.source: x\.csv: a quoted value is never closed"):
        sources._check_closed_quotes(pa.table({"a": ["x\ny"]}), path, "x.csv", ",", d, 5)


# === repeated names ================================================================================================


def test_repeated_and_check_unique() -> None:
    assert sources._repeated(["a", "b", "a", "a", "c", "b"]) == ["a", "b"]
    assert sources._repeated(["a", "b"]) == []
    sources._check_unique(["a", "b"], "what")
    with pytest.raises(DataError) as info:
        sources._check_unique(["x", "y", "y", "x"], "the names")
    assert str(info.value) == "the names 'y', 'x' more than once; column names must be unique"


# === jsonl =========================================================================================================


def test_jsonl_frame_with_na_spellings(tmp_path: Path) -> None:
    write(tmp_path, "x.jsonl", '{"a": 1, "s": "NA", "t": "x"}\n{"a": 2, "s": "?", "t": "y"}\n{"a": 3, "s": "k"}\n')
    t = read(tmp_path, "x.jsonl")
    assert as_dict(t.frame) == {"a": [1, 2, 3], "s": [None, None, "k"], "t": ["x", "y", None]}
    assert (t.fmt, t.rows, t.notes) == ("jsonl", [3], [])


def test_na_to_null_direct() -> None:
    table = pa.table({"n": [1, 2], "s": ["NA", "ok"], "l": pa.array(["null", "x"], pa.large_string()),
                      "k": ["a", "b"]})  # fmt: skip
    out = sources._na_to_null(table)
    assert out.to_pydict() == {"n": [1, 2], "s": [None, "ok"], "l": [None, "x"], "k": ["a", "b"]}
    assert out.schema == table.schema


def test_jsonl_latin1_and_bad_bytes(tmp_path: Path) -> None:
    write(tmp_path, "x.jsonl", '{"c": "Orl\xe9ans"}\n\n{"c": "NA"}\n'.encode("latin-1"))
    assert as_dict(read(tmp_path, "x.jsonl", encoding="latin-1").frame) == {"c": ["Orléans", None]}
    assert error(tmp_path, "x.jsonl") == (
        f"data.source: x.jsonl, line 1: byte 0xe9 is not valid utf-8 (data.encoding: utf-8); {UTF8_HINT}"
    )
    assert error(tmp_path, "x.jsonl", encoding="ascii") == (
        "data.source: x.jsonl, line 1: byte 0xe9 is not valid ascii (data.encoding: ascii); set data.encoding to the "
        "file's encoding"
    )


def test_jsonl_bad_bytes_in_a_key(tmp_path: Path) -> None:
    write(tmp_path, "x.jsonl", b'{"a": 1}\n{"\xe9": 2}\n')
    assert error(tmp_path, "x.jsonl") == (
        f"data.source: x.jsonl, line 2: byte 0xe9 is not valid utf-8 (data.encoding: utf-8); {UTF8_HINT}"
    )


@pytest.mark.parametrize("content", ["", "\n\n  \n"], ids=["empty", "blank"])
def test_an_empty_jsonl_file(tmp_path: Path, content: str) -> None:
    write(tmp_path, "x.jsonl", content)
    expected = {"empty": "is empty: no rows", "blank": "has no rows; fill it, or remove it from data.source"}
    assert error(tmp_path, "x.jsonl") == f"data.source: x.jsonl {expected['blank' if content else 'empty']}"


def test_jsonl_errors_name_the_line(tmp_path: Path) -> None:
    line = '{"a": 3,\n'  # cut short: the error is at its end, character 9 (not character 1 of the next line)
    detail = "Expecting property name enclosed in double quotes at character 9"
    write(tmp_path, "x.jsonl", '{"a": 1}\n\n' + line)
    assert error(tmp_path, "x.jsonl") == (
        f"data.source: x.jsonl, line 3: not valid JSON ({detail}); each line must hold one JSON object"
    )
    write(tmp_path, "y.jsonl", '{"a": 1}\n[1, 2]\n')
    assert error(tmp_path, "y.jsonl") == (
        "data.source: y.jsonl, line 2: expected one JSON object per line, found a list"
    )
    write(tmp_path, "z.jsonl", '{"a": 1}\n\n"text"\n')
    assert error(tmp_path, "z.jsonl") == (
        "data.source: z.jsonl, line 3: expected one JSON object per line, found a str"
    )


def test_jsonl_fallback_columns(tmp_path: Path) -> None:
    rows = [
        {"a": 1, "b": True, "c": "NA"},
        {"a": "two", "b": "x", "c": 7, "d": [1, 2]},
        {"a": 3.5, "c": {"k": 1}, "d": 5},
    ]
    write(tmp_path, "x.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    t = read(tmp_path, "x.jsonl")
    assert list(t.frame.columns) == ["a", "b", "c", "d"]
    assert as_dict(t.frame) == {
        "a": ["1", "two", "3.5"],
        "b": ["true", "x", None],
        "c": [None, "7", '{"k": 1}'],
        "d": [None, "[1, 2]", "5"],
    }
    assert t.where(2) == "x.jsonl, line 3"


def test_jsonl_fallback_direct(tmp_path: Path) -> None:
    path = write(tmp_path, "x.jsonl", '{"a": 1, "s": "null"}\n\n{"a": 2.5, "s": "v"}\n')
    out = sources._jsonl_fallback(path, "x.jsonl", "utf-8")
    assert out.to_pydict() == {"a": [1.0, 2.5], "s": [None, "v"]}
    assert out.schema.field("a").type == pa.float64()
    big = write(tmp_path, "big.jsonl", '{"a": 1}\n{"a": 99999999999999999999999}\n')
    assert sources._jsonl_fallback(big, "big.jsonl", "utf-8").to_pydict() == {"a": ["1", "99999999999999999999999"]}
    empty = write(tmp_path, "e.jsonl", "\n \n")
    with pytest.raises(DataError) as info:
        sources._jsonl_fallback(empty, "e.jsonl", "utf-8")
    assert str(info.value) == "data.source: e.jsonl is empty: no rows"
    bad = write(tmp_path, "bad.jsonl", b'{"a": "\xe9"}\n')
    with pytest.raises(DataError) as info:
        sources._jsonl_fallback(bad, "bad.jsonl", "utf-8")
    assert str(info.value) == (
        f"data.source: bad.jsonl, line 1: byte 0xe9 is not valid utf-8 (data.encoding: utf-8); {UTF8_HINT}"
    )


# === parquet =======================================================================================================


def test_parquet_index_columns(tmp_path: Path) -> None:
    frame = pd.DataFrame({"a": [1, 2, 3]}, index=pd.Index([10, 11, 12]))
    frame.to_parquet(tmp_path / "unnamed.parquet")
    t = read(tmp_path, "unnamed.parquet")
    assert as_dict(t.frame) == {"a": [1, 2, 3]} and list(t.frame.index) == [0, 1, 2]
    frame.rename_axis("idx").to_parquet(tmp_path / "named.parquet")
    n = read(tmp_path, "named.parquet")
    assert as_dict(n.frame) == {"idx": [10, 11, 12], "a": [1, 2, 3]} and list(n.frame.index) == [0, 1, 2]
    assert (n.fmt, n.rows) == ("parquet", [3])


def test_unnamed_index_direct() -> None:
    meta = {
        "index_columns": ["__index_level_0__", {"kind": "range"}, "idx", "__index_level_12__", "x__index_level_1__"]
    }
    schema = pa.schema([pa.field("a", pa.int64())], metadata={b"pandas": json.dumps(meta).encode()})
    assert sources.unnamed_index(schema) == ["__index_level_0__", "__index_level_12__"]
    assert sources.unnamed_index(pa.schema([pa.field("a", pa.int64())])) == []
    empty = pa.schema([pa.field("a", pa.int64())], metadata={b"pandas": b"{}"})
    assert sources.unnamed_index(empty) == []


def test_a_file_that_is_not_parquet(tmp_path: Path) -> None:
    path = write(tmp_path, "x.parquet", b"not parquet at all")
    try:
        pq.read_table(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        first = str(exc).splitlines()[0]
    expected = f"data.source: x.parquet is not a readable Parquet file ({first})"
    assert error(tmp_path, "x.parquet") == expected


# === combining files ==============================================================================================


def test_concat_selects_the_first_files_order_and_unifies_types(tmp_path: Path) -> None:
    write(tmp_path, "d/a.csv", "x,y,z\n1,,p\n2,,q\n")
    write(tmp_path, "d/b.csv", "z,x,y\nr,3.5,4\n")
    write(tmp_path, "d/c.csv", "y,z,x\n5,s,6\n")
    t = read(tmp_path, "d")
    f = t.frame
    assert list(f.columns) == ["x", "y", "z"]
    assert f["x"].dtype == np.float64 and f["x"].tolist() == [1.0, 2.0, 3.5, 6.0]
    assert f["y"].tolist()[2:] == [4.0, 5.0] and f["y"].isna().tolist() == [True, True, False, False]
    assert f["z"].tolist() == ["p", "q", "r", "s"]
    assert t.rows == [2, 1, 1] and t.record.tolist() == [0, 1, 0, 0] and t.file_index.tolist() == [0, 0, 1, 2]
    assert t.where_many([3, 2], "z") == ["d/c.csv, line 2, column 'z'", "d/b.csv, line 2, column 'z'"]


def test_concat_of_types_that_cannot_be_combined(tmp_path: Path) -> None:
    pq.write_table(pa.table({"a": pa.array([[1, 2]], pa.list_(pa.int64()))}), tmp_path / "1.parquet")
    pq.write_table(pa.table({"a": pa.array([3], pa.int64())}), tmp_path / "2.parquet")
    listed = pq.read_table(tmp_path / "1.parquet").column("a")
    try:
        listed.cast(pa.string())
    except (pa.ArrowException, ValueError) as exc:
        detail = str(exc)
    assert error(tmp_path, "*.parquet") == (
        f"data.source: column 'a' of 1.parquet is {listed.type}, which cannot be combined with the other files' "
        f"string ({detail})"
    )


def test_concat_direct_keeps_equal_types_and_casts_others(tmp_path: Path) -> None:
    files = [tmp_path / "a", tmp_path / "b"]
    one = pa.table({"a": [1]})
    assert sources._concat([one], files[:1], tmp_path) is one
    out = sources._concat([pa.table({"a": [1], "b": ["x"]}), pa.table({"b": ["y"], "a": pa.array([2], pa.int32())})],
                          files, tmp_path)  # fmt: skip
    assert out.schema == pa.schema([pa.field("a", pa.int64()), pa.field("b", pa.string())])
    assert out.to_pydict() == {"a": [1, 2], "b": ["x", "y"]}


def test_check_same_columns(tmp_path: Path) -> None:
    files = [tmp_path / "d/a.csv", tmp_path / "d/b.csv", tmp_path / "d/c.csv"]
    sources._check_same_columns(["a", "b"], ["b", "a"], files, 1, tmp_path)
    cases = [
        (["a", "b"], ["a"], "lacks ['b']"),
        (["a"], ["a", "c", "d"], "has extra ['c', 'd']"),
        (["a", "b"], ["a", "c"], "lacks ['b'] and has extra ['c']"),
        (["a", "b"], ["a", "b", "b"], "repeats a column name"),
    ]
    for names, other, detail in cases:
        with pytest.raises(DataError) as info:
            sources._check_same_columns(names, other, files, 2, tmp_path)
        assert str(info.value) == (
            f"data.source: d/c.csv has other columns than d/a.csv: it {detail}; files of one source must have the "
            "same columns"
        )


def test_common_type() -> None:
    assert sources._common_type("a", [pa.null(), pa.null()]) == pa.null()
    assert sources._common_type("a", [pa.null(), pa.int64(), pa.int64()]) == pa.int64()
    assert sources._common_type("a", [pa.int64(), pa.float64()]) == pa.float64()
    assert sources._common_type("a", [pa.int32(), pa.null(), pa.int64()]) == pa.int64()
    assert sources._common_type("a", [pa.int64(), pa.string()]) == pa.string()
    assert sources._common_type("a", [pa.list_(pa.int64()), pa.int64()]) == pa.string()


def test_to_pandas_names_columns_by_str() -> None:
    frame = sources._to_pandas(pa.table({"1": [1], "b": pa.array([19000], pa.date32())}))
    assert list(frame.columns) == ["1", "b"] and all(isinstance(c, str) for c in frame.columns)
    assert pd.api.types.is_datetime64_any_dtype(frame["b"])


# === locating lines ================================================================================================


def test_csv_records_and_start_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "x.csv", 'h1,h2\n\n1,"a\r\nb"\r\n\n2,c\n3,d\n')
    assert list(sources._csv_records(path, ",", "utf-8")) == [
        (1, 1, ["h1", "h2"]), (3, 4, ["1", "a\r\nb"]), (6, 6, ["2", "c"]), (7, 7, ["3", "d"])]  # fmt: skip
    assert list(sources._csv_start_lines(path, ",", "utf-8", True, 5)) == [3, 6, 7]
    assert list(sources._csv_start_lines(path, ",", "utf-8", True, 1)) == [3, 6]
    assert list(sources._csv_start_lines(path, ",", "utf-8", True, 0)) == [3]
    assert list(sources._csv_start_lines(path, ",", "utf-8", False, 1)) == [1, 3]
    assert list(sources._csv_start_lines(tmp_path / "missing", ",", "utf-8", True, 3)) == []
    assert sources._csv_record_lines(path, ",", "utf-8", True, set()) == {}
    assert sources._csv_record_lines(path, ",", "utf-8", True, {-1, 1, 9}) == {-1: 1, 1: 6}
    assert sources._csv_record_lines(path, ",", "utf-8", False, {0, 2}) == {0: 1, 2: 6}
    assert sources._csv_record_lines(tmp_path / "missing", ",", "utf-8", True, {0}) == {}
    assert sources._header_line(path, ",", "utf-8") == 1
    blank = write(tmp_path, "b.csv", "\n\n\nh\n")
    assert sources._header_line(blank, ",", "utf-8") == 4
    assert sources._header_line(write(tmp_path, "e.csv", "\n\n"), ",", "utf-8") == 1


def test_csv_records_of_an_unquoted_file(tmp_path: Path) -> None:
    path = write(tmp_path, "u.tsv", 'a\t"b\n1\t"x\n')
    sources._csv_options(path, "tsv", "\t", params())  # registers the file as unquoted
    assert list(sources._csv_records(path, "\t", "utf-8")) == [(1, 1, ["a", '"b']), (2, 2, ["1", '"x'])]


def test_csv_records_of_a_latin1_file(tmp_path: Path) -> None:
    path = write(tmp_path, "l.csv", "é,b\n".encode("latin-1"))
    assert list(sources._csv_records(path, ",", "latin-1")) == [(1, 1, ["é", "b"])]
    assert list(sources._csv_records(path, ",", "utf-8")) == [(1, 1, ["\ufffd", "b"])]  # replaced, not an error


def test_a_field_longer_than_the_csv_modules_default_limit(tmp_path: Path) -> None:
    long = "v" * 200_000
    path = write(tmp_path, "x.csv", f"a,b\n1,{long}\n2,y\n")
    assert list(sources._csv_start_lines(path, ",", "utf-8", True, 5)) == [2, 3]


def test_jsonl_start_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "x.jsonl", '\n{"a": 1}\n \n{"a": 2}\n{"a": 3}\n')
    assert list(sources._jsonl_start_lines(path, "utf-8", 9)) == [2, 4, 5]
    assert list(sources._jsonl_start_lines(path, "utf-8", 1)) == [2, 4]
    assert list(sources._jsonl_start_lines(path, "utf-8", 0)) == [2]
    assert list(sources._jsonl_start_lines(tmp_path / "missing", "utf-8", 0)) == []


# === images =======================================================================================================


def image_folder(root: Path) -> dict[str, bytes]:
    pictures = {
        "imgs/b/2.png": png_bytes([[1, 2], [3, 4]]),
        "imgs/a/z.png": png_bytes([[5]]),
        "imgs/a/sub/y.PNG": png_bytes([[6, 7]]),
        "imgs/a/1.png": png_bytes([[8]]),
    }
    for rel, data in pictures.items():
        write(root, rel, data)
    write(root, "imgs/a/.DS_Store", "junk")
    write(root, "imgs/a/.cache/x.txt", "junk")
    write(root, "imgs/.hidden/x.txt", "junk")
    write(root, "imgs/.notes", "junk")
    return pictures


def test_image_folder_detection(tmp_path: Path) -> None:
    image_folder(tmp_path)
    assert sources._image_folder("imgs", tmp_path) == tmp_path / "imgs"
    assert sources._image_folder(str(tmp_path / "imgs"), Path("/elsewhere")) == tmp_path / "imgs"
    assert sources._image_folder("imgs/*", tmp_path) is None
    assert sources._image_folder("imgs/a/1.png", tmp_path) is None
    assert sources._image_folder("missing", tmp_path) is None
    write(tmp_path, "flat/x.png", png_bytes([[1]]))
    assert sources._image_folder("flat", tmp_path) is None  # no subfolders
    write(tmp_path, "hidden_only/.git/x", "x")
    write(tmp_path, "hidden_only/y.png", "x")
    assert sources._image_folder("hidden_only", tmp_path) is None
    write(tmp_path, "tables/sub/x.png", png_bytes([[1]]))
    write(tmp_path, "tables/t.CSV", "a\n1\n")
    assert sources._image_folder("tables", tmp_path) is None


def test_read_an_image_folder(tmp_path: Path) -> None:
    pictures = image_folder(tmp_path)
    t = read(tmp_path, "imgs", target="label", image_column="pic")
    order = ["imgs/a/1.png", "imgs/a/sub/y.PNG", "imgs/a/z.png", "imgs/b/2.png"]
    assert list(t.frame.columns) == ["pic", "pic_path", "label"]
    assert [bytes(b) for b in t.frame["pic"]] == [pictures[p] for p in order]
    assert t.frame["pic_path"].tolist() == order and t.frame["label"].tolist() == ["a", "a", "a", "b"]
    assert t.frame["pic"].dtype == object
    assert (t.source, t.files, t.rows, t.fmt, t.root, t.image_column) == (
        "imgs", [tmp_path / p for p in order], [1, 1, 1, 1], "images", tmp_path, "pic")  # fmt: skip
    assert t.where(3, "pic") == "imgs/b/2.png, column 'pic'"
    default = read(tmp_path, "imgs")
    assert list(default.frame.columns) == ["image", "image_path", "target"] and default.image_column == "image"


def test_image_folder_errors(tmp_path: Path) -> None:
    image_folder(tmp_path)
    write(tmp_path, "imgs/stray.png", png_bytes([[1]]))
    write(tmp_path, "imgs/astray.png", png_bytes([[1]]))
    assert error(tmp_path, "imgs") == (
        "data.source: imgs/astray.png is not inside a class folder; a folder of images holds one folder per class "
        "(<dir>/<class>/<image>): move it into one, or remove it"
    )
    (tmp_path / "imgs/stray.png").unlink()
    (tmp_path / "imgs/astray.png").unlink()
    (tmp_path / "imgs/c").mkdir()
    write(tmp_path, "imgs/c/.hidden.png", png_bytes([[1]]))
    assert error(tmp_path, "imgs") == "data.source: class folder imgs/c holds no images; fill or remove it"
    write(tmp_path, "imgs/c/notes", "x")
    assert error(tmp_path, "imgs") == (
        f"data.source: imgs/c/notes is not an image by its extension ((none)); a folder of images holds {IMAGE_KINDS} "
        "files: remove or rename it"
    )
    (tmp_path / "imgs/c/notes").unlink()
    write(tmp_path, "imgs/c/x.txt", "x")
    assert error(tmp_path, "imgs") == (
        f"data.source: imgs/c/x.txt is not an image by its extension (.txt); a folder of images holds {IMAGE_KINDS} "
        "files: remove or rename it"
    )
    assert sorted(sources.IMAGE_SUFFIXES) == IMAGE_KINDS.split(", ")


def test_read_images_from_a_table_of_paths(tmp_path: Path) -> None:
    pictures = image_folder(tmp_path)
    absolute = tmp_path / "imgs/b/2.png"
    write(tmp_path, "imgs/list.csv", f"id,file,label\n1, a/1.png ,x\n2,{absolute},y\n")
    t = read(tmp_path, "imgs/list.csv", image_column="file", target="label")
    assert list(t.frame.columns) == ["id", "file", "file_path", "label"]
    assert [bytes(b) for b in t.frame["file"]] == [pictures["imgs/a/1.png"], pictures["imgs/b/2.png"]]
    assert t.frame["file_path"].tolist() == ["imgs/a/1.png", "imgs/b/2.png"]
    assert t.image_column == "file"


def test_image_paths_are_relative_to_each_table_files_folder(tmp_path: Path) -> None:
    one, two = png_bytes([[1]]), png_bytes([[2, 3]])
    write(tmp_path, "p/a/img.png", one)
    write(tmp_path, "p/b/img.png", two)
    write(tmp_path, "p/a/list.csv", "f,y\nimg.png,1\nimg.png,2\n")
    write(tmp_path, "p/b/list.csv", "f,y\nimg.png,3\n")
    t = read(tmp_path, "p/*/list.csv", image_column="f", target="y")
    assert [bytes(b) for b in t.frame["f"]] == [one, one, two]
    assert t.frame["f_path"].tolist() == ["p/a/img.png", "p/a/img.png", "p/b/img.png"]


def test_read_images_without_files_is_relative_to_the_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pictures = image_folder(tmp_path)
    raw = RawTable(pd.DataFrame({"p": ["imgs/a/z.png"], "y": [1]}), "builtin:x", [], [1], "builtin", tmp_path)
    sources.read_images(raw, "p")
    assert [bytes(b) for b in raw.frame["p"]] == [pictures["imgs/a/z.png"]]
    assert raw.frame["p_path"].tolist() == ["imgs/a/z.png"] and raw.image_column == "p"
    monkeypatch.chdir(tmp_path / "imgs")
    cwd = RawTable(pd.DataFrame({"p": ["a/1.png"]}), "builtin:x", [], [1], "builtin")
    sources.read_images(cwd, "p")
    assert [bytes(b) for b in cwd.frame["p"]] == [pictures["imgs/a/1.png"]]
    assert cwd.frame["p_path"].tolist() == [str(tmp_path / "imgs/a/1.png")]


def test_read_images_keeps_a_column_of_bytes(tmp_path: Path) -> None:
    good = png_bytes([[9, 9]])
    pd.DataFrame({"img": [good, good], "y": [0, 1]}).to_parquet(tmp_path / "t.parquet")
    t = read(tmp_path, "t.parquet", image_column="img", target="y")
    assert as_dict(t.frame) == {"img": [good, good], "img_path": ["", ""], "y": [0, 1]}
    pd.DataFrame({"img": [good, b"junk"], "y": [0, 1]}).to_parquet(tmp_path / "bad.parquet")
    message = error(tmp_path, "bad.parquet", image_column="img", target="y")
    assert re.fullmatch(
        r"data\.source: image bad\.parquet, row 2, column 'img' cannot be read \(cannot identify image file "
        r"<_io\.BytesIO object at 0x[0-9a-f]+>\); replace the file or remove its row",
        message,
    ), message


def test_read_images_errors(tmp_path: Path) -> None:
    image_folder(tmp_path)
    frame = pd.DataFrame({f"c{i}": [1] for i in range(32)})
    frame["f"] = ["x"]
    raw = RawTable(frame, "src", [], [1], "builtin", tmp_path)
    with pytest.raises(DataError) as info:
        sources.read_images(raw, "nope")
    listed = ", ".join(f"'c{i}'" for i in range(30))
    assert str(info.value) == (
        f"data.image_column 'nope' is not a column of src (for this data: -S data.image_column=null); the columns are: "
        f"{listed}"
    )
    both = RawTable(pd.DataFrame({"f": ["x"], "f_path": ["y"]}), "src", [], [1], "builtin", tmp_path)
    with pytest.raises(DataError) as info:
        sources.read_images(both, "f")
    assert str(info.value) == (
        "data.source: src has a column 'f_path', the name ingest gives the paths of the images of data.image_column "
        "'f'; rename it"
    )
    write(tmp_path, "list.csv", "f,y\nimgs/a/1.png,1\n,2\n  ,3\nimgs/a/1.png,4\n")
    assert error(tmp_path, "list.csv", image_column="f", target="y") == (
        "data.source: list.csv, line 3, column 'f': the image path is missing (2 row(s) without one); fill it in or "
        "drop the row"
    )
    write(tmp_path, "gone.csv", "f,y\nimgs/a/1.png,1\nimgs/a/9.png,2\n")
    assert error(tmp_path, "gone.csv", image_column="f", target="y") == (
        f"data.source: gone.csv, line 3, column 'f': image 'imgs/a/9.png' does not exist (looked for "
        f"{tmp_path / 'imgs/a/9.png'}); paths are relative to the table file's folder"
    )
    write(tmp_path, "imgs/a/broken.png", b"\x89PNG junk")
    write(tmp_path, "broken.csv", "f,y\nimgs/a/broken.png,1\n")
    message = error(tmp_path, "broken.csv", image_column="f", target="y")
    assert message.startswith(
        "data.source: image imgs/a/broken.png (broken.csv, line 2, column 'f') cannot be read ("
    ) and message.endswith("); replace the file or remove its row"), message


def test_read_image_file_that_cannot_be_read(tmp_path: Path) -> None:
    (tmp_path / "d.png").mkdir()
    with pytest.raises(DataError) as info:
        sources._read_image_file(tmp_path / "d.png", "d.png")
    assert str(info.value) == "data.source: cannot read image d.png: Is a directory"
    path = write(tmp_path, "ok.png", png_bytes([[1, 2]]))
    assert sources._read_image_file(path, "ok.png") == path.read_bytes()


def test_a_truncated_image_fails_when_decoded(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    data = png_bytes(rng.integers(0, 255, (64, 64)).tolist())
    with pytest.raises(DataError, match=r"^data\.source: image cut\.png cannot be read \(.+\); replace the file"):
        sources._check_image(data[: len(data) // 2], "cut.png")
    sources._check_image(data, "whole.png")


def test_objects_holds_bytes() -> None:
    out = sources._objects([b"a", b"bc"])
    assert out.dtype == object and out.tolist() == [b"a", b"bc"] and out.shape == (2,)
    assert sources._objects([]).shape == (0,)


# === the choice of a streamed read, and the spill ==================================================================


def test_stream_choice_messages(tmp_path: Path) -> None:
    big = tmp_path / "a.csv"
    with big.open("wb") as f:
        f.truncate(3 << 20)  # 3 MiB, sparse
    files = [big]
    what = "1 file of 3.0 MiB, about 9 MiB in memory"
    assert sources._stream_choice(files, "csv", params(memory_budget_mb=9)) == (
        False, f"read into memory ({what}; data.memory_budget_mb 9)")  # fmt: skip
    assert sources._stream_choice(files, "csv", params(memory_budget_mb=8.9)) == (
        True, f"read a column at a time from a spill on disk ({what}, over data.memory_budget_mb 9)")  # fmt: skip
    assert sources._stream_choice(files, "jsonl", params(memory_budget_mb=2)) == (
        True, f"read a column at a time from a spill on disk ({what}, over data.memory_budget_mb 2)")  # fmt: skip
    assert sources._stream_choice(files, "jsonl", params(memory_budget_mb=2, encoding="utf-16")) == (
        False, f"read into memory although over data.memory_budget_mb 2 ({what}): jsonl in utf-16 is not streamed "
        "(its line breaks are not the byte \\n)")  # fmt: skip
    assert sources._stream_choice(files, "tsv", params(memory_budget_mb=2, image_column="p")) == (
        False, f"read into memory although over data.memory_budget_mb 2 ({what}): a table of images "
        "(data.image_column) is read whole, then its images spilled")  # fmt: skip
    second = tmp_path / "b.csv"
    with second.open("wb") as f:
        f.truncate(1500 << 20)
    assert sources._stream_choice([big, second], "csv", params(memory_budget_mb=4000)) == (
        True, "read a column at a time from a spill on disk (2 files of 1,503.0 MiB, about 4,509 MiB in memory, over "
        "data.memory_budget_mb 4,000)")  # fmt: skip


def test_stream_choice_of_parquet_counts_its_uncompressed_data(tmp_path: Path) -> None:
    pq.write_table(pa.table({"a": np.arange(1000)}), tmp_path / "a.parquet", row_group_size=300)
    write(tmp_path, "b.parquet", b"not parquet")
    meta = pq.read_metadata(tmp_path / "a.parquet")
    assert meta.num_row_groups == 4
    size = sum(meta.row_group(i).total_byte_size for i in range(4))
    files = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    budget = 3 * size / 2**20
    assert sources._stream_choice(files, "parquet", params(memory_budget_mb=budget))[0] is False
    streamed, why = sources._stream_choice(files, "parquet", params(memory_budget_mb=budget * 0.999))
    assert streamed is True and why.startswith(f"read a column at a time from a spill on disk (2 files of "
                                               f"{size / 2**20:,.1f} MiB, about")  # fmt: skip


def test_budget_mb() -> None:
    from trainflow.data.stream import budget_mb

    assert budget_mb(params(memory_budget_mb=12.5)) == 12.5
    assert budget_mb(params()) == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 4 / 2**20


def test_read_source_says_how_it_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, "x.csv", "a,b\n1,2\n")
    size = (tmp_path / "x.csv").stat().st_size
    t = read_source(params(memory_budget_mb=1), tmp_path, tmp_path / "spill")
    assert isinstance(t.frame, pd.DataFrame)
    assert capsys.readouterr().err == (
        f"ingest: read into memory (1 file of {size / 2**20:,.1f} MiB, about {3 * size / 2**20:,.0f} MiB in memory; "
        "data.memory_budget_mb 1)\n"
    )
    read_source(params(), tmp_path)
    assert capsys.readouterr().err == ""


def test_a_spilled_csv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "CHUNK_BYTES", 16)
    rows = [f"{i},{i * 2},{'x' if i < 6 else 2.5},{'p' if i > 8 else ''}," for i in range(12)]
    write(tmp_path, "x.csv", "\n" + "a,b,c,d,e\n" + "\n".join(rows) + "\n")
    t = read_source(params(memory_budget_mb=0.000001), tmp_path, tmp_path / "not/yet/spill")
    f = t.frame
    assert isinstance(f, spill.SpilledFrame)
    whole = pv.read_csv(tmp_path / "x.csv")
    assert f.columns == ["a", "b", "c", "d", "e"] and f.shape == (12, 5) and len(f) == 12
    assert f.types == {n: whole.schema.field(n).type for n in ("a", "b", "c", "d", "e")}
    assert (f.types["c"], f.types["d"], f.types["e"]) == (pa.string(), pa.string(), pa.null())
    assert as_dict(f)["d"][8:] == [None, "p", "p", "p"] and f["e"].isna().all()
    assert f.arrow("a").to_pylist() == list(range(12)) and f["c"].tolist() == whole.column("c").to_pylist()
    k = len(f.parts[0])
    assert k > 3 and f.parts == [[tmp_path / f"not/yet/spill/0-{i}.arrow" for i in range(k)]]
    assert f.replaced == {(0, "c"): tmp_path / "not/yet/spill/0-column-2.arrow"}  # d's first chunks are null: any type
    assert f.shown == ["x.csv"] and f.folder == tmp_path / "not/yet/spill"
    assert (t.fmt, t.rows, t.notes, t.delimiter, t.encoding, t.source) == ("csv", [12], [], ",", "utf-8", "x.csv")
    assert t.where(11, "c") == "x.csv, line 14, column 'c'"


def test_a_spilled_csv_with_an_index_column_several_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "CHUNK_BYTES", 12)
    write(tmp_path, "d/a.tsv", "\tx\ty\n2\t1\tp\n0\t2\tq\n1\t3\tr\n")
    write(tmp_path, "d/b.tsv", "\tx\ty\n1\t4.5\ts\n0\t5\tt\n")
    t = spilled(tmp_path, "d")
    f = t.frame
    assert f.columns == ["x", "y"] and f.shape == (5, 2)
    assert f.types == {"x": pa.float64(), "y": pa.string()}
    assert f["x"].tolist() == [1.0, 2.0, 3.0, 4.5, 5.0] and f["y"].tolist() == ["p", "q", "r", "s", "t"]
    assert t.notes == [f"d/a.tsv{INDEX_NOTE}", f"d/b.tsv{INDEX_NOTE}"]
    assert t.rows == [3, 2] and f.shown == ["d/a.tsv", "d/b.tsv"]
    assert t.where(4, "y") == "d/b.tsv, line 3, column 'y'"
    write(tmp_path, "r.csv", ",x\n5,1\n5,2\n")  # a repeated value: data, not an index
    r = spilled(tmp_path, "r.csv")
    assert r.frame.columns == ["column_1", "x"] and r.notes == [] and r.frame["column_1"].tolist() == [5, 5]
    write(tmp_path, "s.csv", ",x\n0,1\n1,2\n2,3\n3,4\nk,5\n")  # integers, then text in a later chunk: data
    s = spilled(tmp_path, "s.csv")
    assert s.frame.columns == ["column_1", "x"] and s.notes == [] and s.frame.types["column_1"] == pa.string()
    assert s.frame["column_1"].tolist() == ["0", "1", "2", "3", "k"]
    assert (0, "column_1") in s.frame.replaced


def test_a_spilled_headerless_csv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "CHUNK_BYTES", 8)
    write(tmp_path, "x.csv", "1,a\n2,b\n3,c\n4,d\n")
    t = spilled(tmp_path, header=False)
    assert t.frame.columns == ["column_1", "column_2"]
    assert t.frame["column_1"].tolist() == [1, 2, 3, 4] and t.frame["column_2"].tolist() == ["a", "b", "c", "d"]
    n = spilled(tmp_path, header=False, columns=["n", "s"])
    assert n.frame.columns == ["n", "s"] and n.frame["s"].tolist() == ["a", "b", "c", "d"]


def test_spilled_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "CHUNK_BYTES", 16)
    write(tmp_path, "e/a.csv", "a,b\n1,2\n")
    write(tmp_path, "e/b.csv", "a,b\n")
    assert error(tmp_path, "e", spill_to=tmp_path / "s", memory_budget_mb=0.000001) == (
        "data.source: e/b.csv has a header line but no rows; fill it, or remove it from data.source"
    )
    write(tmp_path, "c/a.csv", "a,b\n1,2\n")
    write(tmp_path, "c/b.csv", "a,c\n1,2\n")
    assert error(tmp_path, "c", spill_to=tmp_path / "s", memory_budget_mb=0.000001) == (
        "data.source: c/b.csv has other columns than c/a.csv: it lacks ['b'] and has extra ['c']; files of one source "
        "must have the same columns"
    )
    write(tmp_path, "o/a.csv", "a,b\n1,2\n")
    write(tmp_path, "o/b.csv", "b,a\n3,4\n")
    t = read_source(params("o", memory_budget_mb=0.000001), tmp_path, tmp_path / "s2")
    assert t.frame["a"].tolist() == [1, 4] and t.frame["b"].tolist() == [2, 3]
    write(tmp_path, "q.csv", 'a,b\n1,x\n2,y\n3,z\n4,"open\n5,w\n')
    assert error(tmp_path, "q.csv", spill_to=tmp_path / "s3", memory_budget_mb=0.000001) == (
        "data.source: q.csv, line 5: a quoted value is never closed and runs to the end of the file; add the missing "
        'closing quote (")'
    )
    write(tmp_path, "h.csv", "\nx,x,y\n1,2,3\n")
    assert error(tmp_path, "h.csv", spill_to=tmp_path / "s4", memory_budget_mb=0.000001) == (
        "data.source: h.csv, line 2: the header names 'x' more than once; column names must be unique" + HEADER_ROWS
    )
    write(tmp_path, "u.csv", "\n,column_1,y\np,2,3\nq,3,4\n")
    assert error(tmp_path, "u.csv", spill_to=tmp_path / "s5", memory_budget_mb=0.000001) == (
        "data.source: u.csv, line 2: the header names 'column_1' more than once; column names must be unique"
        + HEADER_ROWS
    )


def test_spilled_parquet(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}, index=[5, 6]).to_parquet(tmp_path / "d/1.parquet")
    pd.DataFrame({"b": ["z"], "a": [0.5]}).to_parquet(tmp_path / "d/2.parquet")
    t = spilled(tmp_path, "d")
    f = t.frame
    assert f.parts == [[tmp_path / "d/1.parquet"], [tmp_path / "d/2.parquet"]]
    string = pq.read_schema(tmp_path / "d/1.parquet").field("b").type
    assert f.columns == ["a", "b"] and f.types == {"a": pa.float64(), "b": string} and f.replaced == {}
    assert f["a"].tolist() == [1.0, 2.0, 0.5] and f["b"].tolist() == ["x", "y", "z"]
    assert (t.rows, t.fmt, t.notes) == ([2, 1], "parquet", [])
    write(tmp_path, "bad/x.parquet", b"nope")
    try:
        pq.ParquetFile(tmp_path / "bad/x.parquet")
    except (pa.ArrowException, OSError, ValueError) as exc:
        first = str(exc).splitlines()[0]
    with pytest.raises(DataError) as info:  # (its size, unknown, does not send it to the spill: called directly)
        sources._parquet_parts(tmp_path / "bad/x.parquet", "bad/x.parquet")
    assert str(info.value) == f"data.source: bad/x.parquet is not a readable Parquet file ({first})"
    pd.DataFrame({"a": pd.Series([], dtype="int64")}).to_parquet(tmp_path / "empty.parquet")
    assert error(tmp_path, "empty.parquet", spill_to=tmp_path / "s", memory_budget_mb=0.000001) == (
        "data.source: empty.parquet has no rows; fill it, or remove it from data.source"
    )


def test_record_chunks_by_hand(tmp_path: Path) -> None:
    path = write(tmp_path, "x.csv", b'a,b\n1,"x\ny"\n2,z\n')

    def chunks(quoted: bool, size: int) -> list[tuple[int, bytes]]:
        parse = pv.ParseOptions(newlines_in_values=True) if quoted else None
        return [(start, bytes(data)) for start, data in sources._record_chunks(path, parse, size)]

    assert chunks(True, 8) == [(0, b"a,b\n"), (4, b'1,"x\ny"\n'), (12, b"2,z\n")]
    assert chunks(True, 6) == [(0, b"a,b\n"), (4, b'1,"x\ny"\n2,z\n')]  # the piece grows to a record's end
    assert chunks(False, 6) == [(0, b"a,b\n"), (4, b'1,"x\n'), (9, b'y"\n'), (12, b"2,z\n")]
    assert chunks(True, 1000) == [(0, b'a,b\n1,"x\ny"\n2,z\n')]
    assert chunks(True, 1) == [(0, b"a,b\n"), (4, b'1,"x\ny"\n'), (12, b"2,z\n")]
    tail = write(tmp_path, "t.csv", b"a\nbc")
    assert [(s, bytes(d)) for s, d in sources._record_chunks(tail, QUOTED, 100)] == [(0, b"a\nbc")]  # the end: whole
    assert [(s, bytes(d)) for s, d in sources._record_chunks(tail, QUOTED, 3)] == [(0, b"a\n"), (2, b"bc")]
    digest = hashlib.sha256()
    pieces = [bytes(d) for _, d in sources._record_chunks(path, QUOTED, 6, digest)]
    assert (
        digest.hexdigest()
        == hashlib.sha256(b"".join(pieces)).hexdigest()
        == hashlib.sha256(path.read_bytes()).hexdigest()
    )
    empty = write(tmp_path, "e.csv", b"")
    assert list(sources._record_chunks(empty, QUOTED, 10)) == []
    none = write(tmp_path, "n.csv", b"abcdefgh")
    assert [(s, bytes(d)) for s, d in sources._record_chunks(none, QUOTED, 3)] == [(0, b"abcdefgh")]


def test_read_range(tmp_path: Path) -> None:
    path = write(tmp_path, "x.bin", b"0123456789")
    assert sources._read_range(path, 2, 7).read() == b"23456"
    assert sources._read_range(path, 0, 0).read() == b""


def test_fixed_names(tmp_path: Path) -> None:
    path = write(tmp_path, "x.csv", "\n\nh\n")
    fixed = sources._fixed_names
    assert fixed(["p", "q"], params(header=False), path, "x.csv", ",") == ["column_1", "column_2"]
    assert fixed(["p", "q"], params(header=False, columns=["p", "q"]), path, "x.csv", ",") == ["p", "q"]
    assert fixed(["a", "", "c"], params(), path, "x.csv", ",") == ["a", "column_2", "c"]
    assert fixed(["", "a"], params(), path, "x.csv", ",") == ["column_1", "a"]
    assert fixed([""], params(), path, "x.csv", ",") == ["column_1"]
    assert fixed([], params(), path, "x.csv", ",") == []
    assert fixed(["", "column_1", "b"], params(), path, "x.csv", ",") == [sources.UNNAMED_FIRST, "column_1", "b"]
    with pytest.raises(DataError) as info:
        fixed(["", "x", "x"], params(), path, "x.csv", ",")
    assert (
        str(info.value)
        == "data.source: x.csv, line 3: the header names 'x' more than once; column names must be unique" + HEADER_ROWS
    )
    with pytest.raises(DataError) as info:
        fixed(["a", "", "column_2"], params(), path, "x.csv", ",")
    assert str(info.value) == (
        "data.source: x.csv, line 3: the header names 'column_2' more than once; column names must be unique"
        + HEADER_ROWS
    )


def test_typed_whole(tmp_path: Path) -> None:
    path = write(tmp_path, "x.csv", ',n,s\n0,1,"a\nb"\n1,NA,c\n2,2.5,\n3,4,"d"\n')
    d = params()
    options = sources._csv_options(path, "csv", ",", d)
    ranges = [(s, s + len(b)) for s, b in sources._record_chunks(path, QUOTED, 10)]
    assert len(ranges) > 2
    raw = ["", "n", "s"]
    n = sources._typed_whole(path, ranges, options, raw, 1, "n")
    assert n.schema == pa.schema([pa.field("n", pa.float64())]) and n.column(0).to_pylist() == [1.0, None, 2.5, 4.0]
    s = sources._typed_whole(path, ranges, options, raw, 2, "s")
    assert s.column_names == ["s"] and s.column(0).to_pylist() == ["a\nb", "c", None, "d"]
    i = sources._typed_whole(path, ranges, options, raw, 0, "idx")
    assert i.schema == pa.schema([pa.field("idx", pa.int64())]) and i.column(0).to_pylist() == [0, 1, 2, 3]


def test_a_spill_of_a_file_over_a_mib_reports_its_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sources, "CHUNK_BYTES", 600 << 10)
    line = "1234567,abcdefgh\n"
    text = "a,b\n" + line * ((3 << 19) // len(line))  # about 1.5 MiB: two chunks
    write(tmp_path, "x.csv", text)
    t = spilled(tmp_path)
    assert len(t.frame.parts[0]) == 3 and len(t.frame) == text.count("\n") - 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("ingest: read a column at a time from a spill on disk (1 file of 1.5 MiB")
    assert len(err) == 2 and re.fullmatch(r"ingest: x\.csv: 1/1 MiB \(100%\), [0-9.e+]+ MiB/s", err[1]), err


def test_each_spilled_chunk_passes_the_spill_chunk_failpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainflow.core.io

    kills: list[tuple[int, int]] = []
    monkeypatch.setattr(trainflow.core.io, "FAILPOINT", "spill-chunk:2")
    monkeypatch.setattr(trainflow.core.io, "_hits", {})
    monkeypatch.setattr(os, "kill", lambda pid, sig: kills.append((pid, sig)))
    monkeypatch.setattr(sources, "CHUNK_BYTES", 4)
    write(tmp_path, "x.csv", "a,b\n1,2\n3,4\n5,6\n")
    assert len(spilled(tmp_path).frame.parts[0]) == 4
    assert trainflow.core.io._hits == {"spill-chunk": 4}
    import signal

    assert kills == [(os.getpid(), signal.SIGKILL)]


# === trainflow.core.io
# ==================================================================================================


def test_no_space_names_the_reason() -> None:
    from trainflow.core.io import no_space

    assert no_space(OSError(28, "x")) == "No space left on device"
    assert no_space(OSError(122, "x")) == "Disk quota exceeded"
    assert no_space(OSError(27, "x")) == "File too large"
    assert no_space(OSError(13, "Permission denied")) is None
    assert no_space(RuntimeError("I/O error: No space left on device (os error 28)")) == "No space left on device"
    assert no_space(RuntimeError("quota: Disk quota exceeded!")) == "Disk quota exceeded"
    assert no_space(ValueError("write: File too large")) == "File too large"
    assert no_space(RuntimeError("database or disk is full")) == "disk is full"
    assert no_space(OSError(2, "No space left on device")) == "No space left on device"  # by its text
    assert no_space(RuntimeError("anything else")) is None


def test_disk_full_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainflow.core.io
    from trainflow.core.errors import DiskFullError

    monkeypatch.setattr(trainflow.core.io, "free_mib", lambda path: 12.345)
    err = trainflow.core.io.disk_full(tmp_path / "f", OSError(28, "x"), "Kept.")
    assert isinstance(err, DiskFullError)
    assert str(err) == (
        f"{tmp_path / 'f'}: could not be written, the filesystem is full (No space left on device; 12.3 MiB free "
        "there). Kept. Free space there (or move the project to a bigger disk), then rerun."
    )
    other = trainflow.core.io.disk_full(tmp_path / "g", RuntimeError("odd"), "Kept.", "Do this.")
    assert (
        str(other)
        == f"{tmp_path / 'g'}: could not be written, the filesystem is full (odd; 12.3 MiB free there). Kept. Do this."
    )


def test_free_mib_of_a_path_not_made_yet(tmp_path: Path) -> None:
    import shutil

    from trainflow.core.io import free_mib

    got = free_mib(tmp_path / "a/b/c")
    assert got == pytest.approx(shutil.disk_usage(tmp_path).free / 2**20, rel=1e-3)


def test_full_filesystem_messages_of_atomic_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainflow.core.io
    from trainflow.core.errors import DiskFullError

    monkeypatch.setattr(trainflow.core.io, "free_mib", lambda path: 1.0)
    dest = tmp_path / "new.json"
    with pytest.raises(DiskFullError) as info, trainflow.core.io.atomic_path(dest):
        raise OSError(28, "full")
    assert str(info.value) == (
        f"{dest}: could not be written, the filesystem is full (No space left on device; 1.0 MiB free there). "
        f"Nothing was written at {dest}. Free space there (or move the project to a bigger disk), then rerun."
    )
    assert not dest.exists() and list(tmp_path.iterdir()) == []
    dest.write_text("old")
    with pytest.raises(DiskFullError) as info, trainflow.core.io.atomic_path(dest):
        raise OSError(122, "quota")
    assert str(info.value) == (
        f"{dest}: could not be written, the filesystem is full (Disk quota exceeded; 1.0 MiB free there). The "
        "previous new.json is intact. Free space there (or move the project to a bigger disk), then rerun."
    )
    assert dest.read_text() == "old"
    mine = DiskFullError("already clear")
    with pytest.raises(DiskFullError) as info, trainflow.core.io.atomic_dir(tmp_path / "d"):
        raise mine
    assert info.value is mine


def test_atomic_path_names_its_temp_file_and_keeps_special_mode_bits(tmp_path: Path) -> None:
    from trainflow.core.io import atomic_path

    dest = tmp_path / "out.json"
    with atomic_path(dest) as tmp:
        assert tmp.parent == tmp_path
        assert re.fullmatch(rf"\.out\.json\.{os.getpid()}\.[^.]+\.tmp", tmp.name), tmp.name
        tmp.write_text("1")
    dest.chmod(0o2640)
    with atomic_path(dest) as tmp:
        tmp.write_text("2")
    assert dest.stat().st_mode & 0o7777 == 0o2640 and dest.read_text() == "2"
    with pytest.raises(KeyError), atomic_path(tmp_path / "sub/deeper/f") as tmp:
        assert tmp.parent == tmp_path / "sub/deeper"  # its folder is made
        raise KeyError("x")
    assert list((tmp_path / "sub/deeper").iterdir()) == []


def test_atomic_dir_names_its_temp_dir_and_moves_the_old_one_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainflow.core.io

    with trainflow.core.io.atomic_dir(tmp_path / "out") as tmp:
        assert tmp.parent == tmp_path and tmp.is_dir() and list(tmp.iterdir()) == []
        assert re.fullmatch(rf"\.out\.{os.getpid()}\.[^.]+\.tmp", tmp.name), tmp.name
        (tmp / "sub").mkdir()
        (tmp / "sub/f").write_text("1")
    assert (tmp_path / "out/sub/f").read_text() == "1"
    monkeypatch.setattr(trainflow.core.io, "exchange", lambda a, b: False)
    moves: list[tuple[str, str]] = []
    real = os.replace

    def replace(a: Any, b: Any) -> None:
        moves.append((Path(a).name, Path(b).name))
        real(a, b)

    monkeypatch.setattr(os, "replace", replace)
    with trainflow.core.io.atomic_dir(tmp_path / "out") as tmp:
        (tmp / "g").write_text("2")
        name = tmp.name
    assert moves == [("out", f".out.old.{os.getpid()}"), (name, "out")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and (tmp_path / "out/g").read_text() == "2"


def test_fsync_dir_and_exchange_where_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    import trainflow.core.io

    with pytest.raises(FileNotFoundError):
        trainflow.core.io.fsync_dir(tmp_path / "missing")
    trainflow.core.io.fsync_dir(tmp_path)
    monkeypatch.setattr(trainflow.core.io, "FSYNC_DIRECTORIES", False)
    assert trainflow.core.io.fsync_dir(tmp_path / "missing") is None
    assert trainflow.core.io.exchange(tmp_path / "missing", tmp_path / "gone") is False
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a/x").write_text("A")
    monkeypatch.setattr(sys, "platform", "darwin")
    assert trainflow.core.io.exchange(tmp_path / "a", tmp_path / "b") is False
    assert (tmp_path / "a/x").read_text() == "A"


def test_remove_leftovers_in_detail(tmp_path: Path) -> None:
    import subprocess
    import sys

    from trainflow.core.io import remove_leftovers

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    dead = proc.pid
    remove_leftovers(tmp_path / "no/such/out")  # no folder: nothing to do
    (tmp_path / "out").mkdir()
    (tmp_path / "target").mkdir()
    (tmp_path / "target/keep").write_text("k")
    gone = [tmp_path / f".out.{dead}.a.tmp", tmp_path / f".out.{dead}.link.tmp", tmp_path / f".out.old.{dead}"]
    gone[0].write_text("a temp file")
    gone[1].symlink_to(tmp_path / "target")
    gone[2].mkdir()
    kept = [tmp_path / ".out.abc.tmp", tmp_path / f".out.{os.getpid()}.x.tmp", tmp_path / f".out.old.{os.getpid()}",
            tmp_path / ".out.1.tmp"]  # fmt: skip
    for path in kept:
        path.write_text("k")
    remove_leftovers(tmp_path / "out")
    assert not any(p.exists() or p.is_symlink() for p in gone)
    assert all(p.exists() for p in kept) and (tmp_path / "target/keep").read_text() == "k"
    assert (tmp_path / "out").is_dir()


def test_pid_alive() -> None:
    from trainflow.core.io import _pid_alive

    assert _pid_alive(os.getpid()) is True
    assert _pid_alive(2**22 + 12345) is False


def test_json_files(tmp_path: Path) -> None:
    from trainflow.core.io import read_json, write_json

    write_json(tmp_path / "a/x.json", {"b": [1, 2], "a": "é"})
    assert (tmp_path / "a/x.json").read_text() == '{\n  "a": "\\u00e9",\n  "b": [\n    1,\n    2\n  ]\n}\n'
    assert read_json(tmp_path / "a/x.json") == {"a": "é", "b": [1, 2]}


def test_read_parquet_errors(tmp_path: Path) -> None:
    from trainflow.core.io import read_parquet

    pd.DataFrame({"a": [1, 2]}).to_parquet(tmp_path / "ok.parquet")
    assert as_dict(read_parquet(tmp_path / "ok.parquet", "fix")) == {"a": [1, 2]}
    with pytest.raises(DataError) as info:
        read_parquet(tmp_path / "missing.parquet", "run it again")
    assert str(info.value) == f"{tmp_path / 'missing.parquet'} is missing; run it again"
    bad = write(tmp_path, "bad.parquet", b"PAR1 not really")
    try:
        pd.read_parquet(bad)
    except (pa.ArrowException, OSError, ValueError) as exc:
        detail = str(exc)
    with pytest.raises(DataError) as info:
        read_parquet(bad, "restore it")
    assert str(info.value) == f"{bad} cannot be read, it is corrupt or truncated ({detail}); restore it"


def test_content_hashes(tmp_path: Path) -> None:
    import hashlib

    from trainflow.core.io import sha256_files, sha256_json

    a = write(tmp_path, "a.bin", b"x" * ((1 << 20) + 5))
    b = write(tmp_path, "b.txt", b"hello")
    expected = hashlib.sha256(b"a.bin\0" + a.read_bytes() + b"b.txt\0hello").hexdigest()
    assert sha256_files([a, b]) == expected
    assert sha256_files([]) == hashlib.sha256().hexdigest()
    assert sha256_json({"b": 1, "a": [1, "x"]}) == hashlib.sha256(b'{"a":[1,"x"],"b":1}').hexdigest()


def failpoint_env(monkeypatch: pytest.MonkeyPatch, spec: str, **extra: str) -> list[tuple[int, int]]:
    import trainflow.core.io

    kills: list[tuple[int, int]] = []
    monkeypatch.setattr(trainflow.core.io, "FAILPOINT", spec)
    for name in ("RANK", "WORKER", "SIGNAL"):
        monkeypatch.setattr(trainflow.core.io, f"FAILPOINT_{name}", extra.get(name, ""))
    monkeypatch.setattr(trainflow.core.io, "_hits", {})
    monkeypatch.setattr(os, "kill", lambda pid, sig: kills.append((pid, sig)))
    return kills


def test_failpoint_kills_on_the_nth_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    import trainflow.core.io
    from trainflow.core.io import failpoint

    kills = failpoint_env(monkeypatch, "update:3")
    for _ in range(5):
        failpoint("update")
        failpoint("upd")
        failpoint("updates")
        failpoint("other")
    assert kills == [(os.getpid(), signal.SIGKILL)] and trainflow.core.io._hits == {"update": 5}
    kills = failpoint_env(monkeypatch, "")
    failpoint("update")
    assert kills == [] and trainflow.core.io._hits == {}
    kills = failpoint_env(monkeypatch, "update:1", SIGNAL="SIGUSR1")
    failpoint("update")
    assert kills == [(os.getpid(), signal.SIGUSR1)]
    kills = failpoint_env(monkeypatch, "update:1", SIGNAL="NOSUCH")
    failpoint("update")
    assert kills == [(os.getpid(), signal.SIGTERM)]


def test_failpoint_of_one_rank_or_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    import trainflow.core.io
    from trainflow.core.io import failpoint

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("TRAINFLOW_TUNE_WORKER", raising=False)
    kills = failpoint_env(monkeypatch, "update:1", RANK="1")
    failpoint("update")
    assert kills == [] and trainflow.core.io._hits == {}
    monkeypatch.setenv("RANK", "1")
    failpoint("update")
    assert kills == [(os.getpid(), signal.SIGKILL)]
    kills = failpoint_env(monkeypatch, "update:1", RANK="0")
    monkeypatch.delenv("RANK")
    failpoint("update")  # no RANK: rank 0
    assert kills == [(os.getpid(), signal.SIGKILL)]
    kills = failpoint_env(monkeypatch, "update:1", WORKER="2")
    failpoint("update")
    assert kills == [] and trainflow.core.io._hits == {}
    monkeypatch.setenv("TRAINFLOW_TUNE_WORKER", "2")
    failpoint("update")
    assert kills == [(os.getpid(), signal.SIGKILL)]
    kills = failpoint_env(monkeypatch, "update:1", WORKER="0")
    monkeypatch.delenv("TRAINFLOW_TUNE_WORKER")
    failpoint("update")
    assert kills == [(os.getpid(), signal.SIGKILL)]


def test_failpoint_with_a_delay_starts_a_daemon_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    import signal
    import threading

    from trainflow.core.io import failpoint

    timers: list[Any] = []

    class Timer:
        def __init__(self, interval: float, function: Any, args: tuple[Any, ...]) -> None:
            self.interval, self.function, self.args, self.daemon, self.started = interval, function, args, False, False
            timers.append(self)

        def start(self) -> None:
            self.started = True

    kills = failpoint_env(monkeypatch, "push:2@1.5")
    monkeypatch.setattr(threading, "Timer", Timer)
    failpoint("push")
    assert timers == []
    failpoint("push")
    assert kills == [] and len(timers) == 1
    t = timers[0]
    assert (t.interval, t.args, t.daemon, t.started) == (1.5, (os.getpid(), signal.SIGKILL), True, True)
    t.function(*t.args)
    assert kills == [(os.getpid(), signal.SIGKILL)]


def test_an_error_without_a_message_is_named_by_its_type(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise OSError()

    pd.DataFrame({"a": [1]}).to_parquet(tmp_path / "x.parquet")
    monkeypatch.setattr(sources.pq, "read_table", fail)
    assert error(tmp_path, "x.parquet") == "data.source: x.parquet is not a readable Parquet file (OSError)"
    monkeypatch.setattr(sources.pq, "ParquetFile", fail)
    with pytest.raises(DataError) as info:
        sources._parquet_parts(tmp_path / "x.parquet", "x.parquet")
    assert str(info.value) == "data.source: x.parquet is not a readable Parquet file (OSError)"


def test_the_spill_is_compressed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "CHUNK_BYTES", 40_000)
    value = "a" * 60
    rows = [f"{value},{7 if i < 1500 else 'x'}" for i in range(2000)]
    write(tmp_path, "x.csv", "t,k\n" + "\n".join(rows) + "\n")
    f = spilled(tmp_path).frame
    assert len(f.parts[0]) == 4 and list(f.replaced) == [(0, "k")]
    import pyarrow.feather as feather

    for path in [*f.parts[0], f.replaced[(0, "k")]]:
        plain = tmp_path / "plain.arrow"
        feather.write_feather(feather.read_table(path), plain, compression="uncompressed")
        assert path.stat().st_size < 0.85 * plain.stat().st_size, path
    assert f["t"].tolist() == [value] * 2000


def test_a_jsonl_row_over_a_mib_is_read_in_one_block(tmp_path: Path) -> None:
    """pyarrow reads blocks of 4 MiB: a row of 2 MiB fits (its default 1 MiB block would fail, and the fallback read
    would type the timestamps as text)."""
    long = "x" * (2 << 20)
    write(
        tmp_path,
        "x.jsonl",
        f'{{"t": "2024-01-02 03:04:05", "s": "{long}"}}\n{{"t": "2024-01-03 00:00:00", "s": "y"}}\n',
    )
    f = read(tmp_path, "x.jsonl").frame
    assert pd.api.types.is_datetime64_any_dtype(f["t"])
    assert f["t"].tolist() == [pd.Timestamp("2024-01-02 03:04:05"), pd.Timestamp("2024-01-03")]
    assert f["s"].str.len().tolist() == [2 << 20, 1]


def test_jsonl_start_lines_of_a_file_with_bytes_not_in_its_encoding(tmp_path: Path) -> None:
    path = write(tmp_path, "x.jsonl", b'{"a": "\xff"}\n\n{"a": "\xfe"}\n')
    assert list(sources._jsonl_start_lines(path, "utf-8", 5)) == [1, 3]


def test_typed_whole_takes_only_the_na_spellings_of_the_schema_as_missing(tmp_path: Path) -> None:
    """pyarrow's own default null spellings (-nan, 1.#IND) are values here, as in the in-memory read."""
    path = write(tmp_path, "x.csv", "m,k\n1,a\n-nan,b\n2.5,c\n1.#IND,d\n?,e\n")
    options = sources._csv_options(path, "csv", ",", params())
    ranges = [(s, s + len(b)) for s, b in sources._record_chunks(path, QUOTED, 8)]
    whole = sources._typed_whole(path, ranges, options, ["m", "k"], 0, "m")
    assert whole.schema == pa.schema([pa.field("m", pa.string())])
    assert whole.column(0).to_pylist() == ["1", "-nan", "2.5", "1.#IND", None]


@pytest.mark.skipif(os.uname().sysname != "Linux", reason="renameat2 is Linux's")
def test_exchange_of_paths_relative_to_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainflow.core.io import exchange

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a/x").write_text("A")
    monkeypatch.chdir(tmp_path)
    assert exchange(Path("a"), Path("b")) is True
    assert (tmp_path / "b/x").read_text() == "A" and list((tmp_path / "a").iterdir()) == []


def test_a_closed_multiline_last_value_followed_by_many_blank_lines(tmp_path: Path) -> None:
    """The check for a quote left open once read only the last 16 bytes: 16 blank lines after a closed multi-line
    last value stripped to nothing, and the file was refused as "a quoted value is never closed"."""
    for blank in (16, 4095, 4096, 9000):  # within the first block read from the end, at its edge, beyond it
        write(tmp_path, "x.csv", 'a,b\n1,"x\ny"' + "\n" * blank)
        assert read(tmp_path).frame["b"].tolist() == ["x\ny"], blank
    write(tmp_path, "x.csv", 'a,b\n1,"x\ny' + "\n" * 9000)  # still open: still refused
    with pytest.raises(DataError, match="line 2: a quoted value is never closed"):
        read(tmp_path)
