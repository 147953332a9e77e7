"""trainflow.data.stream: the memory budget and the choice to stream a split (with the words that say why), a
split read whole, a column or a block of rows at a time (also a split of the linked table, by its rows.npy), damaged
or missing files named with how to restore them, and the streamed matrix equal to the in-memory transform."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from support.preprocessing import TABULAR, fit, message, schema, tabular_train
from support.raw_sources import params

from trainflow.core.errors import DataError
from trainflow.core.paths import SPLITS
from trainflow.data import stream
from trainflow.data.schema import ROW_KEY
from trainflow.params import DataParams

approx = pytest.approx


def write_split(path: Path, frame: pd.DataFrame, row_group_size: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(path, index=False, row_group_size=row_group_size)
    return path


def uncompressed_mb(path: Path) -> float:
    meta = pq.read_metadata(path)
    return sum(meta.row_group(i).column(j).total_uncompressed_size for i in range(meta.num_row_groups)
               for j in range(meta.num_columns)) / 2**20  # fmt: skip


def test_the_budget_is_the_setting_or_a_quarter_of_the_memory() -> None:
    import os

    assert stream.budget_mb(DataParams(memory_budget_mb=12.5)) == 12.5
    quarter = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 4 / 2**20
    assert stream.budget_mb(DataParams(memory_budget_mb=None)) == quarter


def test_budget_mb() -> None:
    from trainflow.data.stream import budget_mb

    assert budget_mb(params(memory_budget_mb=12.5)) == 12.5
    assert budget_mb(params()) == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 4 / 2**20


def test_the_choice_to_stream_says_why_in_each_case(tmp_path: Path) -> None:
    a = write_split(tmp_path / "splits" / "train.parquet", pd.DataFrame({"x": np.arange(1000.0)}))
    b = write_split(tmp_path / "splits" / "val.parquet", pd.DataFrame({"x": np.arange(500.0)}))
    size = uncompressed_mb(a) + uncompressed_mb(b)
    assert stream.table_mb(a) + stream.table_mb(b) == approx(size)
    need = 6 * size  # a split in memory: about six times its data (the frame, the matrix, the outputs)
    what = f"train + val: {size:,.1f} MiB, about {need:,.0f} MiB in memory"
    held = stream.choose([a, b], DataParams(memory_budget_mb=1000))
    assert held == stream.Choice(False, f"held in memory ({what}; data.memory_budget_mb 1,000)")
    at_budget = stream.choose([a], DataParams(memory_budget_mb=6 * stream.table_mb(a)))
    assert not at_budget.streamed
    assert stream.choose([a], DataParams(memory_budget_mb=5.99 * stream.table_mb(a))).streamed
    small = DataParams(memory_budget_mb=0.001)
    assert stream.choose([a, b], small) == stream.Choice(
        True, f"streamed from disk ({what}, over data.memory_budget_mb 0)"
    )
    assert stream.choose([a], small, text=True) == stream.Choice(
        False,
        f"held in memory although over data.memory_budget_mb 0 (train: {uncompressed_mb(a):,.1f} MiB, about "
        f"{6 * uncompressed_mb(a):,.0f} MiB in memory): text is not streamed so far, tables and images are",
    )


def test_a_split_is_read_a_column_or_a_block_of_rows_at_a_time(tmp_path: Path) -> None:
    frame = pd.DataFrame(
        {"x": np.arange(10.0), "c": pd.Series(list("abcdefghij"), dtype="string"), "b": pd.array([True] * 10)}
    )
    path = write_split(tmp_path / "splits" / "train.parquet", frame, row_group_size=4)
    columns = stream.ParquetColumns(path)
    assert columns.columns == ["x", "c", "b"] and len(columns) == 10 and columns.split.path == path
    pd.testing.assert_series_equal(columns["c"], pd.read_parquet(path)["c"])
    parts = list(stream.blocks(path, 3, ["c", "x"]))
    assert [len(p) for p in parts] == [3, 3, 3, 1] and all(list(p.columns) == ["c", "x"] for p in parts)
    pd.testing.assert_frame_equal(pd.concat(parts, ignore_index=True), frame[["c", "x"]])
    pd.testing.assert_frame_equal(stream.head(path, 2), frame.iloc[:2])
    empty = write_split(tmp_path / "splits" / "empty.parquet", frame.iloc[:0])
    pd.testing.assert_frame_equal(stream.head(empty, 5), pd.read_parquet(empty))
    assert len(stream.head(empty, 5)) == 0


def test_rows_per_block_are_sixteen_mebibytes_of_float32_in_whole_multiples() -> None:
    assert stream.BLOCK_BYTES == 16 * 2**20
    assert stream.block_rows(4) == 2**20
    assert stream.block_rows(4, multiple=3) == 2**20 - 1  # 1048576 = 3 * 349525 + 1
    assert stream.block_rows(0) == 16 * 2**20  # no columns: a byte a row
    assert stream.block_rows(2**30) == 1 and stream.block_rows(2**30, multiple=8) == 8


def test_a_streamed_split_reads_its_rows_of_the_linked_table_as_a_file_of_its_own_would_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    frame = pd.DataFrame(
        {
            "x": np.arange(10.0),
            ROW_KEY: np.arange(10, dtype=np.uint64),
            "c": pd.Series(list("abcdefghij"), dtype="string"),
            "n": pd.array([1, None, 3, 4, None, 6, 7, 8, 9, 10], dtype="Int64"),  # its dtype is in pandas' metadata
        }
    )
    splits = tmp_path / "splits"
    write_split(splits / stream.LINKED, frame, row_group_size=3)
    part = np.array([0, 1, 0, 2, 2, 0, 1, 0, 0, 2], dtype=np.int8)
    np.save(splits / stream.ROWS, part)
    monkeypatch.setattr(stream, "BLOCK_BYTES", 64)  # a few rows a block
    for i, name in enumerate(SPLITS):
        want = frame.drop(columns=[ROW_KEY]).iloc[np.flatnonzero(part == i)].reset_index(drop=True)
        split = stream.Split.stored(splits, name)
        assert (split.path, split.part, split.name, len(split)) == (splits / stream.LINKED, i, name, len(want))
        assert split.exists() and split.files() == [splits / stream.LINKED, splits / stream.ROWS]
        assert split.columns == ["x", "c", "n"] and str(split).startswith(str(splits / name))
        assert split.mb() == approx(stream.table_mb(splits / stream.LINKED) * len(want) / 10)
        pd.testing.assert_frame_equal(split.read(), want, check_exact=True)
        for c in want.columns:
            pd.testing.assert_series_equal(stream.ParquetColumns(split)[c], want[c], check_exact=True)
        for rows in (1, 2, 4):
            blocks = list(stream.blocks(split, rows, ["n", "x"]))
            whole, rest = divmod(len(want), rows)
            assert [len(b) for b in blocks] == [rows] * whole + [rest] * (rest > 0)
            pd.testing.assert_frame_equal(pd.concat(blocks, ignore_index=True), want[["n", "x"]], check_exact=True)
        pd.testing.assert_frame_equal(stream.head(split, 2), want.iloc[:2], check_exact=True)
    # a file of its own wins; without rows.npy there is only the file of its own (missing: named in the message)
    write_split(splits / "val.parquet", frame.iloc[:2].drop(columns=[ROW_KEY]))
    assert stream.Split.stored(splits, "val").part is None and len(stream.Split.stored(splits, "val")) == 2
    (splits / stream.ROWS).unlink()
    test = stream.Split.stored(splits, "test")
    assert test.path == splits / "test.parquet" and not test.exists()
    # rows.npy of another table: named, with how to make it again
    np.save(splits / stream.ROWS, part[:7])
    with pytest.raises(DataError, match=r"rows.npy holds \(7,\) split numbers for the 10 rows of .*table.parquet; "
                                        r"restore .* `trainflow stage split`"):  # fmt: skip
        len(stream.Split.stored(splits, "test"))


def test_damaged_or_missing_files_say_how_to_restore_them(tmp_path: Path) -> None:
    processed = tmp_path / "data" / "processed" / "table.parquet"
    split = tmp_path / "data" / "splits" / "train.parquet"
    for path in (processed, split):
        with pytest.raises(DataError) as exc:
            stream.ParquetColumns(path)
        how = (
            "restore the version DVC committed with `dvc checkout --force data/processed`, or write it again with "
            "`trainflow stage ingest`"
            if path is processed
            else "restore the version DVC committed with `dvc checkout --force data/splits`, or write it again with "
            "`trainflow stage split`"
        )
        assert str(exc.value) == f"{path} is missing; {how}"
        path.parent.mkdir(parents=True)
        path.write_bytes(b"PAR1 not really")
        try:
            pq.ParquetFile(path, pre_buffer=False)
        except Exception as why:  # noqa: BLE001 - pyarrow's own words, for the expected message
            reason = str(why)
        with pytest.raises(DataError) as exc:
            stream.table_mb(path)
        assert str(exc.value) == f"{path} cannot be read, it is corrupt or truncated ({reason}); {how}"


def test_the_streamed_matrix_is_the_in_memory_transform_for_both_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    frame = tabular_train().assign(num=[1.0, np.nan, 3.0, 4.0, 7.0], cat=pd.Series(list("babxc"), dtype="string"))
    path = write_split(tmp_path / "splits" / "train.parquet", frame)
    pre = fit(frame, schema(TABULAR))
    monkeypatch.setattr(stream, "BLOCK_BYTES", 4 * pre.width * 2)  # blocks of 2 rows: the last one partial
    x, y = stream.write_matrix(pre, path, tmp_path / "m", "train")
    assert x.dtype == np.float32 and y.dtype == np.int64
    assert isinstance(x, np.memmap) and isinstance(y, np.memmap) and not x.flags.writeable and not y.flags.writeable
    np.testing.assert_array_equal(x, pre.features(frame))
    assert y.tolist() == [0, 1, 0, 1, 0]
    reg = frame.assign(y=[1.0, 2.0, 6.0, 3.0, 3.0])
    path = write_split(tmp_path / "splits" / "reg.parquet", reg)
    rpre = fit(reg, schema(TABULAR, task="regression"))
    x, y = stream.write_matrix(rpre, path, tmp_path / "r", "train")
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, (np.array([1.0, 2.0, 6.0, 3.0, 3.0]) - 3.0) / math.sqrt(2.8), rtol=1e-6)
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["x.npy", "y.npy"]
    unknown = write_split(tmp_path / "splits" / "val.parquet", frame.assign(y=["a", "a", "a", "a", "zz"]))
    with pytest.raises(DataError) as exc:
        stream.write_matrix(pre, unknown, tmp_path / "v", "data/splits/val.parquet")
    assert message(exc) == (
        "data/splits/val.parquet: target column 'y' has labels ['zz'] in 1 row(s) that the schema does not know "
        "(known labels: ['a', 'b'])"
    )
    bad = write_split(tmp_path / "splits" / "bad.parquet", frame.assign(num=["1", "x", "2", "3", "4"]))
    with pytest.raises(DataError) as exc:
        stream.write_matrix(pre, bad, tmp_path / "b", "data/splits/bad.parquet")
    assert message(exc) == (
        "data/splits/bad.parquet: column 'num' should hold numbers but has ['x'] in 1 row(s) (first at row 1)"
    )
