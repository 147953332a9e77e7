"""A csv over data.memory_budget_mb is parsed a chunk of whole records at a time: each chunk must end where pyarrow's
parser ends a record, or a record is cut in two. A quote opens a value only at a field's start (`12" pipe` is text),
so a count of the quotes before a line break does not tell; and a file whose line break is not the byte \\n (utf-16,
utf-32) cannot be cut as bytes at all, so it is read in memory, which is said.

The references: a port of pyarrow's csv lexer (arrow/cpp/src/arrow/csv/chunker.cc, `Lexer::ReadLine`) written out
by hand here, pyarrow's read of the whole file, and pandas for utf-16/32."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pv
import pytest

from trainflow.data import sources
from trainflow.params import DataParams

QUOTED = pv.ParseOptions(newlines_in_values=True, ignore_empty_lines=True)


def lexer_record_ends(data: bytes, parse: pv.ParseOptions, first: int = 0) -> list[int]:
    """The offset after each record's end, as pyarrow's lexer reads `data` from a record's start (at `first`, after a
    byte order mark): a hand port of Arrow's state machine, one byte at a time (no escape character)."""
    quote, delimiter = ord(parse.quote_char), ord(parse.delimiter)
    ends: list[int] = []
    i, n, state = first, len(data), "field_start"
    while i < n:
        c = data[i]
        i += 1
        if state == "field_start" and c == quote:
            state = "quoted"
        elif state in ("field_start", "in_field"):
            if c == 13 or c == 10:
                if c == 13 and i < n and data[i] == 10:
                    i += 1
                ends.append(i)
                state = "field_start"
            else:
                state = "field_start" if c == delimiter else "in_field"
        elif c == quote:  # quoted
            if parse.double_quote and i < n and data[i] == quote:
                i += 1  # "" is a quote inside the value
            else:
                state = "in_field"  # the value's closing quote; what follows up to a delimiter is text
    return ends


def test_record_ends_are_the_parsers_on_random_bytes() -> None:
    """Every line break of thousands of random strings of quotes, delimiters, line breaks (\\n, \\r, \\r\\n) and
    letters: `_record_end` says it ends a record exactly when the lexer does, with and without double quotes."""
    rng = random.Random(0)
    checked = 0
    for double_quote in (True, False):
        parse = pv.ParseOptions(newlines_in_values=True, double_quote=double_quote)
        for _ in range(1000):
            data = bytes(rng.choice(b'aa,,""\n\r ') for _ in range(rng.randint(1, 30)))
            ends = set(lexer_record_ends(data, parse))
            last = -1
            for i, byte in enumerate(data):
                if byte == 10:
                    last = i if i + 1 in ends else last
                    assert sources._record_end(data, i, parse) == last, (data, i, double_quote)
                    checked += 1
    assert checked > 2_000


def test_the_lexer_port_reads_records_as_pyarrow_does() -> None:
    """The reference itself, against pyarrow: where the port says records end, pyarrow's read of each record alone
    gives the rows of its read of the whole text."""
    rng = random.Random(1)
    compared = 0
    values = ["a", '12" pipe', '"x\ny"', '"p,q"', '"say ""hi"""', '""', "", '"a"b', '"\r\n"']
    for _ in range(300):
        rows = [",".join(rng.choice(values) for _ in range(3)) for _ in range(rng.randint(1, 12))]
        text = "".join(r + rng.choice(["\n", "\r\n", "\n\n", "\r"]) for r in rows).encode()
        options = pv.ReadOptions(autogenerate_column_names=True)
        strings = pv.ConvertOptions(column_types={f"f{j}": pa.string() for j in range(3)})
        whole = pv.read_csv(pa.BufferReader(text), read_options=options, parse_options=QUOTED, convert_options=strings)
        ends = [0, *lexer_record_ends(text, QUOTED)]
        rows = [text[a:b] for a, b in zip(ends, ends[1:], strict=False) if text[a:b].strip(b"\r\n")]
        each = [pv.read_csv(pa.BufferReader(r), read_options=options, parse_options=QUOTED, convert_options=strings)
                for r in rows]  # fmt: skip
        assert pa.concat_tables(each).equals(whole)
        compared += 1
    assert compared == 300


def awkward_text() -> bytes:
    """The trial's file: a stray quote in an unquoted field (`12" pipe`, text to pyarrow) before quoted line breaks;
    with a byte order mark, a quoted first header name, \\r\\n line ends, escaped quotes, empty quoted values,
    delimiters and line breaks in quotes, a quote after a closing one, blank lines."""
    rows = ['"id\nnumber",item,notes']
    for i in range(24):
        item = ['12" pipe', "plain", 'say "hi"', '"a, b"', '""', '"x"y"'][i % 6]
        notes = ['"first\nsecond"', '"one ""two""\r\nthree"', "short", '"4"" pipe, with\n\nlines"'][i % 4]
        rows.append(f"{i},{item},{notes}")
        if i % 7 == 0:
            rows.append("")
    return sources.UTF8_BOM + "\r\n".join(rows[:12]).encode() + b"\r\n" + "\n".join(rows[12:]).encode() + b"\n"


@pytest.mark.parametrize("bom", [True, False], ids=["bom", "no-bom"])
def test_every_cut_of_a_file_with_stray_quotes_parses_to_pyarrows_whole_read(tmp_path: Path, bom: bool) -> None:
    """For every chunk size from one byte to the whole file (so that a chunk's first end lands at every byte), the
    pieces are the file's bytes and hash, and parsing each piece (the first with the header) gives the rows of
    pyarrow's read of the whole file."""
    text = awkward_text() if bom else awkward_text()[len(sources.UTF8_BOM) :]
    path = tmp_path / "x.csv"
    path.write_bytes(text)
    whole = pv.read_csv(path, parse_options=QUOTED)
    strings = pv.ConvertOptions(column_types=dict.fromkeys(whole.column_names, pa.string()))
    whole = pv.read_csv(path, parse_options=QUOTED, convert_options=strings)
    assert whole.num_rows == 24 and whole.column("item")[0].as_py() == '12" pipe'
    later = pv.ReadOptions(column_names=whole.column_names)
    for size in range(1, len(text) + 1):
        digest = hashlib.sha256()
        pieces = [bytes(p) for _, p in sources._record_chunks(path, QUOTED, size, digest, bom=bom)]
        assert b"".join(pieces) == text and digest.hexdigest() == hashlib.sha256(text).hexdigest()
        tables = [
            pv.read_csv(pa.BufferReader(p), read_options=later if k else None, parse_options=QUOTED,
                        convert_options=strings)
            for k, p in enumerate(pieces)
        ]  # fmt: skip
        assert pa.concat_tables(tables).equals(whole), size


def test_a_streamed_csv_with_stray_quotes_reads_as_the_in_memory_one_and_pyarrow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "x.csv").write_bytes(awkward_text())
    d = DataParams.model_validate({"source": "x.csv", "target": "item"})
    memory = sources.read_source(d, tmp_path)
    for size in (64, 300):
        monkeypatch.setattr(sources, "CHUNK_BYTES", size)
        streamed = sources.read_source(d.model_copy(update={"memory_budget_mb": 1e-6}), tmp_path, tmp_path / f"s{size}")
        assert isinstance(streamed.frame, sources.SpilledFrame) and len(streamed.frame.parts[0]) > 2
        for name in memory.frame.columns:
            pd.testing.assert_series_equal(streamed.frame[name], memory.frame[name])
    assert "read a column at a time from a spill on disk" in capsys.readouterr().err
    whole = pv.read_csv(tmp_path / "x.csv", parse_options=QUOTED)
    assert memory.frame["notes"].tolist() == whole.column("notes").to_pylist()


def utf16_table(n: int) -> pd.DataFrame:
    words = ["ä", "ñ\n2", "漢字", "x"]
    return pd.DataFrame(
        {
            "x": [i * 0.5 for i in range(n)],
            "word": [words[i % 4] for i in range(n)],
            "label": [f"c{i % 3}" for i in range(n)],
        }
    )


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32"])
def test_a_csv_whose_line_break_is_not_the_byte_newline_is_read_in_memory_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], encoding: str
) -> None:
    """Over the budget, in chunks of 64 bytes: read whole, as pandas reads it, with a line naming the encoding."""
    expected = utf16_table(300)
    expected.to_csv(tmp_path / "x.csv", index=False, encoding=encoding)
    monkeypatch.setattr(sources, "CHUNK_BYTES", 64)
    d = DataParams.model_validate({"source": "x.csv", "target": "label", "encoding": encoding,
                                   "memory_budget_mb": 1e-6})  # fmt: skip
    raw = sources.read_source(d, tmp_path, tmp_path / "spill")
    err = capsys.readouterr().err
    assert "ingest: read into memory although over data.memory_budget_mb 0 (1 file of" in err
    assert f"csv in {encoding} is not streamed (its line breaks are not the byte \\n)" in err
    assert isinstance(raw.frame, pd.DataFrame)
    pd.testing.assert_frame_equal(raw.frame, pd.read_csv(tmp_path / "x.csv", encoding=encoding), check_dtype=False)


def test_which_encodings_a_csv_can_be_cut_in_as_bytes() -> None:
    """By what each encoding writes: ASCII-compatible single-byte encodings and utf-8 keep a line break, a quote and
    a comma as their own bytes; utf-16/32 do not; shift_jis's double-byte characters end in '|' (0x7c) or '\\\\'."""
    for encoding in ("utf-8", "utf-8-sig", "latin-1", "cp1252", "ascii", "iso-8859-15"):
        assert sources._own_bytes(encoding, "\n") and sources._own_bytes(encoding, ',"'), encoding
    for encoding in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be", "utf-7"):
        assert not sources._own_bytes(encoding, "\n"), encoding
    assert "ー".encode("shift_jis")[1:] == b"\x5b" and "ソ".encode("shift_jis")[1:] == b"\x5c"
    assert sources._own_bytes("shift_jis", ',"') and not sources._own_bytes("shift_jis", "|")
    assert not sources._own_bytes("shift_jis", "\\")


def test_a_shift_jis_csv_delimited_by_a_byte_its_characters_hold_is_read_in_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = pd.DataFrame({"name": ["ソフト", "表示", "ア"] * 50, "label": ["a", "b", "c"] * 50})
    table.to_csv(tmp_path / "x.csv", index=False, sep="\\", encoding="shift_jis")
    d = DataParams.model_validate({"source": "x.csv", "target": "label", "encoding": "shift_jis", "delimiter": "\\",
                                   "memory_budget_mb": 1e-6})  # fmt: skip
    raw = sources.read_source(d, tmp_path, tmp_path / "spill")
    assert "csv in shift_jis is not streamed (other characters hold the byte of its delimiter '\\\\' or quote)" in (
        capsys.readouterr().err
    )
    pd.testing.assert_frame_equal(raw.frame, table)
