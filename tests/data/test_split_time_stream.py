"""The time split of a table bigger than memory (`split_stream.assign_by_time`, issue 26) against the whole-column
split (`split._by_time`, which sorts the column) on the same rows: the same split of every row and the same errors,
with the column read a few rows at a time and never whole. The boundaries are found by a radix selection over the
times' sort keys, so the columns hold what breaks sort keys: negatives, -0.0 beside 0.0, floats and integers near
the ends of their range, timestamps of several units and with a time zone, and long runs of equal times across the
boundaries (which move to the run's nearer end)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainflow.core.errors import DataError
from trainflow.data import split_stream, stream
from trainflow.data.split import _by_time, _check_not_empty
from trainflow.params import SplitParams

PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(split_stream, "BLOCK_ROWS", 17)


def times(kind: str, n: int, seed: int, distinct: int) -> pd.Series:
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, distinct, n)  # few distinct values: long runs of equal times
    if kind == "int":
        values = np.array([-(2**63), -5, -1, 0, 1, 7, 2**40, 2**63 - 1], dtype=np.int64)
        return pd.Series(values[pick % len(values)] if distinct <= 8 else rng.integers(-(2**62), 2**62, n))
    if kind == "float":
        values = np.array([-np.inf, -1e300, -2.5, -0.0, 0.0, 5e-324, 3.25, 1e308, np.inf])
        return pd.Series(values[pick % len(values)] if distinct <= 9 else rng.normal(0, 1e6, n))
    unit = {"ns": "ns", "s": "s", "us-tz": "us"}[kind]
    base = pd.Timestamp("2024-10-27 01:00", tz="Europe/Paris" if kind == "us-tz" else None).as_unit(unit)
    return pd.Series(base + pd.to_timedelta(pick * 1800, unit="s"))  # half-hours across clocks going back an hour


def both(tmp_path: Path, column: pd.Series, p: SplitParams) -> tuple[np.ndarray, np.ndarray]:
    frame = pd.DataFrame({"t": column, "x": np.arange(len(column))})
    frame.to_parquet(tmp_path / "table.parquet", index=False)
    whole = _by_time(frame, p)
    _check_not_empty(whole, frame, p)
    with pytest.MonkeyPatch.context() as m:  # (an empty split's message reads it whole, to count its times)
        if column.dtype != object and column.dtype != "str":
            m.setattr(stream.ParquetColumns, "__getitem__", lambda *a: pytest.fail("read the time column whole"))
        streamed = split_stream.assign_by_time(tmp_path / "table.parquet", p)
    assert streamed.assignment is None and streamed.split.dtype == np.int8
    return whole, streamed.split


@PROPERTY
@given(
    kind=st.sampled_from(["int", "float", "ns", "s", "us-tz"]),
    n=st.integers(20, 160),
    seed=st.integers(0, 10**6),
    distinct=st.sampled_from([2, 3, 5, 9, 40, 10**6]),
    fractions=st.sampled_from([(0.15, 0.15), (0.2, 0.1), (0.05, 0.3), (0.01, 0.25), (0.3, 0.01)]),
)
def test_each_row_gets_the_whole_column_splits_time_split(
    tmp_path: Path, kind: str, n: int, seed: int, distinct: int, fractions: tuple[float, float]
) -> None:
    p = SplitParams(time_column="t", val_fraction=fractions[0], test_fraction=fractions[1])
    column = times(kind, n, seed, distinct)
    try:
        whole = _by_time(pd.DataFrame({"t": column}), p)
        _check_not_empty(whole, pd.DataFrame({"t": column}), p)
    except DataError as error:  # an empty split: the same error streamed
        pd.DataFrame({"t": column}).to_parquet(tmp_path / "table.parquet", index=False)
        with pytest.raises(DataError) as streamed_error:
            split_stream.assign_by_time(tmp_path / "table.parquet", p)
        assert str(streamed_error.value) == str(error)
        return
    whole, streamed = both(tmp_path, column, p)
    assert np.array_equal(whole, streamed)


def test_a_run_of_equal_times_across_a_boundary_moves_to_its_nearer_end(tmp_path: Path) -> None:
    """Worked by hand: 20 rows sorted 0 x5, 1 x5, 3 x5, 5 x4, 9. Test 0.15 (3 rows) cuts at position 17, inside the
    run of 5s at 15..18: 2 rows from its start, 2 from its end, a tie goes to the start, so all the 5s and the 9 are
    test; val 0.25 (5 rows) cuts at 12, inside the run of 3s at 10..14: nearer its start (2 vs 3), so the 3s are
    val."""
    column = pd.Series([0] * 5 + [1] * 5 + [3] * 5 + [5] * 4 + [9], dtype=np.int64).sample(frac=1, random_state=0)
    p = SplitParams(time_column="t", val_fraction=0.25, test_fraction=0.15)
    whole, streamed = both(tmp_path, column.reset_index(drop=True), p)
    assert np.array_equal(whole, streamed)
    by_time = pd.Series(streamed).groupby(column.reset_index(drop=True).to_numpy()).agg(lambda s: sorted(set(s)))
    assert by_time.to_dict() == {0: [0], 1: [0], 3: [1], 5: [2], 9: [2]}


def test_missing_times_are_the_same_error_and_text_times_are_sorted_whole(tmp_path: Path) -> None:
    p = SplitParams(time_column="t")
    column = pd.Series(np.arange(40, dtype=np.float64))
    column[[3, 31]] = np.nan
    pd.DataFrame({"t": column}).to_parquet(tmp_path / "table.parquet", index=False)
    with pytest.raises(DataError) as error:
        split_stream.assign_by_time(tmp_path / "table.parquet", p)
    assert str(error.value) == (
        "split.time_column: 2 of 40 rows have no timestamp in column 't'; fill or drop them (data.missing: drop) or "
        "split without split.time_column"
    )
    # a text column: read whole and sorted, as in memory
    text = pd.Series([f"2024-01-{d:02d}" for d in np.random.default_rng(1).integers(1, 28, 60)])
    whole, streamed = both(tmp_path, text, p)
    assert np.array_equal(whole, streamed)


def test_times_with_a_time_zone_are_ordered_by_instant_not_by_wall_clock(tmp_path: Path) -> None:
    """Paris, 2024-10-27: clocks go back from 03:00 to 02:00, so half-hours 2 and 4 after 01:00 CEST both read 02:00
    and half-hour 3 (02:30 CEST) comes before half-hour 4 (02:00 CET). Five rows per half-hour 0..7: test 0.25 is
    the newest 10 rows (half-hours 6, 7) and val 0.25 the 10 before them: half-hours 4 and 5 by instant (by wall
    clock it would be 3 and 5)."""
    base = pd.Timestamp("2024-10-27 01:00", tz="Europe/Paris")
    half_hours = np.repeat(np.arange(8), 5)[np.random.default_rng(0).permutation(40)]
    column = pd.Series(base + pd.to_timedelta(half_hours * 1800, unit="s"))
    whole, streamed = both(tmp_path, column, SplitParams(time_column="t", val_fraction=0.25, test_fraction=0.25))
    assert np.array_equal(whole, streamed)
    assert pd.Series(streamed).groupby(half_hours).agg(lambda s: sorted(set(s))).to_dict() == {
        0: [0], 1: [0], 2: [0], 3: [0], 4: [1], 5: [1], 6: [2], 7: [2]}  # fmt: skip
