"""The keyed split a bucket of keys at a time (`split_stream`, issue 26) against the whole-table split (`split.assign`)
on the same rows: the same split of every row, the same saved assignment (keys, splits, generations, settings), the
same rows kept, notes and errors — with keys spread over many buckets and read a few rows at a time, so every
boundary between blocks and buckets is crossed. The whole-table split is the reference; its own exactness (fractions,
strata, stability under appends) is tested in test_split.py against counts worked out independently."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.splits import schema_for

from trainflow.core.errors import DataError
from trainflow.data import split_stream
from trainflow.data.schema import ROW_KEY
from trainflow.data.split import Assignment, Result, assign
from trainflow.params import SplitParams

PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(autouse=True)
def small_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(split_stream, "BLOCK_ROWS", 23)
    monkeypatch.setattr(split_stream, "BUCKET_ROWS", 16)


def frame_of(n: int, seed: int, labels: int = 3, missing: float = 0.05) -> pd.DataFrame:
    """Rows with a raw-row key (some duplicated: identical rows), a group id shared by rows of different labels, a
    float id that has a fraction only in its last rows, text, and labels some of which are missing."""
    rng = np.random.default_rng(seed)
    y = rng.choice(["ant", "bee", "cat", "dog"][:labels], n).astype(object)
    y[rng.random(n) < missing] = None
    fid = rng.integers(0, n // 3 + 1, n).astype(np.float64)
    fid[-1] += 0.5  # whole numbers in every block but the last: hashed as text of floats, in every block
    key = rng.integers(0, 2**63, n, dtype=np.int64).astype(np.uint64)
    key[1::7] = key[0:-1:7]  # duplicate rows share a key
    return pd.DataFrame(
        {
            ROW_KEY: key,
            "group": rng.integers(0, max(2, n // 6), n),
            "fid": fid,
            "s": rng.choice(["red", "green", "blue"], n),
            "x": rng.normal(size=n),
            "y": y,
        }
    )


def both(frame: pd.DataFrame, tmp_path: Path, p: SplitParams, seed: int, previous: Assignment | None = None,
         task: str = "classification") -> tuple[Result, Result, pd.DataFrame]:  # fmt: skip
    """(whole-table result, bucketed result, the bucketed run's saved assignment), with split.seed `seed`."""
    p = p.model_copy(update={"seed": seed})
    schema = schema_for(frame, ["x", "s"], task)
    table = tmp_path / "table.parquet"
    frame.to_parquet(table, index=False)
    expected = assign(frame, schema, p, previous)
    dest = tmp_path / "assignment.parquet"
    got = split_stream.assign(table, schema, p, previous, dest, tmp_path / "work")
    return expected, got, pq.read_table(dest)


def assert_same(expected: Result, got: Result, saved: object, dest: Path) -> None:
    np.testing.assert_array_equal(got.split, expected.split)
    assert got.split.dtype == expected.split.dtype
    np.testing.assert_array_equal(got.since, expected.since)
    np.testing.assert_array_equal(got.test_keys, expected.test_keys)  # each test row's key, in table order
    assert (got.kept, got.exact, got.notes) == (expected.kept, expected.exact, expected.notes)
    assert expected.assignment is not None
    reference = dest.with_name("reference.parquet")
    expected.assignment.save(reference)
    want = pq.read_table(reference)
    assert saved.equals(want) and saved.schema.metadata == want.schema.metadata  # type: ignore[attr-defined]


MODES = {
    "rows": {},
    "groups": {"group_by": "group"},
    "keys": {"key": ["fid", "s"]},
    "unstratified": {"stratify": False},
}


@PROPERTY
@given(n=st.integers(8, 260), seed=st.integers(0, 2**16), mode=st.sampled_from(sorted(MODES)))
def test_a_bucketed_split_is_the_whole_table_split(tmp_path: Path, n: int, seed: int, mode: str) -> None:
    frame = frame_of(n, seed)
    p = SplitParams(val_fraction=0.2, test_fraction=0.15, seed=seed, **MODES[mode])
    try:
        expected, got, saved = both(frame, tmp_path, p, seed)
    except DataError as exc:  # too few rows or groups for a split: the same error from both
        with pytest.raises(DataError) as streamed:
            split_stream.assign(tmp_path / "table.parquet", schema_for(frame, ["x", "s"]), p, None,
                                tmp_path / "a.parquet", tmp_path / "w")  # fmt: skip
        assert str(streamed.value) == str(exc)
        return
    assert_same(expected, got, saved, tmp_path / "assignment.parquet")


@pytest.mark.parametrize("mode", sorted(MODES))
def test_appended_rows_keep_the_saved_splits_and_take_the_next_generation_alike(tmp_path: Path, mode: str) -> None:
    p = SplitParams(val_fraction=0.2, test_fraction=0.2, seed=3, **MODES[mode])
    grown = frame_of(300, 7)
    grown.loc[250:, "group"] += 1000  # some new groups among the appended rows
    grown["fid"] = np.floor(grown["fid"])  # ids read as integers before and after the append
    first = assign(grown.iloc[:200], schema_for(grown.iloc[:200], ["x", "s"]), p)
    expected, got, saved = both(grown, tmp_path, p, 3, first.assignment)
    assert_same(expected, got, saved, tmp_path / "assignment.parquet")
    assert got.kept > 0 and set(np.unique(got.since)) == {1, 2}  # the old rows' generation and the new ones'
    assert pq.ParquetFile(tmp_path / "assignment.parquet").metadata.num_row_groups > 4  # written a bucket at a time

    # the same rows again: nothing new, so the generation stays 2
    again_expected, again, saved = both(grown, tmp_path, p, 3, expected.assignment)
    assert_same(again_expected, again, saved, tmp_path / "assignment.parquet")
    assert saved.schema.metadata[b"generation"] == b"2" and again.kept == len(grown)


def test_a_saved_assignment_of_other_settings_is_noted_and_every_row_assigned_afresh_alike(tmp_path: Path) -> None:
    frame = frame_of(120, 1)
    first = assign(frame, schema_for(frame, ["x", "s"]), SplitParams(seed=5))
    expected, got, saved = both(frame, tmp_path, SplitParams(val_fraction=0.3), 5, first.assignment)
    assert_same(expected, got, saved, tmp_path / "assignment.parquet")
    assert got.notes == [
        "split: the saved assignment was made with other settings (val_fraction); every row is assigned afresh"
    ]


def test_classes_too_small_for_val_or_test_get_the_same_note(tmp_path: Path) -> None:
    frame = frame_of(90, 2, missing=0.0)
    frame.loc[frame.index[:2], "y"] = "emu"  # a class of two rows: train and one other split at most
    expected, got, saved = both(frame, tmp_path, SplitParams(), 0)
    assert_same(expected, got, saved, tmp_path / "assignment.parquet")
    assert len(got.notes) == 1 and "'emu' (2 rows)" in got.notes[0]


def test_a_regression_target_is_one_stratum(tmp_path: Path) -> None:
    frame = frame_of(150, 3).assign(y=lambda f: np.linspace(0.0, 1.0, len(f)))
    expected, got, saved = both(frame, tmp_path, SplitParams(), 9, task="regression")
    assert_same(expected, got, saved, tmp_path / "assignment.parquet")


def test_the_buckets_are_many_and_are_removed_as_they_are_used(tmp_path: Path) -> None:
    frame = frame_of(200, 4)
    made: list[int] = []
    original = split_stream._write_buckets

    def counting(*args: object) -> None:
        original(*args)  # type: ignore[arg-type]
        made.append(len(list((tmp_path / "work").glob("bucket-*.bin"))))

    split_stream._write_buckets = counting  # type: ignore[assignment]
    try:
        both(frame, tmp_path, SplitParams(), 0)
    finally:
        split_stream._write_buckets = original  # type: ignore[assignment]
    assert made == [16]  # 200 rows / 16 per bucket -> the next power of two above 12.5
    assert list((tmp_path / "work").glob("bucket-*.bin")) == []


@pytest.mark.parametrize("mode", sorted(MODES))
def test_rows_that_leave_and_come_back_keep_their_split_alike(tmp_path: Path, mode: str) -> None:
    """Rows gone from the table stay in the saved assignment (a bucket's range of keys written with the bucket), so
    that when they come back, after new rows took the open places, they are where they were; the same bucket by
    bucket as whole."""
    frame = frame_of(300, 11, missing=0.0)
    frame["fid"] = np.floor(frame["fid"])  # ids read as integers in each table
    p = SplitParams(val_fraction=0.2, test_fraction=0.2, seed=4, **MODES[mode])
    first = assign(frame.iloc[:200], schema_for(frame, ["x", "s"]), p)
    gone = np.zeros(len(frame), dtype=bool)
    gone[:200] = np.random.default_rng(2).random(200) < 0.3
    expected, got, saved = both(frame[~gone].reset_index(drop=True), tmp_path, p, 4, first.assignment)
    assert_same(expected, got, saved, tmp_path / "assignment.parquet")
    assert first.assignment is not None and set(first.assignment.keys.tolist()) <= set(saved["key"].to_pylist())
    back, back_got, saved = both(frame, tmp_path, p, 4, expected.assignment)
    assert_same(back, back_got, saved, tmp_path / "assignment.parquet")
    np.testing.assert_array_equal(back_got.split[:200], first.split)  # every row where it was before it left
    assert back_got.kept == len(frame)
