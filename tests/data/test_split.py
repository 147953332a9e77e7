"""The train/val/test split: stable under appended rows, fractions, groups, time order, and its errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pandas.util import hash_pandas_object

from trainflow.data.schema import Schema
from trainflow.data.split import SPLITS, assign, hash_key, split_frame
from trainflow.errors import DataError
from trainflow.params import SplitParams

LABELS = ["a", "b", "c", "d"]
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def schema_for(frame: pd.DataFrame, features: list[str] | None = None, task: str = "classification") -> Schema:
    features = features if features is not None else [c for c in frame.columns if c not in ("id", "y")]
    classes = sorted(frame["y"].dropna().unique().tolist()) if task == "classification" else []
    return Schema(
        source="test",
        target="y",
        task=task,  # type: ignore[arg-type]
        features=features,
        kinds=dict.fromkeys(features, "numeric"),
        classes=classes,
        n_rows=len(frame),
    )


def random_frame(n: int, n_classes: int = 3, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "id": np.arange(n, dtype=np.int64),
            "x": rng.normal(size=n),
            "s": rng.choice(["red", "green", "blue", "cyan"], size=n).astype(object),
            "y": rng.choice(LABELS[:n_classes], size=n).astype(object),
        }
    )


# A row of the processed table: a numeric feature (NaN = missing), a string feature (None = missing), a label.
ROW = st.tuples(
    st.floats(allow_nan=True, allow_infinity=False, width=64),
    st.none() | st.text(max_size=6),
    st.integers(0, 3),
)


@st.composite
def base_and_appended(draw: st.DrawFn) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A table of 20-300 rows with a 2-4 class target, and the same table with ~10% new rows appended."""
    n_classes = draw(st.integers(2, 4))
    rows = draw(st.lists(ROW, min_size=20, max_size=300))
    new = draw(st.lists(ROW, min_size=max(1, len(rows) // 10), max_size=max(1, len(rows) // 10)))

    def frame(part: list[tuple[float, str | None, int]], start: int) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "id": np.arange(start, start + len(part), dtype=np.int64),
                "x": np.array([r[0] for r in part], dtype=np.float64),
                "s": pd.Series([r[1] for r in part], dtype=object),
                "y": pd.Series([LABELS[r[2] % n_classes] for r in part], dtype=object),
            }
        )

    base = frame(rows, 0)
    return base, pd.concat([base, frame(new, len(rows))], ignore_index=True)


@pytest.mark.parametrize("key", [None, ["id"]], ids=["whole-row", "id-key"])
@PROPERTY
@given(frames=base_and_appended(), seed=st.integers(0, 2**32))
def test_appending_rows_never_moves_an_existing_row(
    frames: tuple[pd.DataFrame, pd.DataFrame], seed: int, key: list[str] | None
) -> None:
    base, extended = frames
    # 200 distinct rows first so that no split is ever empty, however repetitive the drawn rows (they cannot change
    # a drawn row's split: nothing depends on the other rows).
    filler = random_frame(200, seed=9).assign(id=lambda f: f["id"] - 1000)
    base, extended = (pd.concat([filler, f], ignore_index=True) for f in (base, extended))
    p = SplitParams(stratify=False, key=key, val_fraction=0.2, test_fraction=0.2)
    before = assign(base, schema_for(base), p, seed)
    after = assign(extended, schema_for(extended), p, seed)
    np.testing.assert_array_equal(after[: len(base)], before)


@PROPERTY
@given(frames=base_and_appended(), seed=st.integers(0, 2**32))
def test_stratified_split_is_stable_too(frames: tuple[pd.DataFrame, pd.DataFrame], seed: int) -> None:
    base, extended = frames
    p = SplitParams(stratify=True, val_fraction=0.2, test_fraction=0.2)
    plain = SplitParams(stratify=False, val_fraction=0.2, test_fraction=0.2)
    try:
        before = assign(base, schema_for(base), p, seed)
    except DataError as exc:  # a small class missing from a split: the error names it
        assert "class '" in str(exc) or "split is empty" in str(exc)
        event("base not stratifiable")
        return
    event("base stratified")
    # Stratifying only adds checks: the rows' splits are those of the plain hash, so they are just as stable.
    np.testing.assert_array_equal(before, assign(base, schema_for(base), plain, seed))
    try:
        after = assign(extended, schema_for(extended), p, seed)
    except DataError as exc:
        # The appended rows can bring a new class of one row, or grow a class to 3 rows that then must reach val and
        # test too; the existing rows still keep their splits (those of the plain hash).
        assert "class '" in str(exc)
        event("extended not stratifiable")
        after = assign(extended, schema_for(extended), plain, seed)
    np.testing.assert_array_equal(after[: len(base)], before)


def test_a_rows_split_depends_only_on_the_row() -> None:
    frame = random_frame(2000)
    schema = schema_for(frame)
    split = assign(frame, schema, SplitParams(), 7)
    order = np.random.default_rng(1).permutation(len(frame))
    shuffled = frame.iloc[order].reset_index(drop=True)
    np.testing.assert_array_equal(assign(shuffled, schema, SplitParams(), 7), split[order])
    # Duplicate rows share a split.
    doubled = pd.concat([frame, frame], ignore_index=True)
    both = assign(doubled, schema, SplitParams(), 7)
    np.testing.assert_array_equal(both[: len(frame)], both[len(frame) :])


@pytest.mark.parametrize("stratify", [False, True])
def test_fractions_on_20k_rows(stratify: bool) -> None:
    frame = random_frame(20_000, n_classes=3)
    p = SplitParams(val_fraction=0.1, test_fraction=0.2, stratify=stratify)
    split = assign(frame, schema_for(frame), p, 42)
    assert split.dtype == np.int8
    expected = np.array([0.7, 0.1, 0.2])
    np.testing.assert_allclose(np.bincount(split, minlength=3) / len(split), expected, atol=0.01)
    for label in LABELS[:3]:
        in_class = split[(frame["y"] == label).to_numpy()]
        np.testing.assert_allclose(np.bincount(in_class, minlength=3) / len(in_class), expected, atol=0.015)


def test_split_frame_keeps_table_order_and_resets_the_index() -> None:
    frame = random_frame(500)
    frame.index = frame.index * 10 + 3
    parts = split_frame(frame, schema_for(frame), SplitParams(), 0)
    assert list(parts) == list(SPLITS)
    assert sum(len(part) for part in parts.values()) == len(frame)
    for part in parts.values():
        assert part.index.equals(pd.RangeIndex(len(part)))
        assert part["id"].is_monotonic_increasing
        assert list(part.columns) == list(frame.columns)
    assert sorted(pd.concat(parts.values())["id"]) == list(frame["id"])


def test_group_by_keeps_every_group_in_one_split() -> None:
    frame = random_frame(20_000)
    frame["user"] = np.random.default_rng(3).integers(0, 400, size=len(frame))
    split = assign(frame, schema_for(frame, ["x", "s"]), SplitParams(group_by="user", stratify=False), 42)
    per_group = pd.Series(split).groupby(frame["user"].to_numpy()).nunique()
    assert (per_group == 1).all()
    # Groups, not rows, are split in the given proportions.
    group_split = pd.Series(split).groupby(frame["user"].to_numpy()).first()
    np.testing.assert_allclose(np.bincount(group_split, minlength=3) / len(group_split), [0.7, 0.15, 0.15], atol=0.06)


def test_time_column_tests_on_the_newest_rows() -> None:
    frame = random_frame(1000)
    days = pd.date_range("2024-01-01", periods=len(frame), freq="D")
    frame["when"] = days[np.random.default_rng(5).permutation(len(frame))]
    split = assign(frame, schema_for(frame, ["x", "s"]), SplitParams(time_column="when"), 0)
    assert np.bincount(split).tolist() == [700, 150, 150]
    when = frame["when"].to_numpy()
    assert when[split == 0].max() < when[split == 1].min()
    assert when[split == 1].max() < when[split == 2].min()
    assert when[split == 2].max() == when.max()


def test_time_column_with_missing_timestamps_says_how_many() -> None:
    frame = random_frame(100)
    frame["when"] = pd.date_range("2024-01-01", periods=100, freq="h")
    frame.loc[[3, 50, 77], "when"] = pd.NaT
    with pytest.raises(DataError, match=r"3 of 100 rows have no timestamp in column 'when'"):
        assign(frame, schema_for(frame, ["x", "s"]), SplitParams(time_column="when"), 0)


def test_the_seed_changes_the_assignment() -> None:
    frame = random_frame(2000)
    schema = schema_for(frame)
    a, b = (assign(frame, schema, SplitParams(), seed) for seed in (0, 1))
    assert (a != b).mean() > 0.2
    np.testing.assert_array_equal(a, assign(frame, schema, SplitParams(), 0))


def test_regression_ignores_stratify() -> None:
    frame = random_frame(300)
    frame["y"] = np.random.default_rng(0).normal(size=len(frame))
    split = assign(frame, schema_for(frame, task="regression"), SplitParams(stratify=True), 0)
    assert set(np.unique(split)) == {0, 1, 2}


@pytest.mark.parametrize(
    ("params", "column"),
    [({"key": ["id", "nope"]}, "nope"), ({"group_by": "user"}, "user"), ({"time_column": "ts"}, "ts")],
)
def test_unknown_columns_are_named_with_the_available_ones(params: dict[str, object], column: str) -> None:
    frame = random_frame(100)
    with pytest.raises(DataError, match=rf"column '{column}' is not in the processed table; available columns: id, x"):
        assign(frame, schema_for(frame), SplitParams(**params), 0)  # type: ignore[arg-type]


def test_an_empty_split_is_named() -> None:
    frame = pd.concat([random_frame(1)] * 5, ignore_index=True)  # 5 equal rows share one split
    with pytest.raises(
        DataError, match=r"split: the (train|val|test) split is empty \(5 rows, .* fraction 0\.15\); add rows"
    ):
        assign(frame, schema_for(frame), SplitParams(stratify=False), 0)
    frame["user"] = [1, 1, 2, 2, 2]
    with pytest.raises(DataError, match=r"is empty \(5 rows in 2 groups of split.group_by 'user', .*add groups or"):
        assign(frame, schema_for(frame, ["x", "s"]), SplitParams(stratify=False, group_by="user"), 0)


def test_a_class_of_one_row_is_too_small_to_stratify() -> None:
    frame = random_frame(300, n_classes=2)
    frame.loc[17, "y"] = "rare"
    with pytest.raises(DataError, match=r"class 'rare' has 1 row: too small to stratify"):
        assign(frame, schema_for(frame), SplitParams(), 0)
    assign(frame, schema_for(frame), SplitParams(stratify=False), 0)  # fine unstratified


def test_a_class_missing_from_train_is_named() -> None:
    frame = random_frame(600, n_classes=2)
    frame.loc[[5, 9], "y"] = "rare"
    p = SplitParams(val_fraction=0.45, test_fraction=0.44)
    messages = []
    for seed in range(40):
        try:
            assign(frame, schema_for(frame), p, seed)
        except DataError as exc:
            messages.append(str(exc))
    assert any("class 'rare' (2 rows) has no row in train" in m for m in messages)
    assert all("split.stratify: false" in m and "lower split.val_fraction" in m for m in messages)


def test_a_class_missing_from_test_is_named() -> None:
    frame = random_frame(3000, n_classes=2)
    frame.loc[[5, 9, 11, 12], "y"] = "rare"
    with pytest.raises(
        DataError,
        match=r"class 'rare' \(4 rows\) has no row in [a-z ]*test\. Fix: .*raise [a-z_./ ]*split\.test_fraction",
    ):
        assign(frame, schema_for(frame), SplitParams(val_fraction=0.3, test_fraction=0.01), 0)


def test_the_assignment_is_the_documented_hash_threshold_and_does_not_drift() -> None:
    """Changing the hash (its key, its columns, the thresholds) would silently move rows of every existing project."""
    frame = pd.DataFrame({"id": np.arange(24, dtype=np.int64), "x": 0.0, "s": "a", "y": "a"})
    p = SplitParams(stratify=False, key=["id"])
    split = assign(frame, schema_for(frame), p, 42)
    h = hash_pandas_object(frame[["id"]], index=False, hash_key=hash_key(42)).to_numpy(dtype=np.uint64)
    u = h.astype(np.float64) / 2.0**64
    np.testing.assert_array_equal(split, np.where(u < 0.15, 2, np.where(u < 0.3, 1, 0)))
    assert split.tolist() == [2, 0, 2, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0]
