"""read_source: formats, globs and directories, NA spellings, built-in datasets, jsonl and Parquet, files combined
into one table, provenance (`where`: the file and line of a row) and errors naming file and line; each message in
full, on files small enough to work out by hand."""

from __future__ import annotations

import io
import json
import os
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from support.projects import make_project
from support.raw_sources import UTF8_HINT, as_dict, error, params, read, write

from trainflow.core.errors import DataError
from trainflow.core.paths import Paths
from trainflow.data import sources
from trainflow.data.sources import NA_VALUES, RawTable, read_source
from trainflow.params import BUILTIN_DATASETS, DataParams, load_params
from trainflow.stages import run_stage

# --- csv parsing ------------------------------------------------------------------------------------------------


def test_quoted_delimiters_newlines_and_quotes(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", 'id,text,n\n1,"a, b",3\n2,"line one\nline two",4\n3,"say ""hi""",5\n')
    t = read(tmp_path, "x.csv")
    assert list(t.frame.columns) == ["id", "text", "n"]
    assert t.frame["text"].tolist() == ["a, b", "line one\nline two", 'say "hi"']
    assert t.frame["n"].tolist() == [3, 4, 5]
    assert t.frame["n"].dtype == np.int64
    assert t.fmt == "csv" and t.source == "x.csv" and t.files == [tmp_path / "x.csv"]
    assert t.record.tolist() == [0, 1, 2] and t.record.dtype == np.int64
    assert t.file_index.tolist() == [0, 0, 0] and t.file_index.dtype == np.int32
    assert [t.where(i) for i in range(3)] == ["x.csv, line 2", "x.csv, line 3", "x.csv, line 5"]


def test_blank_lines_are_skipped(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", "\na,b\n1,2\n\n\n3,4\r\n\n5,6")
    t = read(tmp_path, "x.csv")
    assert t.frame.to_dict("list") == {"a": [1, 3, 5], "b": [2, 4, 6]}
    assert t.where_many([0, 1, 2], "b") == [
        "x.csv, line 3, column 'b'",
        "x.csv, line 6, column 'b'",
        "x.csv, line 8, column 'b'",
    ]


def test_na_spellings_become_missing(tmp_path: Path) -> None:
    rows = [f"{i},{na},{na}" for i, na in enumerate(NA_VALUES)] + [f"{len(NA_VALUES)},1.5,word"]
    write(tmp_path, "x.csv", "k,num,text\n" + "\n".join(rows) + "\n")
    f = read(tmp_path, "x.csv").frame
    assert len(f) == len(NA_VALUES) + 1
    assert f["num"].dtype == np.float64
    assert f["num"].isna().tolist() == [True] * len(NA_VALUES) + [False]
    assert f["num"].iloc[-1] == 1.5
    assert f["text"].isna().tolist() == [True] * len(NA_VALUES) + [False]
    assert f["text"].iloc[-1] == "word"
    assert {"", "NA", "N/A", "n/a", "NaN", "nan", "NULL", "null", "None", "none", "#N/A", "?"} == set(NA_VALUES)


def test_types_are_inferred(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", "i,f,s,b,ts\n1,0.5,a,true,2024-01-02 03:04:05\n2,,b,false,2024-01-03 00:00:00\n")
    f = read(tmp_path, "x.csv").frame
    assert f["i"].dtype == np.int64
    assert f["f"].dtype == np.float64 and np.isnan(f["f"].iloc[1])
    assert f["s"].tolist() == ["a", "b"]
    assert f["b"].tolist() == [True, False]
    assert pd.api.types.is_datetime64_any_dtype(f["ts"])
    assert f["ts"].iloc[0] == pd.Timestamp("2024-01-02 03:04:05")


def test_headerless_tsv_with_columns(tmp_path: Path) -> None:
    write(tmp_path, "data/x.tsv", "1\tred\t2.5\n\n2\tgreen, dark\t3.5\n")
    t = read(tmp_path, "data/x.tsv", header=False, columns=["id", "color", "score"])
    assert t.fmt == "tsv"
    assert t.frame.to_dict("list") == {"id": [1, 2], "color": ["red", "green, dark"], "score": [2.5, 3.5]}
    assert t.where(1, "color") == "data/x.tsv, line 3, column 'color'"


def test_headerless_column_count_mismatch(tmp_path: Path) -> None:
    write(tmp_path, "data/x.tsv", "1\tred\t2.5\n2\tgreen\t3.5\n")
    message = error(tmp_path, "data/x.tsv", header=False, columns=["id", "color"])
    assert "data/x.tsv, line 1:" in message
    assert "expected 2 fields (data.columns names 2), found 3" in message


def test_headerless_without_columns_names_them(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", "1,a\n2,b\n")
    t = read(tmp_path, "x.csv", header=False)
    assert list(t.frame.columns) == ["column_1", "column_2"]
    assert t.frame["column_1"].tolist() == [1, 2]
    assert t.where(0) == "x.csv, line 1"


def test_delimiter_option(tmp_path: Path) -> None:
    write(tmp_path, "x.txt", "a;b\n1;2,5\n")
    t = read(tmp_path, "x.txt", delimiter=";")
    assert t.frame.to_dict("list") == {"a": [1], "b": ["2,5"]}


# --- csv errors name file and line ------------------------------------------------------------------------------


def test_wrong_field_count_names_the_exact_line(tmp_path: Path) -> None:
    lines = ["id,name,score", "1,a,0.5", "", '2,"multi', 'line, with comma",0.7', "", "3,c,0.9"]
    lines += [f"{i},n{i},0.1" for i in range(4, 40)]
    bad_line = len(lines) + 1
    lines += ["40,x,0.2,extra"] + [f"{i},n{i},0.1" for i in range(41, 60)]
    write(tmp_path, "data/raw/bad.csv", "\n".join(lines) + "\n")
    message = error(tmp_path, "data/raw/bad.csv")
    assert message.startswith(f"data.source: data/raw/bad.csv, line {bad_line}: expected 3 fields (the header has 3)")
    assert "found 4" in message and "delimiter inside an unquoted value" in message


def test_too_few_fields_names_the_line(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", 'a,b,c\n1,"x\n\ny",3\n4,5\n')
    message = error(tmp_path, "x.csv")
    assert "x.csv, line 5: expected 3 fields (the header has 3), found 2" in message


def test_wrong_field_count_in_a_later_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "BLOCK_SIZE", 1 << 12)  # many blocks, parsed in parallel
    rows = [f'{i},"t{i}\nsecond line",{i * 0.5}' if i % 7 == 0 else f"{i},t{i},{i * 0.5}" for i in range(2000)]
    text = "a,b,c\n" + "\n".join(rows[:1500]) + "\n1500,x,1,2\n" + "\n".join(rows[1500:]) + "\n"
    write(tmp_path, "x.csv", text)
    bad_line = text.split("\n").index("1500,x,1,2") + 1
    assert f"x.csv, line {bad_line}: expected 3 fields" in error(tmp_path, "x.csv")


def test_bad_encoding_names_line_column_and_encoding(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", "id,city\n1,Paris\n2,Lyon\n3,Orl\xe9ans\n".encode("latin-1"))
    message = error(tmp_path, "x.csv")
    assert "x.csv, line 4, column 'city'" in message
    assert "0xe9" in message and "utf-8" in message and "data.encoding" in message


def test_bad_encoding_with_a_non_utf8_encoding(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", "id,city\n1,Paris\n2,Orl\xe9ans\n".encode("latin-1"))
    message = error(tmp_path, "x.csv", encoding="ascii")
    assert "x.csv, line 3, column 'city'" in message and "ascii" in message and "data.encoding" in message


def test_latin1_file_with_encoding(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", "id,city\n1,Paris\n3,Orl\xe9ans\n".encode("latin-1"))
    f = read(tmp_path, "x.csv", encoding="latin-1").frame
    assert f["city"].tolist() == ["Paris", "Orléans"]


def test_unknown_encoding(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", "a\n1\n")
    assert "data.encoding: unknown encoding 'klingon'" in error(tmp_path, "x.csv", encoding="klingon")


def test_empty_and_header_only_files_have_no_rows(tmp_path: Path) -> None:
    write(tmp_path, "empty.csv", "")
    write(tmp_path, "header.csv", "a,b\n")
    assert "empty.csv" in (m := error(tmp_path, "empty.csv")) and "no rows" in m
    assert "header.csv" in (m := error(tmp_path, "header.csv")) and "no rows" in m


def test_duplicate_header_names(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", "\na,b,a\n1,2,3\n")
    message = error(tmp_path, "x.csv")
    assert "x.csv, line 2" in message and "'a'" in message and "unique" in message


# --- files, globs, directories ----------------------------------------------------------------------------------


def test_glob_concatenates_files_with_provenance(tmp_path: Path) -> None:
    write(tmp_path, "data/raw/a.csv", "id,x,y\n1,10,0.5\n2,11,1.5\n3,12,2.5\n")
    write(tmp_path, "data/raw/b.csv", 'y,id,x\n\n0.25,4,"two\nlines"\n\n1,5,z\n')
    write(tmp_path, "data/raw/notes.txt.bak", "ignored: not matched by the glob")
    t = read(tmp_path, "data/raw/*.csv")
    assert t.files == [tmp_path / "data/raw/a.csv", tmp_path / "data/raw/b.csv"]
    assert list(t.frame.columns) == ["id", "x", "y"]
    assert t.frame["id"].tolist() == [1, 2, 3, 4, 5]
    assert t.frame["x"].tolist() == ["10", "11", "12", "two\nlines", "z"]  # int in a.csv, string in b.csv
    assert t.frame["y"].dtype == np.float64 and t.frame["y"].tolist() == [0.5, 1.5, 2.5, 0.25, 1.0]
    assert t.file_index.tolist() == [0, 0, 0, 1, 1]
    assert t.record.tolist() == [0, 1, 2, 0, 1]
    assert t.where(1) == "data/raw/a.csv, line 3"
    assert t.where(4, "x") == "data/raw/b.csv, line 6, column 'x'"
    assert t.where_many([4, 0, 3]) == ["data/raw/b.csv, line 6", "data/raw/a.csv, line 2", "data/raw/b.csv, line 3"]


def test_glob_with_different_columns(tmp_path: Path) -> None:
    write(tmp_path, "data/raw/a.csv", "id,x\n1,2\n")
    write(tmp_path, "data/raw/b.csv", "id,z\n1,2\n")
    message = error(tmp_path, "data/raw/*.csv")
    assert "data/raw/b.csv" in message and "'x'" in message and "'z'" in message


def test_glob_without_matches_and_missing_file(tmp_path: Path) -> None:
    assert "data/raw/*.csv" in error(tmp_path, "data/raw/*.csv")
    message = error(tmp_path, "data/raw/missing.csv")
    assert "data/raw/missing.csv" in message and "does not exist" in message


def test_directory_reads_visible_files_sorted(tmp_path: Path) -> None:
    write(tmp_path, "data/raw/2.csv", "a\n2\n")
    write(tmp_path, "data/raw/1.csv", "a\n1\n")
    write(tmp_path, "data/raw/.hidden", "junk")
    (tmp_path / "data/raw/sub").mkdir()
    t = read(tmp_path, "data/raw")
    assert t.frame["a"].tolist() == [1, 2]
    assert [p.name for p in t.files] == ["1.csv", "2.csv"]


def test_directory_with_mixed_formats(tmp_path: Path) -> None:
    write(tmp_path, "data/raw/a.csv", "a\n1\n")
    pd.DataFrame({"a": [2]}).to_parquet(tmp_path / "data/raw/b.parquet")
    message = error(tmp_path, "data/raw")
    assert "csv: data/raw/a.csv" in message and "parquet: data/raw/b.parquet" in message


def test_unknown_extension(tmp_path: Path) -> None:
    write(tmp_path, "x.dat", "a\n1\n")
    message = error(tmp_path, "x.dat")
    assert "x.dat" in message and "'.dat'" in message and "data.format" in message
    assert read(tmp_path, "x.dat", format="csv").frame["a"].tolist() == [1]


def test_absolute_path(tmp_path: Path) -> None:
    path = write(tmp_path, "x.csv", "a\n1\n")
    t = read_source(params(str(path)), tmp_path / "elsewhere")
    assert t.frame["a"].tolist() == [1]
    assert t.where(0) == f"{path}, line 2"


# --- jsonl, parquet ---------------------------------------------------------------------------------------------


def test_jsonl(tmp_path: Path) -> None:
    write(tmp_path, "x.jsonl", '{"a": 1, "b": "x"}\n\n{"a": 2, "b": "NA"}\n{"a": null, "c": true}\n')
    t = read(tmp_path, "x.jsonl")
    assert t.fmt == "jsonl"
    assert t.frame["a"].tolist()[:2] == [1, 2] and np.isnan(t.frame["a"].iloc[2])
    assert t.frame["b"].isna().tolist() == [False, True, True]
    assert t.where(2) == "x.jsonl, line 4"


def test_jsonl_bad_line(tmp_path: Path) -> None:
    write(tmp_path, "x.ndjson", '{"a": 1}\n{"a": 2}\n\n{"a": 3,\n{"a": 4}\n')
    message = error(tmp_path, "x.ndjson")
    assert "x.ndjson, line 4:" in message and "not valid JSON" in message


def test_jsonl_type_change_between_rows(tmp_path: Path) -> None:
    write(tmp_path, "x.jsonl", '{"a": 1, "b": 1}\n{"a": "?", "b": "two"}\n\n{"a": 2.5, "b": 3}\n')
    t = read(tmp_path, "x.jsonl")
    assert t.frame["a"].dtype == np.float64 and t.frame["a"].isna().tolist() == [False, True, False]
    assert t.frame["b"].tolist() == ["1", "two", "3"]
    assert t.where(2) == "x.jsonl, line 4"


def test_parquet_round_trip(tmp_path: Path) -> None:
    frame = pd.DataFrame(
        {
            "i": np.arange(5, dtype=np.int64),
            "f": [0.5, np.nan, 1.5, 2.5, 3.5],
            "s": ["a", "b", None, "d", "e"],
            "flag": [True, False, True, True, False],
            "ts": pd.date_range("2024-01-01", periods=5, freq="D"),
        },
        index=[10, 11, 12, 13, 14],
    )
    write(tmp_path, "data/p.pq", b"")
    frame.to_parquet(tmp_path / "data/p.pq")
    t = read(tmp_path, "data/p.pq")
    assert t.fmt == "parquet"
    assert list(t.frame.columns) == ["i", "f", "s", "flag", "ts"]  # the unnamed index is not a column
    assert t.frame["i"].tolist() == list(range(5))
    assert t.frame["f"].isna().tolist() == [False, True, False, False, False]
    assert t.frame["s"].isna().tolist() == [False, False, True, False, False]
    assert t.frame["flag"].tolist() == [True, False, True, True, False]
    assert pd.api.types.is_datetime64_any_dtype(t.frame["ts"])
    assert t.frame["ts"].iloc[4] == pd.Timestamp("2024-01-05")
    assert t.where(3, "f") == "data/p.pq, row 4, column 'f'"


def test_parquet_glob_unifies_types(tmp_path: Path) -> None:
    pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}).to_parquet(tmp_path / "1.parquet")
    pd.DataFrame({"b": ["z"], "a": [0.5]}).to_parquet(tmp_path / "2.parquet")
    t = read(tmp_path, "*.parquet")
    assert t.frame["a"].tolist() == [1.0, 2.0, 0.5]
    assert t.frame["b"].tolist() == ["x", "y", "z"]
    assert t.where(2) == "2.parquet, row 1"


def test_header_options_rejected_for_parquet(tmp_path: Path) -> None:
    pd.DataFrame({"a": [1]}).to_parquet(tmp_path / "x.parquet")
    assert "data.header" in error(tmp_path, "x.parquet", header=False)


# --- builtin ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BUILTIN_DATASETS)
def test_builtin(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("a built-in dataset must not download")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    t = read(tmp_path, f"builtin:{name}")
    assert t.fmt == "builtin" and t.files == [] and t.source == f"builtin:{name}"
    assert "target" in t.frame.columns and len(t.frame) > 100
    assert all(isinstance(c, str) for c in t.frame.columns)
    assert len(t.file_index) == len(t.record) == len(t.frame)
    assert t.where(4, "target") == f"builtin:{name}, row 5, column 'target'"


# --- where() ----------------------------------------------------------------------------------------------------


def test_where_after_multiline_field(tmp_path: Path) -> None:
    lines = ["id,note"]
    starts = {}
    for i in range(30):
        starts[i] = len(lines) + 1
        if i == 10:
            lines += [f'{i},"first', "", "third, with comma", 'fourth ""quoted"""']
        elif i == 20:
            lines += [""]  # a blank line before the record
            starts[i] = len(lines) + 1
            lines += [f"{i},plain"]
        else:
            lines += [f"{i},n{i}"]
    write(tmp_path, "x.csv", "\r\n".join(lines) + "\r\n")
    t = read(tmp_path, "x.csv")
    assert len(t.frame) == 30
    assert t.frame["note"].iloc[10] == 'first\r\n\r\nthird, with comma\r\nfourth "quoted"'
    for row in (9, 10, 11, 15, 20, 21, 29):
        assert t.where(row, "note") == f"x.csv, line {starts[row]}, column 'note'"
    fresh = read(tmp_path, "x.csv")  # furthest row first: later calls use the lines found by the first scan
    assert [fresh.where(r) for r in (29, 10, 0)] == [f"x.csv, line {starts[r]}" for r in (29, 10, 0)]


def test_where_in_a_many_block_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "BLOCK_SIZE", 1 << 12)
    lines = ["a,b"]
    starts = []
    for i in range(3000):
        starts.append(len(lines) + 1)
        lines += [f'{i},"x', 'y"'] if i % 5 == 0 else [f"{i},v"]
        if i % 11 == 0:
            lines.append("")
    write(tmp_path, "x.csv", "\n".join(lines) + "\n")
    t = read(tmp_path, "x.csv")
    assert t.frame["a"].tolist() == list(range(3000))
    rows = [0, 1, 5, 1234, 2999]
    assert t.where_many(rows) == [f"x.csv, line {starts[r]}" for r in rows]


def test_quote_left_open_at_the_end(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", 'a,b\n1,ok\n2,"starts here\n3,swallowed\n4,too\n')
    message = error(tmp_path, "x.csv")
    assert "x.csv, line 3: a quoted value is never closed" in message


def test_quoted_multiline_value_at_the_end_is_fine(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", 'a,b\n1,ok\n2,"two\nlines"\n\n')
    assert read(tmp_path, "x.csv").frame["b"].tolist() == ["ok", "two\nlines"]


def test_jsonl_bad_encoding(tmp_path: Path) -> None:
    write(tmp_path, "x.jsonl", '{"city": "Paris"}\n\n{"city": "Orl\xe9ans"}\n'.encode("latin-1"))
    message = error(tmp_path, "x.jsonl")
    assert "x.jsonl, line 3" in message and "data.encoding" in message
    t = read(tmp_path, "x.jsonl", encoding="latin-1")
    assert t.frame["city"].tolist() == ["Paris", "Orléans"]
    assert t.where(1) == "x.jsonl, line 3"


def test_duplicate_data_columns(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", "1,2\n")
    assert "data.columns names 'a' more than once" in error(tmp_path, "x.csv", header=False, columns=["a", "a"])


def test_tsv_quotes_are_plain_characters_by_default(tmp_path: Path) -> None:
    """SMS-spam-style TSVs: a text may start with a quote that never closes; it must not swallow later lines."""
    path = tmp_path / "sms.tsv"
    path.write_text('ham\t"car" day can?\nspam\t"WIN now\nham\tok see you\n')
    d = DataParams.model_validate(
        {"source": str(path), "header": False, "columns": ["label", "text"], "target": "label"}
    )
    table = read_source(d, tmp_path).frame
    assert list(table["text"]) == ['"car" day can?', '"WIN now', "ok see you"]
    with pytest.raises(DataError, match="sms.tsv, line 2: a quoted value is never closed"):
        read_source(d.model_copy(update={"quoting": "double"}), tmp_path)  # quoting on: the open quote is caught


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


def test_jsonl_start_lines_of_a_file_with_bytes_not_in_its_encoding(tmp_path: Path) -> None:
    path = write(tmp_path, "x.jsonl", b'{"a": "\xff"}\n\n{"a": "\xfe"}\n')
    assert list(sources._jsonl_start_lines(path, "utf-8", 5)) == [1, 3]


def test_a_parquet_date_column_is_ingested_as_datetimes_not_python_dates(tmp_path: Path) -> None:
    """A date32 column of a Parquet source arrives as datetime64 (pyarrow would give Python date objects by default)."""
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    root = make_project(tmp_path, {"data.source": "data/raw/t.parquet", "data.target": "label"})
    days = [datetime.date(2026, 1, 1), datetime.date(2026, 1, 2), datetime.date(2026, 1, 3), datetime.date(2026, 1, 4)]
    table = pa.table({"day": pa.array(days, pa.date32()), "x": [1.0, 2.0, 3.0, 4.0], "label": ["a", "b", "a", "b"]})
    pq.write_table(table, root / "data/raw/t.parquet")
    run_stage("ingest", load_params(Paths(root).params), Paths(root))
    out = pd.read_parquet(Paths(root).table)
    assert out["day"].dtype.kind == "M"
    assert out["day"].tolist() == [pd.Timestamp(d) for d in days]
