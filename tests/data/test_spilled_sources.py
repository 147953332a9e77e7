"""A source over data.memory_budget_mb is read into a spill on disk: when it is (and the words that say why),
the chunks of whole records it is parsed in, the column names and types each chunk keeps (a column retyped whole when
a later chunk disagrees), the spill's progress, failpoint and compression, and the same errors as in memory; each
against pyarrow's read of the whole file or values worked out by hand."""

from __future__ import annotations

import hashlib
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
from support.raw_sources import HEADER_ROWS, INDEX_NOTE, as_dict, error, params, write

from trainflow.core.errors import DataError
from trainflow.data import sources, spill
from trainflow.data.sources import RawTable, read_source

QUOTED = pv.ParseOptions(newlines_in_values=True)


def spilled(root: Path, source: str = "x.csv", **kw: Any) -> RawTable:
    return read_source(params(source, memory_budget_mb=0.000001, **kw), root, root / "spill")


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


def test_typed_whole_takes_only_the_na_spellings_of_the_schema_as_missing(tmp_path: Path) -> None:
    """pyarrow's own default null spellings (-nan, 1.#IND) are values here, as in the in-memory read."""
    path = write(tmp_path, "x.csv", "m,k\n1,a\n-nan,b\n2.5,c\n1.#IND,d\n?,e\n")
    options = sources._csv_options(path, "csv", ",", params())
    ranges = [(s, s + len(b)) for s, b in sources._record_chunks(path, QUOTED, 8)]
    whole = sources._typed_whole(path, ranges, options, ["m", "k"], 0, "m")
    assert whole.schema == pa.schema([pa.field("m", pa.string())])
    assert whole.column(0).to_pylist() == ["1", "-nan", "2.5", "1.#IND", None]


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
