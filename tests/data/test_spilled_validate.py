"""Ingest's checks over a table spilled to disk (data.memory_budget_mb) are the in-memory ones: the same schema,
the same rows kept and the same file written (typed columns spilled, numeric ones linked to the raw spill, the row
keys hashed a block at a time, as text where a value cannot be hashed), the same errors; a write that fails leaves no
thread behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from support.ingest_checks import SRC, P, T, ingest

from trainflow.core.errors import DataError
from trainflow.data import spill
from trainflow.data import validate as v
from trainflow.data.schema import ROW_KEY, parquet_options
from trainflow.data.spill import ColumnSpill, SpilledFrame


def spilled(tmp_path: Path, frame: pd.DataFrame) -> SpilledFrame:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "src.parquet"
    table = pa.Table.from_pandas(frame, preserve_index=False)
    pq.write_table(table, path)
    types = {f.name: f.type for f in table.schema}
    return SpilledFrame(tmp_path / "spill", [[path]], list(frame.columns), types, {}, len(frame), ["src.parquet"])


def test_a_spilled_table_is_typed_as_the_in_memory_one(tmp_path: Path) -> None:
    frame = pd.DataFrame(
        {
            "x": [1.0, 2.0, np.nan, 2.0, 5.0, 2.0],
            "c": pd.Series(["p", "q", "p", "q", None, "q"], dtype=object),
            "b": pd.Series(["yes", "no", "yes", "no", "no", "no"], dtype=object),
            "when": ["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-02", "2024-01-05", "2024-01-02"],
            "id": [1, 2, 3, 4, 5, 6],
            "t": ["w", "v", "u", "v", "s", "v"],
            "y": ["a", "b", None, "b", "a", "b"],
        }
    )
    d = P(exclude=["id"], text_column="t", missing_target="drop", duplicates="drop")
    schema, out = v.infer_schema(T(frame), d, None)
    assert isinstance(out, pd.DataFrame)
    table = T(spilled(tmp_path, frame))
    s_schema, s_out = v.infer_schema(table, d, None)
    assert isinstance(s_out, v.SpilledTable) and s_out.names == ["x", "c", "b", "when", "t", "y", "id"]  # + ROW_KEY
    assert s_out.keep is not None and s_out.keep.tolist() == [True, True, False, False, True, False]
    assert s_schema == schema
    assert (schema.n_rows, schema.dropped, schema.carried) == (3, {"missing_target": 1, "duplicates": 2}, ["id"])
    s_out.to_parquet(tmp_path / "spilled.parquet")
    out.to_parquet(tmp_path / "memory.parquet", index=False)
    pd.testing.assert_frame_equal(
        pd.read_parquet(tmp_path / "spilled.parquet"), pd.read_parquet(tmp_path / "memory.parquet")
    )
    assert out["x"].tolist()[:2] == [1.0, 2.0] and out["b"].tolist() == [True, False, False]
    assert pd.read_parquet(tmp_path / "spilled.parquet").columns[-1] == ROW_KEY
    # the typed columns, not the row keys (hashed as the table is written), nor x: read from the raw spill again
    assert s_out.store.linked == {"x": ("x", False)}  # its NaN a null in the file (pyarrow.Table.from_pandas)
    assert sorted(p.name for p in (tmp_path / "spill" / "typed").iterdir()) == [f"{i}.arrow" for i in range(1, 7)]


def test_linked_numeric_columns_are_written_as_the_in_memory_table(tmp_path: Path) -> None:
    """A numeric column typed as it was read (its float64 values) is not spilled again but read back from the raw
    spill (`ColumnSpill.link`), converted as pandas' floats are written: NaN as null, integers to the nearest float64
    (2**53 + 1 and 2**64 - 1 are not floats), float32 widened. Read in pieces that no batch of 2 rows lines up with."""
    frame = pd.DataFrame(
        {
            "f": [1.5, np.nan, -0.0, 2.5, np.inf * 0, 7.25, 1e300],  # NaN values, not nulls, in the source
            "i": [2**53 + 1, 3, -(2**62), 5, 6, 7, 8],
            "n": pd.array([1, None, 3, None, 5, 6, 7], dtype="Int64"),
            "h": np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7], dtype=np.float32),
            "u": np.array([2**64 - 1, 1, 2, 3, 4, 5, 6], dtype=np.uint64),
            "y": ["a", "b", "a", "b", "a", "b", "a"],
        }
    )

    def file() -> pa.Table:  # the table as a file holds it, with NaN values in f (pyarrow would make them nulls)
        table = pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(None)
        return table.set_column(0, "f", pa.array(frame["f"].tolist(), pa.float64()))

    source = file()
    d = P(missing="impute")
    schema, out = v.infer_schema(T(spill.to_pandas(file())), d, None)  # the frame as the reader gives it
    assert isinstance(out, pd.DataFrame)
    out.to_parquet(tmp_path / "memory.parquet", index=False, **parquet_options(out))
    parts = []
    assert source.column("f").null_count == 0 and pc.is_nan(source.column("f")).to_pylist().count(True) == 2
    for k, (lo, hi) in enumerate([(0, 1), (1, 4), (4, 7)]):  # chunk files of 1, 3 and 3 rows
        parts.append(tmp_path / f"part-{k}.parquet")
        pq.write_table(source.slice(lo, hi - lo), parts[-1])
    types = {f.name: f.type for f in source.schema}
    raw = SpilledFrame(tmp_path / "spill", [parts], list(frame.columns), types, {}, len(frame), ["src.parquet"])
    raw.batch_rows = 2
    s_schema, s_out = v.infer_schema(T(raw), d, None)
    assert isinstance(s_out, v.SpilledTable) and s_schema == schema
    assert s_out.store.linked == {c: (c, c == "f") for c in "finhu"}  # only f holds NaN values: searched for them
    s_out.to_parquet(tmp_path / "spilled.parquet")
    got, want = pq.read_table(tmp_path / "spilled.parquet"), pq.read_table(tmp_path / "memory.parquet")
    assert got.equals(want, check_metadata=True)
    assert got.column("f").null_count == 2 and got.column("i")[0].as_py() == float(2**53 + 1) == 2.0**53
    assert [len(g) for g in s_out.store.batches("n")] == [2, 2, 2, 1]
    pd.testing.assert_series_equal(s_out.store.series("u"), pd.Series(frame["u"].to_numpy(np.float64), name="u"))


def test_a_spilled_table_keeps_every_row_when_nothing_is_dropped(tmp_path: Path) -> None:
    frame = pd.DataFrame({"x": [1.0, 2.0, 3.0], "y": ["a", "b", "a"]})
    schema, out = v.infer_schema(T(spilled(tmp_path, frame)), P(), None)
    assert isinstance(out, v.SpilledTable) and out.keep is None and schema.n_rows == 3
    out.to_parquet(tmp_path / "out.parquet")
    got = pd.read_parquet(tmp_path / "out.parquet")
    assert got.columns.tolist() == ["x", "y", ROW_KEY] and got["y"].tolist() == ["a", "b", "a"]
    np.testing.assert_array_equal(
        got[ROW_KEY].to_numpy(), pd.util.hash_pandas_object(frame, index=False).to_numpy(dtype=np.uint64)
    )
    with pytest.raises(DataError) as info:
        v.infer_schema(T(spilled(tmp_path, pd.DataFrame({"x": [np.nan, 1.0], "y": ["a", "b"]}))),
                       P(missing="drop"), None)  # fmt: skip
    assert str(info.value) == (
        f"data.source: {SRC}, column 'y': the target has a single class ('b'); a classifier needs at least two, "
        "check data.target and the data"
    )


def test_a_spilled_duplicate_names_its_earlier_row(tmp_path: Path) -> None:
    frame = pd.DataFrame({"x": [1.0, 2.0, 1.0, 3.0], "y": ["a", "b", "a", "b"]})
    with pytest.raises(DataError) as info:
        v.infer_schema(T(spilled(tmp_path, frame)), P(duplicates="error"), None)
    assert str(info.value) == (
        "data.source: f.csv, line 4: the row duplicates f.csv, line 2 (1 duplicate row; data.duplicates: error); "
        "remove the duplicates, or set data.duplicates: keep or drop"
    )


def test_spilled_column_values_read_back_as_they_were(tmp_path: Path) -> None:
    store = ColumnSpill(tmp_path / "s")
    cases = [
        v._Column("n", "numeric", np.array([1.5, np.nan])),
        v._Column("b", "boolean", pd.array([True, None], dtype="boolean")),
        v._Column("c", "categorical", np.array(["p", None], dtype=object)),
        v._Column("t", "text", np.array(["w", None], dtype=object)),
        v._Column("i", "image", np.array([b"\x01", b"\x02"], dtype=object)),
        v._Column("m", v.MISSING_KIND, np.array([None, None], dtype=object)),
        v._Column("d", "datetime", np.array(["2024-01-01", "NaT"], dtype="datetime64[ns]")),
    ]
    for c in cases:
        before = c.get()
        assert before is c.values
        c.spill(store)
        assert c.values is None and c.store is store
        after = c.get()
        assert type(after) is type(before) and after.dtype == before.dtype, c.name
        assert pd.Series(after).equals(pd.Series(before)), c.name
    assert store.names == ["n", "b", "c", "t", "i", "m", "d"]
    # numbers in a categorical column's spill come back as numbers
    c = v._Column("k", "categorical", np.array([1.0, 2.0]))
    c.spill(store)
    assert c.get().dtype == np.float64


def test_spill_columns_read_and_take_from_the_store(tmp_path: Path) -> None:
    store = ColumnSpill(tmp_path / "s")
    store.put("a", pd.Series([1.0, 2.0, 3.0]))
    store.put("b", pd.Series(["x", "y", "z"], dtype=object))
    columns = v._SpillColumns(store, ["a", "b"])
    want_a = pd.util.hash_pandas_object(pd.Series([1.0, 2.0, 3.0]), index=False).to_numpy(dtype=np.uint64)
    assert columns.names == ["a", "b"] and columns.hashes("a").tolist() == want_a.tolist()
    taken = columns.take(np.array([2, 0]))
    assert taken.to_dict("list") == {"a": [3.0, 1.0], "b": ["z", "x"]} and taken.index.tolist() == [0, 1]


def test_row_keys_of_a_spilled_table_a_block_at_a_time(tmp_path: Path) -> None:
    frame = pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})
    got = np.concatenate(list(v.raw_row_key_blocks(spilled(tmp_path, frame), text=False)))
    assert got.dtype == np.uint64
    assert got.tolist() == pd.util.hash_pandas_object(frame, index=False).to_numpy(dtype=np.uint64).tolist()
    nested = pd.DataFrame({"a": [1, 2], "l": [[1, 2], [3]]})
    with pytest.raises(v._Unhashable):
        list(v.raw_row_key_blocks(spilled(tmp_path / "n", nested), text=False))
    got = np.concatenate(list(v.raw_row_key_blocks(spilled(tmp_path / "n2", nested), text=True)))
    text = pd.DataFrame({"a": [1, 2], "l": pd.Series(["[1 2]", "[3]"], dtype=object)})
    assert got.tolist() == pd.util.hash_pandas_object(text, index=False).to_numpy(dtype=np.uint64).tolist()


def test_a_spilled_table_with_a_nested_value_in_a_late_block_keys_every_row_as_text_as_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keys are written as they are hashed; a block with an unhashable value after others were written makes the
    whole table be written again with every row hashed as text, as raw_row_keys hashes the frame in memory."""
    monkeypatch.setattr(spill, "BATCH_ROWS", 2)
    rows = 7
    frame = pd.DataFrame({"x": np.arange(rows, dtype=np.float64), "l": [None] * (rows - 1) + [[1, 2]],
                          "y": ["a", "b"] * 3 + ["a"]})  # fmt: skip
    schema, out = ingest(frame, exclude=["l"])
    raw = spilled(tmp_path, frame)
    assert sum(1 for _ in raw.row_blocks()) > 1  # the nested value is in a later block than the first
    s_schema, s_out = v.infer_schema(T(raw), P(exclude=["l"]), None)
    assert isinstance(s_out, v.SpilledTable) and s_schema == schema
    s_out.to_parquet(tmp_path / "spilled.parquet")
    got = pd.read_parquet(tmp_path / "spilled.parquet")
    # every row as text: a missing value stays missing, a list read back from Parquet prints as a numpy array
    text = frame.assign(l=pd.Series([None] * (rows - 1) + ["[1 2]"], dtype="str"))
    expected = pd.util.hash_pandas_object(text, index=False).to_numpy(dtype=np.uint64)
    assert got[ROW_KEY].tolist() == expected.tolist()
    out.to_parquet(tmp_path / "memory.parquet", index=False)
    memory = pd.read_parquet(tmp_path / "memory.parquet")
    pd.testing.assert_frame_equal(got[["x", "y"]], memory[["x", "y"]])  # l: a list here, an array read back


def test_a_spilled_table_whose_write_fails_stops_hashing_its_row_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row keys are hashed in a thread while the table is written; a write that fails (a full disk) raises its
    error and leaves no thread behind, although the error's traceback is still held."""
    import errno
    import threading

    monkeypatch.setattr(spill, "BATCH_ROWS", 2)
    frame = pd.DataFrame({"x": np.arange(9.0), "y": list("ababababa")})
    _, out = v.infer_schema(T(spilled(tmp_path, frame)), P(), None)
    real, calls = pq.ParquetWriter.write_table, []

    def full(self: pq.ParquetWriter, table: pa.Table, *args: Any, **kwargs: Any) -> None:
        calls.append(table.num_rows)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, table, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)
    with pytest.raises(OSError, match="No space left") as error:
        out.to_parquet(tmp_path / "t.parquet")
    assert calls == [2, 2] and error.value is not None
    assert not [t.name for t in threading.enumerate() if t.name.startswith("trainflow-ahead")]
