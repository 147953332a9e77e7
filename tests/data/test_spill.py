"""trainflow.data.spill: a raw table on disk read a column (cast to its type over every file) or a block of rows at
a time, row hashes a column at a time equal to pandas', typed columns put a batch at a time as pyarrow converts them
whole and read back whole, by rows or as a filtered table, and the reader that reads ahead in a thread."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainflow.core.errors import DataError
from trainflow.data import spill


def arrow_chunk(path: Path, table: pa.Table) -> Path:
    import pyarrow.feather as feather

    path.parent.mkdir(parents=True, exist_ok=True)
    feather.write_feather(table, path)
    return path


def test_a_spilled_frame_reads_each_column_over_every_file_cast_to_its_type(tmp_path: Path) -> None:
    one = arrow_chunk(tmp_path / "0-0.arrow", pa.table({"a": pa.array([1, 2], pa.int32()), "b": ["x", "y"]}))
    two = arrow_chunk(tmp_path / "0-1.arrow", pa.table({"a": pa.array([3], pa.int32()), "b": ["z"]}))
    parquet = tmp_path / "p.parquet"
    pq.write_table(pa.table({"a": pa.array([4.5, None], pa.float64()), "b": ["w", None]}), parquet)
    typed_b = arrow_chunk(tmp_path / "typed.arrow", pa.table({"b": ["W", "V"]}))
    frame = spill.SpilledFrame(
        tmp_path, [[one, two], [parquet]], ["a", "b"], {"a": pa.float64(), "b": pa.string()},
        {(1, "b"): typed_b}, 5, ["one.csv", "p.parquet"],
    )  # fmt: skip
    assert len(frame) == 5 and frame.shape == (5, 2) and frame.folder == tmp_path
    assert frame.arrow("a").type == pa.float64() and frame.arrow("a").to_pylist() == [1.0, 2.0, 3.0, 4.5, None]
    a = frame["a"]
    assert a.name == "a" and a.dtype == np.float64 and a.tolist()[:4] == [1.0, 2.0, 3.0, 4.5] and np.isnan(a[4])
    assert frame["b"].tolist() == ["x", "y", "z", "W", "V"]
    blocks = list(frame.row_blocks())
    assert [len(b) for b in blocks] == [2, 1, 2]
    pd.testing.assert_frame_equal(
        pd.concat(blocks, ignore_index=True), pd.DataFrame({"a": [1.0, 2.0, 3.0, 4.5, np.nan], "b": list("xyzWV")})
    )
    bad = spill.SpilledFrame(tmp_path, [[one], [parquet]], ["b"], {"b": pa.int64()}, {}, 4, ["one.csv", "two.csv"])
    with pytest.raises(DataError) as exc:
        bad.arrow("b")
    try:
        pa.chunked_array([pa.array(["x", "y"])]).cast(pa.int64())
    except pa.ArrowException as why:
        reason = str(why)
    assert str(exc.value) == (
        f"data.source: column 'b' of one.csv is string, which cannot be combined with the other files' int64 ({reason})"
    )


def test_row_hashes_read_a_column_at_a_time_are_pandas_row_hashes() -> None:
    frame = pd.DataFrame({"a": [1.0, np.nan, 3.0], "b": ["x", None, "z"], "c": [True, False, True]})
    want = pd.util.hash_pandas_object(frame, index=False).to_numpy(dtype=np.uint64)
    got = spill.row_hashes((pd.util.hash_pandas_object(frame[c], index=False).to_numpy() for c in frame), 3)
    assert got.dtype == np.uint64 and got.tolist() == want.tolist()


def test_spilled_columns_come_back_typed_whole_by_rows_or_as_a_filtered_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spill, "BATCH_ROWS", 2)  # several record batches per column
    store = spill.ColumnSpill(tmp_path / "typed")
    x = pd.Series([1.5, np.nan, 3.0, 4.0, 5.0])
    c = pd.Series(["a", None, "c", "d", "e"], dtype="string")
    store.put("x", x)
    store.put("c", c)
    store.put("n", pd.array([1, None, 3, 4, 5], dtype="Int64"))
    store.put("x", x * 2)  # put again: replaces, keeps its place
    assert store.names == ["x", "c", "n"]
    assert sorted(p.name for p in (tmp_path / "typed").iterdir()) == ["0.arrow", "1.arrow", "2.arrow"]
    pd.testing.assert_series_equal(store.series("x"), (x * 2).rename("x"))
    pd.testing.assert_series_equal(store.series("c"), c.rename("c"))
    taken = store.take(np.array([4, 0]), ["c", "n"])
    want = pd.DataFrame({"c": pd.Series(["e", "a"], dtype="string"), "n": pd.array([5, 1], dtype="Int64")})
    pd.testing.assert_frame_equal(taken, want)
    keep = np.array([True, False, False, True, True])
    assert store.write_table(tmp_path / "t.parquet", ["n", "c"], keep) == 3
    want = pd.DataFrame({"n": pd.array([1, 4, 5], dtype="Int64"), "c": pd.Series(["a", "d", "e"], dtype="string")})
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "t.parquet"), want)
    assert store.write_table(tmp_path / "all.parquet", ["x"], None) == 5
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "all.parquet"), (x * 2).to_frame("x"))
    assert store.write_table(tmp_path / "none.parquet", ["x"], np.zeros(5, bool)) == 0
    again = spill.ColumnSpill(tmp_path / "typed")  # a folder that is there already (a rerun's spill)
    assert again.names == [] and again.folder == tmp_path / "typed"


TO_FRAME = pd.Series.to_frame  # pandas' own, for the references of the tests that count its calls


def count_conversions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every Series ColumnSpill converts to Arrow (through Series.to_frame), as it converts them."""
    converted: list[int] = []

    def counted(self: pd.Series, *args: Any, **kwargs: Any) -> pd.DataFrame:
        converted.append(len(self))
        return TO_FRAME(self, *args, **kwargs)

    monkeypatch.setattr(pd.Series, "to_frame", counted)
    return converted


def test_a_column_is_put_a_batch_at_a_time_as_pyarrow_converts_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ColumnSpill.put converts a batch of rows at a time (never the whole column's Arrow copy), to the Arrow type and
    pandas metadata pyarrow gives the whole column, also when the first batch holds no value; objects that are not all
    strings or bytes are converted whole (ints and a float: double, where a batch of ints would be int64)."""
    store = spill.ColumnSpill(tmp_path / "typed", batch_rows=2)
    converted = count_conversions(monkeypatch)
    cases = {
        "late": pd.Series([None, None, None, "a", None, "b"], dtype=object),  # the first batch: no value
        "none": pd.Series([None, None, None], dtype=object),
        "x": pd.Series([1.5, np.nan, 3.0, 4.0, 5.0]),
        "flag": pd.Series(pd.array([None, True, False], dtype="boolean")),
        "mixed": pd.Series([1, None, 2.5, 3], dtype=object),  # ints and a float: double, as converted whole
        "bytes": pd.Series([None, None, b"\x01", b""], dtype=object),
    }
    for name, values in cases.items():
        converted.clear()
        store.put(name, values)
        whole = pa.Table.from_pandas(TO_FRAME(values, name), preserve_index=False)  # pyarrow's, independently
        with pa.OSFile(str(store._path(name)), "rb") as source:
            stored = pa.ipc.open_file(source).read_all()
        assert stored.schema.equals(whole.schema, check_metadata=True), name
        assert stored.equals(whole) and stored.column(0).num_chunks == -(-len(values) // 2), name
        if name in ("mixed", "none"):
            assert converted == [len(values)]  # whole: the type is all the values'
        else:
            assert max(converted) <= 2, name


def test_a_coded_column_is_put_as_pyarrow_converts_its_values_per_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ColumnSpill.put_coded: the column categories[codes] (None at -1) stored as pyarrow converts that whole column
    of Python objects: type, pandas metadata and values, in batches of batch_rows; never a Series per row."""
    store = spill.ColumnSpill(tmp_path / "typed", batch_rows=2)
    cases = {
        "late": (["b", "a"], [-1, -1, -1, 1, -1, 0]),  # the first batch: no value
        "some": (["x", "", "é"], [2, 0, 0, 1, -1]),
        "none": (["a"], [-1, -1, -1]),  # no value at all: typed as pyarrow types an all-missing column
        "empty": ([], [-1, -1]),
    }
    converted = count_conversions(monkeypatch)
    for name, (categories, codes) in cases.items():
        converted.clear()
        store.put_coded(name, np.array(codes, dtype=np.int32), categories)
        # the type from one value; the rows by Arrow (without a value: put converts the whole column, as before)
        assert converted == ([len(codes)] if name in ("none", "empty") else [1]), name
        values = pd.Series([categories[c] if c >= 0 else None for c in codes], dtype=object)
        whole = pa.Table.from_pandas(TO_FRAME(values, name), preserve_index=False)  # pyarrow's, by hand
        with pa.OSFile(str(store._path(name)), "rb") as source:
            stored = pa.ipc.open_file(source).read_all()
        assert stored.schema.equals(whole.schema, check_metadata=True), name
        assert stored.equals(whole) and stored.column(0).num_chunks == -(-len(codes) // 2), name


def test_ahead_gives_every_item_in_order_raises_an_error_in_its_place_and_closes_what_it_reads() -> None:
    assert list(spill.ahead(iter(range(5)))) == [0, 1, 2, 3, 4]
    closed = []

    def items(fail_at: int | None) -> Any:
        try:
            for i in range(10):
                if i == fail_at:
                    raise OSError(f"cannot read chunk {i}")
                yield i
        finally:
            closed.append(fail_at)

    got = []
    with pytest.raises(OSError, match="cannot read chunk 3"):
        for i in spill.ahead(items(3)):
            got.append(i)
    assert got == [0, 1, 2] and closed == [3]
    reading = spill.ahead(items(None))
    assert next(reading) == 0
    reading.close()  # the caller stopped early (its own error): the reader is closed, not left in its thread
    assert closed == [3, None]


def test_a_raw_table_converts_dates_to_timestamps_and_single_columns_are_read_from_either_format(
    tmp_path: Path,
) -> None:
    table = pa.table(
        {"0": [1, 2], "when": pa.array([0, 86_400], pa.timestamp("s")), "day": pa.array([0, 1], pa.date32())}
    )
    frame = spill.to_pandas(table)
    assert list(frame.columns) == ["0", "when", "day"] and str(frame["when"].dtype) == "datetime64[s]"
    assert frame["day"].tolist() == [pd.Timestamp("1970-01-01"), pd.Timestamp("1970-01-02")]  # dates as timestamps
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), path)
    assert spill.read_column(path, "b").to_pylist() == ["x", "y"]
    chunk = arrow_chunk(tmp_path / "c.arrow", pa.table({"a": [3], "b": pa.array([1], pa.int8())}))
    assert spill.read_column(chunk, "b").type == pa.int8()
