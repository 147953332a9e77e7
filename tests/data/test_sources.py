"""read_source: formats, globs and directories, NA spellings, provenance (`where`) and errors naming file and line."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from trainflow.core.errors import DataError, UserError
from trainflow.data import sources
from trainflow.data.sources import NA_VALUES, RawTable, read_source
from trainflow.params import BUILTIN_DATASETS, DataParams


def params(source: str, **kw: Any) -> DataParams:
    return DataParams.model_validate({"source": source, **kw})


def write(root: Path, rel: str, content: str | bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_bytes(content.encode("utf-8"))
    return path


def read(root: Path, source: str, **kw: Any) -> RawTable:
    return read_source(params(source, **kw), root)


def error(root: Path, source: str, **kw: Any) -> str:
    with pytest.raises(DataError) as info:
        read(root, source, **kw)
    message = str(info.value)
    assert "\n" not in message, message
    assert isinstance(info.value, UserError) and info.value.exit_code == 2
    return message


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
