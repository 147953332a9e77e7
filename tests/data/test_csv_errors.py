"""A csv that cannot be read is named with its file, line and (where it can tell) column, and what to do, every
message in full: a record with another count of fields (with a hint at why), bytes not in data.encoding, an empty
file, a quote left open (and a closed multi-line value at the end that is not one), names given twice in the header
or in data.columns."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pv
import pytest
from support.raw_sources import HEADER_ROWS, UTF8_HINT, error, params, read, write

from trainflow.core.errors import DataError
from trainflow.data import sources

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


def test_a_closed_multiline_last_value_followed_by_many_blank_lines(tmp_path: Path) -> None:
    """The check for a quote left open once read only the last 16 bytes: 16 blank lines after a closed multi-line
    last value stripped to nothing, and the file was refused as "a quoted value is never closed"."""
    for blank in (16, 4095, 4096, 9000):  # within the first block read from the end, at its edge, beyond it
        write(tmp_path, "x.csv", 'a,b\n1,"x\ny"' + "\n" * blank)
        assert read(tmp_path).frame["b"].tolist() == ["x\ny"], blank
    write(tmp_path, "x.csv", 'a,b\n1,"x\ny' + "\n" * 9000)  # still open: still refused
    with pytest.raises(DataError, match="line 2: a quoted value is never closed"):
        read(tmp_path)


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


# === repeated names ================================================================================================


def test_repeated_and_check_unique() -> None:
    assert sources._repeated(["a", "b", "a", "a", "c", "b"]) == ["a", "b"]
    assert sources._repeated(["a", "b"]) == []
    sources._check_unique(["a", "b"], "what")
    with pytest.raises(DataError) as info:
        sources._check_unique(["x", "y", "y", "x"], "the names")
    assert str(info.value) == "the names 'y', 'x' more than once; column names must be unique"
