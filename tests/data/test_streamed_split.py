"""The split stage over data.memory_budget_mb (issue 26): the table is never read whole (its key columns a block of
rows at a time for the assignment) nor copied (it is linked into data/splits, with a byte a row saying each row's
split), and what comes out is the in-memory split's: the same assignment, bit for bit, the same rows in each split
with the same dtypes, read whole, a column or a block at a time; the same test-row generations; also after rows are
appended, by group and by time."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from support.projects import make_project

from trainflow.core.paths import SPLITS, Paths
from trainflow.data import split_stream, stream
from trainflow.data.schema import ROW_KEY
from trainflow.data.split import ASSIGNMENT, TEST_ROWS
from trainflow.data.stream import Split
from trainflow.params import load_params, write_overrides
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
    written = {p.name for p in streamed.splits.glob("*.parquet")} - {ASSIGNMENT, TEST_ROWS}
    assert written == {"table.parquet"}  # no split copied into a file of its own
    assert os.path.samefile(streamed.splits / "table.parquet", streamed.table)  # a link, not a copy
    rows = np.load(streamed.splits / "rows.npy")
    assert rows.dtype == np.int8 and rows.shape == (pq.ParquetFile(streamed.table).metadata.num_rows,)
    for name in SPLITS:
        expected = pd.read_parquet(memory.split_file(name))
        assert len(expected) > 0 and int((rows == SPLITS.index(name)).sum()) == len(expected)
        split = Split.stored(streamed.splits, name)
        assert not streamed.split_file(name).exists() and len(split) == len(expected)
        pd.testing.assert_frame_equal(Split.stored(streamed.splits, name).read(), expected, check_exact=True)
        blocks = list(stream.blocks(split, 7, list(expected.columns)))  # 7: no block lines up with a row group
        assert [len(b) for b in blocks[:-1]] == [7] * (len(blocks) - 1) and 0 < len(blocks[-1]) <= 7
        pd.testing.assert_frame_equal(pd.concat(blocks, ignore_index=True), expected, check_exact=True)
        columns = stream.ParquetColumns(split)
        assert columns.columns == list(expected.columns) and len(columns) == len(expected)
        for c in expected.columns:
            pd.testing.assert_series_equal(columns[c], expected[c], check_exact=True)
        pd.testing.assert_frame_equal(stream.head(split, 5), expected.head(5), check_exact=True)
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

    # 10% new rows appended: both keep every old row where it was and place the new ones alike
    for paths in projects:
        old = pd.read_csv(paths.root / "data/raw/t.csv")
        pd.concat([old, table(60, seed=1)]).to_csv(paths.root / "data/raw/t.csv", index=False)
    before = Split.stored(streamed.splits, "train").read()
    run_stage("ingest", load_params(streamed.params), streamed)  # a new table; the splits keep the one they linked
    pd.testing.assert_frame_equal(Split.stored(streamed.splits, "train").read(), before, check_exact=True)
    split_both(projects, monkeypatch)
    assert_same_splits(memory, streamed)
    assert pd.read_parquet(streamed.splits / TEST_ROWS)["since"].max() == 2  # the new rows' generation


@pytest.mark.parametrize("override", ["split.group_by=user", "split.time_column=when", "split.stratify=false"])
def test_a_streamed_split_by_group_or_time_is_the_in_memory_split(
    projects: tuple[Paths, Paths], monkeypatch: pytest.MonkeyPatch, override: str
) -> None:
    split_both(projects, monkeypatch, override)
    assert_same_splits(*projects)


def test_a_streamed_split_with_its_own_seed_is_the_in_memory_split_and_records_each_test_rows_key(
    projects: tuple[Paths, Paths], monkeypatch: pytest.MonkeyPatch
) -> None:
    """split.seed keys the split (the top-level seed does not); each test row's key in test_rows.parquet is a key the
    assignment holds as a test key, one per test row (read here with pyarrow)."""
    memory, _ = projects
    split_both(projects, monkeypatch)
    default = pd.read_parquet(memory.split_file("test"))
    split_both(projects, monkeypatch, "split.seed=7", "seed=3")
    assert_same_splits(*projects)
    for paths in projects:
        assignment = pq.read_table(paths.splits / ASSIGNMENT)
        assert json.loads(assignment.schema.metadata[b"trainflow"])["seed"] == 7
        tests = set(np.asarray(assignment["key"])[np.asarray(assignment["split"]) == 2].tolist())
        keys = pq.read_table(paths.splits / TEST_ROWS)["key"].to_pylist()
        assert len(keys) == len(Split.stored(paths.splits, "test").read()) and set(keys) == tests
    assert not pd.read_parquet(memory.split_file("test")).equals(default)  # another seed, another split


def test_a_streamed_split_names_a_damaged_table_and_how_to_restore_it(
    projects: tuple[Paths, Paths], monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainflow.core.errors import DataError

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
    """schema.parquet_options, in every writer of a table (ingest and split, in memory and streamed): a float column and
    the row key are written plain (a dictionary of values that rarely or never repeat is built only to be given up),
    the others with one. (A streamed split writes no table: it links the processed one.)"""
    split_both(projects, monkeypatch)
    files = [paths.table for paths in projects] + [projects[0].split_file(s) for s in SPLITS]
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


def test_a_streamed_split_copies_the_table_where_it_cannot_link_it(
    projects: tuple[Paths, Paths], monkeypatch: pytest.MonkeyPatch
) -> None:
    def cannot(*args: object) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cannot)
    split_both(projects, monkeypatch)
    memory, streamed = projects
    copied = streamed.splits / "table.parquet"
    assert not os.path.samefile(copied, streamed.table) and copied.read_bytes() == streamed.table.read_bytes()
    for name in SPLITS:
        pd.testing.assert_frame_equal(
            Split.stored(streamed.splits, name).read(), Split.stored(memory.splits, name).read(), check_exact=True
        )


def test_the_data_hash_of_a_streamed_split_covers_each_rows_split(
    projects: tuple[Paths, Paths], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hash a checkpoint resumes on and register compares tests by: the same table split otherwise (one row moved
    to another split) is other data."""
    from trainflow.core.io import sha256_files
    from trainflow.engine.fingerprint import data_hash

    split_both(projects, monkeypatch)
    _, streamed = projects
    before, test_before = data_hash(streamed), sha256_files(Split.stored(streamed.splits, "test").files())
    rows = np.load(streamed.splits / "rows.npy")
    rows[np.flatnonzero(rows == 2)[0]] = 0  # a test row trains now
    np.save(streamed.splits / "rows.npy", rows)
    assert data_hash(streamed) != before and sha256_files(Split.stored(streamed.splits, "test").files()) != test_before
