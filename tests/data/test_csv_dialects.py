"""A csv or tsv is read as its dialect says: the delimiter and encoding given or implied by the extension, the
quoting (auto, double, none; a tsv's quotes are characters unless told), the pyarrow options each of these becomes,
and the first column pandas' to_csv writes by default (an index: dropped, with a note) told from a first column of
data. Each checked on files small enough to work out by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pv
import pytest
from support.raw_sources import INDEX_NOTE, as_dict, params, read, write

from trainflow.data import sources


def test_a_csv_read_keeps_its_options_and_notes(tmp_path: Path) -> None:
    write(tmp_path, "x.txt", "a;b\n1;x\n2;y\n")
    t = read(tmp_path, "x.txt", delimiter=";", encoding="latin-1")
    assert (t.fmt, t.delimiter, t.encoding, t.header, t.notes, t.rows, t.files) == (
        "csv", ";", "latin-1", True, [], [2], [tmp_path / "x.txt"])  # fmt: skip
    assert as_dict(t.frame) == {"a": [1, 2], "b": ["x", "y"]}
    write(tmp_path, "y.tsv", "a\tb\n1\tx\n")
    assert read(tmp_path, "y.tsv").delimiter == "\t"


def test_quoting_options(tmp_path: Path) -> None:
    write(tmp_path, "x.csv", 'a,b\n"1,5","say ""x"""\n"NA",n\n')
    assert as_dict(read(tmp_path).frame) == {"a": ["1,5", None], "b": ['say "x"', "n"]}  # quoted NA: missing
    write(tmp_path, "q.csv", 'a\n"x"\n')
    assert as_dict(read(tmp_path, "q.csv", quoting="none").frame) == {"a": ['"x"']}
    write(tmp_path, "q.tsv", 'a\tb\n"x\ty"\t1\n')
    assert as_dict(read(tmp_path, "q.tsv", quoting="double").frame) == {"a": ["x\ty"], "b": [1]}


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
