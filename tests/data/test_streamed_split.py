"""The split stage over data.memory_budget_mb (issue 26): the table is never read whole (its columns one at a time
for the assignment, then its rows a block at a time into the split files), and what comes out is the in-memory
split's: the same assignment, bit for bit, the same rows in each split file with the same dtypes, the same
test-row generations; also after rows are appended, by group and by time."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import make_project

from trainflow.data import split_stream, stream
from trainflow.data.schema import ROW_KEY
from trainflow.data.split import ASSIGNMENT, TEST_ROWS
from trainflow.params import load_params, write_overrides
from trainflow.paths import SPLITS, Paths
from trainflow.stages import run_stage


def table(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "x": np.where(rng.random(n) < 0.05, np.nan, rng.normal(0, 1, n)),
            "colour": rng.choice(["red", "green", "blue"], n),
            "flag": rng.random(n) < 0.3,
            "when": pd.Timestamp("2026-01-01") + pd.to_timedelta(rng.integers(0, 90, n), unit="D"),
            "user": rng.integers(0, n // 5, n),
            "label": rng.choice(["a", "b", "c", "rare"], n, p=[0.5, 0.3, 0.18, 0.02]),
        }
    )


@pytest.fixture
def projects(tmp_path: Path) -> tuple[Paths, Paths]:
    """Two projects on the same data: one holds the table in memory, the other streams it (a budget of ~0)."""
    params = {"data.source": "data/raw/t.csv", "data.target": "label", "register.model_name": "t"}
    made = []
    for name, budget in (("memory", "null"), ("streamed", "0.000001")):
        root = make_project(tmp_path / name, {**params, "data.memory_budget_mb": budget})
        table(600).to_csv(root / "data/raw/t.csv", index=False)
        made.append(Paths(root))
    return made[0], made[1]


def split_both(projects: tuple[Paths, Paths], monkeypatch: pytest.MonkeyPatch, *overrides: str) -> None:
    memory, streamed = projects
    for paths in projects:
        write_overrides(paths.params, list(overrides))
        run_stage("ingest", load_params(paths.params), paths)
    run_stage("split", load_params(memory.params), memory)
    with monkeypatch.context() as m:
        m.setattr(stream, "BLOCK_BYTES", 4096)  # blocks of a few dozen rows: many block boundaries
        m.setattr(split_stream, "BLOCK_ROWS", 37)  # keys a few dozen rows at a time ...
        m.setattr(split_stream, "BUCKET_ROWS", 50)  # ... into 16 buckets of keys
        m.setattr(Paths, "read_table", lambda self: pytest.fail("the streamed split read the whole table"))
        run_stage("split", load_params(streamed.params), streamed)


def assert_same_splits(memory: Paths, streamed: Paths) -> None:
    for name in SPLITS:
        expected, got = pd.read_parquet(memory.split_file(name)), pd.read_parquet(streamed.split_file(name))
        pd.testing.assert_frame_equal(got, expected, check_exact=True)
        assert len(expected) > 0
    if (memory.splits / ASSIGNMENT).is_file():  # written a bucket of keys at a time: other row groups, same table
        expected, got = pq.read_table(memory.splits / ASSIGNMENT), pq.read_table(streamed.splits / ASSIGNMENT)
        assert got.equals(expected) and got.schema.metadata == expected.schema.metadata
    if (memory.splits / TEST_ROWS).is_file():
        assert (streamed.splits / TEST_ROWS).read_bytes() == (memory.splits / TEST_ROWS).read_bytes()
    assert (streamed.split_schema).read_text() == memory.split_schema.read_text()


def test_a_streamed_split_is_the_in_memory_split(
    projects: tuple[Paths, Paths], monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    split_both(projects, monkeypatch)
    err = capfd.readouterr().err
    assert "split: held in memory (table:" in err and "split: streamed from disk (table:" in err
    memory, streamed = projects
    assert_same_splits(memory, streamed)
    train = pq.ParquetFile(streamed.split_file("train"))
    assert train.metadata.num_row_groups > 2  # written a block at a time, not gathered first
    assert "row_key" not in train.schema_arrow.names
    with monkeypatch.context() as m:
        m.setattr(stream, "BLOCK_BYTES", 4096)
        block = stream.data_rows(streamed.table)
    for name in SPLITS:  # a part's rows are gathered into row groups of a block's rows, not its share of each block
        meta = pq.ParquetFile(streamed.split_file(name)).metadata
        groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        assert all(g >= block for g in groups[:-1]) and groups[-1] > 0, (name, block, groups)

    # 10% new rows appended: both keep every old row where it was and place the new ones alike
    for paths in projects:
        old = pd.read_csv(paths.root / "data/raw/t.csv")
        pd.concat([old, table(60, seed=1)]).to_csv(paths.root / "data/raw/t.csv", index=False)
    split_both(projects, monkeypatch)
    assert_same_splits(memory, streamed)
    assert pd.read_parquet(streamed.splits / TEST_ROWS)["since"].max() == 2  # the new rows' generation


@pytest.mark.parametrize("override", ["split.group_by=user", "split.time_column=when", "split.stratify=false"])
def test_a_streamed_split_by_group_or_time_is_the_in_memory_split(
    projects: tuple[Paths, Paths], monkeypatch: pytest.MonkeyPatch, override: str
) -> None:
    split_both(projects, monkeypatch, override)
    assert_same_splits(*projects)


def test_a_streamed_split_names_a_damaged_table_and_how_to_restore_it(
    projects: tuple[Paths, Paths], monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainflow.errors import DataError

    _, streamed = projects
    run_stage("ingest", load_params(streamed.params), streamed)
    data = streamed.table.read_bytes()
    streamed.table.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="table.parquet cannot be read.*dvc checkout --force data/processed"):
        run_stage("split", load_params(streamed.params), streamed)
    assert not streamed.splits.exists() or not any(streamed.splits.glob("*.parquet"))
    shutil.rmtree(streamed.root / "data/processed")
    run_stage("ingest", load_params(streamed.params), streamed)  # as the message says (`trainflow stage ingest`)
    run_stage("split", load_params(streamed.params), streamed)


def test_tables_are_written_with_dictionaries_for_every_column_but_floats_and_the_row_key(
    projects: tuple[Paths, Paths], monkeypatch: pytest.MonkeyPatch
) -> None:
    """io.parquet_options, in every writer of a table (ingest and split, in memory and streamed): a float column and
    the row key are written plain (a dictionary of values that rarely or never repeat is built only to be given up),
    the others with one."""
    split_both(projects, monkeypatch)
    files = [paths.table for paths in projects] + [paths.split_file(s) for paths in projects for s in SPLITS]
    for path in files:
        meta = pq.ParquetFile(path).metadata
        for j in range(meta.num_columns):
            column = meta.row_group(0).column(j)
            if column.physical_type == "BOOLEAN":  # Parquet has no dictionaries of booleans
                continue
            dictionary = any("DICTIONARY" in e for e in column.encodings)
            plain = column.physical_type in ("DOUBLE", "FLOAT") or column.path_in_schema == ROW_KEY
            assert dictionary != plain, (path, column.path_in_schema, column.physical_type, column.encodings)
    assert ROW_KEY in pq.read_schema(projects[1].table).names  # the row key was among the columns checked
