"""The train/val/test split: exact (stratified) fractions, stable under appended rows, groups, time order, errors;
the settings a saved assignment must match and the file it is saved in, the quotas worked out by hand, the keys
hashed, and every note and message in full."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pandas.util import hash_pandas_object
from support.splits import LABELS, random_frame, schema_for, splitmix64_by_hand

from trainflow.core.errors import DataError
from trainflow.core.paths import SPLITS
from trainflow.data import split as sp
from trainflow.data.schema import ROW_KEY, Schema
from trainflow.data.split import Assignment, assign, split_frame
from trainflow.params import SplitParams, parse_override

PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def fractions(p: SplitParams) -> np.ndarray:
    return np.array([1 - p.val_fraction - p.test_fraction, p.val_fraction, p.test_fraction])


def deviation(split: np.ndarray, p: SplitParams) -> float:
    """The largest |rows in a split - rows * fraction| over the three splits."""
    return float(np.abs(np.bincount(split, minlength=3) - len(split) * fractions(p)).max())


def worst_class_deviation(frame: pd.DataFrame, split: np.ndarray, p: SplitParams) -> float:
    return max(deviation(split[rows], p) for rows in frame.groupby("y").indices.values())


# --- exact fractions -------------------------------------------------------------------------------------------------


def rare_class_table(rng: np.random.Generator) -> tuple[pd.DataFrame, SplitParams]:
    """20-3,000 rows over 2-12 classes of very unequal sizes (many with a handful of rows, some with one)."""
    n = int(rng.integers(20, 3000))
    k = int(rng.integers(2, 13))
    y = rng.choice(k, size=n, p=rng.dirichlet(np.full(k, 0.4)))
    frame = pd.DataFrame({"id": np.arange(n), "x": rng.normal(size=n), "y": [f"class{v}" for v in y]})
    p = SplitParams(val_fraction=float(rng.choice([0.1, 0.15, 0.2])), test_fraction=float(rng.choice([0.1, 0.15, 0.3])))
    return frame, p


def test_200_tables_with_rare_classes_never_raise_and_each_class_is_split_within_one_row() -> None:
    rng = np.random.default_rng(0)
    rare = 0
    for seed in range(200):
        frame, p = rare_class_table(rng)
        result = assign(frame, schema_for(frame, ["x"]), p.model_copy(update={"seed": seed}))
        sizes = frame["y"].value_counts()
        rare += int((sizes < 7).sum())
        # Every class: each split's rows within one row of the class's rows times the fraction ...
        assert worst_class_deviation(frame, result.split, p) < 1, seed
        # ... so is every split's total, and every class trains on at least one row.
        assert deviation(result.split, p) < 1 and result.exact, seed
        in_train = frame.loc[result.split == 0, "y"].unique()
        assert set(in_train) == set(sizes.index), seed
    assert rare > 100  # the tables did have rare classes (164 of under 7 rows)


@pytest.mark.parametrize("stratify", [True, False])
def test_fractions_on_20k_rows(stratify: bool) -> None:
    frame = random_frame(20_000, n_classes=3)
    p = SplitParams(val_fraction=0.1, test_fraction=0.2, stratify=stratify, seed=42)
    split = assign(frame, schema_for(frame), p).split
    assert split.dtype == np.int8
    assert deviation(split, p) < 1
    # Stratified: each class within one row too. Unstratified: within sampling noise (a few dozen rows), which is
    # why stratification exists.
    worst = worst_class_deviation(frame, split, p)
    assert worst < 1 if stratify else 1 < worst < 0.02 * len(frame)


@pytest.mark.parametrize("n", [20, 57, 100, 157, 244, 333, 500])
@pytest.mark.parametrize("task", ["classification", "regression"])
def test_small_tables_get_their_test_fraction_within_one_row(n: int, task: str) -> None:
    frame = random_frame(n, n_classes=3, seed=n)
    if task == "regression":
        frame["y"] = np.random.default_rng(n).normal(size=n)  # e.g. tips (244 rows): 10.7% test before, not 15%
    p = SplitParams(seed=7)
    split = assign(frame, schema_for(frame, task=task), p).split
    assert abs(int((split == 2).sum()) - 0.15 * n) < 1
    assert deviation(split, p) < 1


# --- stable under appends --------------------------------------------------------------------------------------------

# A row of the processed table: a numeric feature (NaN = missing), a string feature (None = missing), a label.
ROW = st.tuples(
    st.floats(allow_nan=True, allow_infinity=False, width=64),
    st.none() | st.text(max_size=6),
    st.integers(0, 3),
)


@st.composite
def base_and_appended(draw: st.DrawFn) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A table of 20-300 rows with a 2-4 class target (rare classes included), and the same table with ~10% new rows
    appended."""
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
@pytest.mark.parametrize("stratify", [True, False], ids=["stratified", "plain"])
@PROPERTY
@given(frames=base_and_appended(), seed=st.integers(0, 2**32))
def test_appending_rows_never_moves_an_existing_row(
    frames: tuple[pd.DataFrame, pd.DataFrame], seed: int, key: list[str] | None, stratify: bool
) -> None:
    base, extended = frames
    # 200 distinct rows first so that no split is ever empty, however repetitive the drawn rows.
    filler = random_frame(200, seed=9).assign(id=lambda f: f["id"] - 1000)
    base, extended = (pd.concat([filler, f], ignore_index=True) for f in (base, extended))
    p = SplitParams(stratify=stratify, key=key, val_fraction=0.2, test_fraction=0.2, seed=seed)
    before = assign(base, schema_for(base), p)
    after = assign(extended, schema_for(extended), p, previous=before.assignment)
    np.testing.assert_array_equal(after.split[: len(base)], before.split)
    # Kept: the old rows, and new rows that duplicate an old one (same key, so the same split).
    assert after.kept == len(base) if key is not None else after.kept >= len(base)
    if key is not None:  # distinct keys: the new rows keep every class (or the table) within one row
        assert deviation(after.split, p) < 1.5  # totals: exact unless the classes' roundings forbid it
        assert (worst_class_deviation(extended, after.split, p) if stratify else deviation(after.split, p)) < 1


def test_the_saved_assignment_is_kept_only_under_the_same_settings(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    from pathlib import Path

    frame = random_frame(1000)
    first = assign(frame, schema_for(frame), SplitParams(seed=3))
    assert first.assignment is not None
    path = Path(str(tmp_path)) / "assignment.parquet"
    first.assignment.save(path)
    saved = Assignment.load(path)
    assert saved is not None and saved.settings == first.assignment.settings
    np.testing.assert_array_equal(saved.lookup(first.assignment.keys), first.assignment.split)
    # A different seed (or fractions, stratification, key columns) is a different split: everything afresh.
    again = assign(frame, schema_for(frame), SplitParams(seed=4), previous=saved)
    assert again.kept == 0 and "other settings (seed)" in capsys.readouterr().err
    assert (again.split != first.split).mean() > 0.2
    # An unreadable file is not an error: the rows are assigned afresh, with a note.
    path.write_bytes(b"not parquet")
    assert Assignment.load(path) is None
    assert "cannot read" in capsys.readouterr().err


# --- what a split depends on -----------------------------------------------------------------------------------------


def test_a_rows_split_depends_on_its_key_not_the_row_order() -> None:
    frame = random_frame(2000)
    schema = schema_for(frame)
    split = assign(frame, schema, SplitParams(seed=7)).split
    order = np.random.default_rng(1).permutation(len(frame))
    shuffled = frame.iloc[order].reset_index(drop=True)
    np.testing.assert_array_equal(assign(shuffled, schema, SplitParams(seed=7)).split, split[order])
    # Duplicate rows share a split.
    doubled = pd.concat([frame, frame], ignore_index=True)
    both = assign(doubled, schema, SplitParams(seed=7)).split
    np.testing.assert_array_equal(both[: len(frame)], both[len(frame) :])


def test_the_seed_changes_the_assignment() -> None:
    frame = random_frame(2000)
    schema = schema_for(frame)
    a, b = (assign(frame, schema, SplitParams(seed=seed)).split for seed in (0, 1))
    assert (a != b).mean() > 0.2
    np.testing.assert_array_equal(a, assign(frame, schema, SplitParams(seed=0)).split)


def test_the_assignment_is_the_documented_rule() -> None:
    """Unstratified, 24 distinct ids, fractions .7/.15/.15: 16.8, 3.6, 3.6 rounds to 17, 4, 3 (largest fractional
    parts first, val before test on a tie); the 3 smallest seeded hashes are test, the next 4 val, the rest train."""
    frame = pd.DataFrame({"id": np.arange(24, dtype=np.int64), "x": 0.0, "s": "a", "y": "a"})
    split = assign(frame, schema_for(frame), SplitParams(stratify=False, key=["id"], seed=42)).split
    as_text = frame[["id"]].astype("string")  # key columns are hashed as text: 3, 3.0 and "3" are one id
    h = [splitmix64_by_hand(int(k), 42) for k in hash_pandas_object(as_text, index=False)]
    rank = np.argsort(np.argsort(np.array(h, dtype=np.uint64)))
    np.testing.assert_array_equal(split, np.where(rank < 3, 2, np.where(rank < 7, 1, 0)))


def test_the_seed_changes_the_split_of_the_raw_row_key_and_each_stays_exact_and_stable() -> None:
    """Ingest's raw-row key is a number, and pandas mixes its hash_key into strings only: seeds 42, 7 and 123 gave one
    byte-identical assignment (issue 30). Each seed now gives its own, each exact and kept under appended rows."""
    from trainflow.data.schema import ROW_KEY

    frame = random_frame(1200).assign(**{ROW_KEY: np.arange(1200, dtype=np.uint64) * 2654435761})
    base = frame.iloc[:1000]
    splits = {}
    for seed in (42, 7, 123):
        p = SplitParams(val_fraction=0.2, test_fraction=0.2, seed=seed)
        before = assign(base, schema_for(base), p)
        assert worst_class_deviation(base, before.split, p) < 1
        after = assign(frame, schema_for(frame), p, previous=before.assignment)
        np.testing.assert_array_equal(after.split[:1000], before.split)  # appends move no row
        assert after.kept == 1000 and deviation(after.split, p) < 1.5
        splits[seed] = before.split
    assert (splits[42] != splits[7]).mean() > 0.3 and (splits[7] != splits[123]).mean() > 0.3
    # Which rows are test follows the documented rule: the seeded hash of the key, smallest first within a class.
    keys = [splitmix64_by_hand(int(k), 7) for k in hash_pandas_object(base[[ROW_KEY]], index=False)]
    order = np.argsort(np.array(keys, dtype=np.uint64))
    for label in LABELS[:3]:
        rows = [i for i in order if base["y"].iloc[i] == label]
        n_test = int((splits[7][rows] == 2).sum())
        assert (splits[7][rows[:n_test]] == 2).all()


def test_an_assignment_saved_by_the_seedless_format_is_redone_with_a_note(capsys: pytest.CaptureFixture[str]) -> None:
    frame = random_frame(300)
    first = assign(frame, schema_for(frame), SplitParams(seed=1))
    assert first.assignment is not None
    old = Assignment(first.assignment.keys, first.assignment.split, {**first.assignment.settings, "format": 1})
    again = assign(frame, schema_for(frame), SplitParams(seed=1), previous=old)
    assert again.kept == 0 and "made by an older trainflow" in capsys.readouterr().err


def test_split_frame_keeps_table_order_and_resets_the_index() -> None:
    frame = random_frame(500)
    frame.index = frame.index * 10 + 3
    parts, _ = split_frame(frame, schema_for(frame), SplitParams(seed=0))
    assert list(parts) == list(SPLITS)
    assert sum(len(part) for part in parts.values()) == len(frame)
    for part in parts.values():
        assert part.index.equals(pd.RangeIndex(len(part)))
        assert part["id"].is_monotonic_increasing
        assert list(part.columns) == list(frame.columns)
    assert sorted(pd.concat(parts.values())["id"]) == list(frame["id"])


def test_a_class_too_small_for_every_split_trains_with_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    frame = random_frame(300, n_classes=2)
    frame.loc[17, "y"] = "rare"
    frame.loc[[40, 41], "y"] = "pair"
    split = assign(frame, schema_for(frame), SplitParams(seed=0)).split
    assert split[17] == 0 and 0 in split[[40, 41]]
    err = capsys.readouterr().err
    assert "'rare' (1 row)" in err and "'pair' (2 rows)" in err and "too few rows for val and test" in err
    assert "'a'" not in err


def test_regression_splits_the_whole_table_exactly() -> None:
    frame = random_frame(301)
    frame["y"] = np.random.default_rng(0).normal(size=len(frame))
    p = SplitParams(stratify=True, seed=0)
    split = assign(frame, schema_for(frame, task="regression"), p).split
    assert deviation(split, p) < 1


# --- groups and time -------------------------------------------------------------------------------------------------


def test_group_by_keeps_every_group_in_one_split() -> None:
    frame = random_frame(20_000)
    frame["user"] = np.random.default_rng(3).integers(0, 400, size=len(frame))
    p = SplitParams(group_by="user", stratify=False, seed=42)
    split = assign(frame, schema_for(frame, ["x", "s"]), p).split
    per_group = pd.Series(split).groupby(frame["user"].to_numpy()).nunique()
    assert (per_group == 1).all()
    # Rows, not groups, are split in the given proportions, as closely as whole groups allow (~50 rows each).
    largest = frame["user"].value_counts().max()
    assert deviation(split, p) <= largest


def test_time_column_tests_on_the_newest_rows() -> None:
    frame = random_frame(1000)
    days = pd.date_range("2024-01-01", periods=len(frame), freq="D")
    frame["when"] = days[np.random.default_rng(5).permutation(len(frame))]
    split = assign(frame, schema_for(frame, ["x", "s"]), SplitParams(time_column="when", seed=0)).split
    assert np.bincount(split).tolist() == [700, 150, 150]
    when = frame["when"].to_numpy()
    assert when[split == 0].max() < when[split == 1].min()
    assert when[split == 1].max() < when[split == 2].min()
    assert when[split == 2].max() == when.max()


@pytest.mark.parametrize("seed", range(5))
def test_equal_timestamps_never_straddle_a_boundary(seed: int) -> None:
    frame = random_frame(1000, seed=seed)
    rng = np.random.default_rng(seed)
    frame["when"] = pd.Timestamp("2024-01-01") + pd.to_timedelta(rng.integers(0, 60, size=len(frame)), unit="D")
    split = assign(frame, schema_for(frame, ["x", "s"]), SplitParams(time_column="when", seed=0)).split
    when = frame["when"].to_numpy()
    assert when[split == 0].max() < when[split == 1].min()  # strictly: no day on both sides
    assert when[split == 1].max() < when[split == 2].min()
    # The boundaries moved by less than the largest run of equal timestamps.
    largest = frame["when"].value_counts().max()
    assert deviation(split, SplitParams()) <= largest / 2 + 1


def test_time_column_with_missing_timestamps_says_how_many() -> None:
    frame = random_frame(100)
    frame["when"] = pd.date_range("2024-01-01", periods=100, freq="h")
    frame.loc[[3, 50, 77], "when"] = pd.NaT
    with pytest.raises(DataError, match=r"3 of 100 rows have no timestamp in column 'when'"):
        assign(frame, schema_for(frame, ["x", "s"]), SplitParams(time_column="when", seed=0))


# --- errors ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "column"),
    [({"key": ["id", "nope"]}, "nope"), ({"group_by": "user"}, "user"), ({"time_column": "ts"}, "ts")],
)
def test_unknown_columns_are_named_with_the_available_ones(params: dict[str, object], column: str) -> None:
    """An earlier data set's -S (kept in params.yaml) meets a table without its column: the message names the -S
    that resets it, and following it splits the table."""
    frame = random_frame(100)
    with pytest.raises(DataError, match=rf"column '{column}' is not in the processed table \(for this data: -S ") as e:
        assign(frame, schema_for(frame), SplitParams(**params, seed=0))  # type: ignore[arg-type]
    assert str(e.value).endswith("available columns: id, x, s, y")
    override = re.search(r"-S '([^']+)'", str(e.value))
    assert override is not None
    keys, value = parse_override(override.group(1))
    followed = SplitParams(**{**params, keys[-1]: value, "seed": 0})  # type: ignore[arg-type]
    assert len(assign(frame, schema_for(frame), followed).split) == len(frame)


def test_an_empty_split_is_named() -> None:
    frame = pd.concat([random_frame(1)] * 5, ignore_index=True)  # 5 equal rows share one split
    with pytest.raises(
        DataError, match=r"split: the (val|test) split is empty \(5 rows, .* fraction 0\.15\); add rows"
    ):
        assign(frame, schema_for(frame), SplitParams(stratify=False, seed=0))
    frame["user"] = [1, 1, 2, 2, 2]
    with pytest.raises(DataError, match=r"is empty \(5 rows in 2 groups of split.group_by 'user', .*add groups or"):
        assign(frame, schema_for(frame, ["x", "s"]), SplitParams(stratify=False, group_by="user", seed=0))
    frame["when"] = pd.Timestamp("2024-01-01")
    with pytest.raises(DataError, match=r"1 distinct timestamps.*add rows with other timestamps"):
        assign(frame, schema_for(frame, ["x", "s"]), SplitParams(time_column="when", seed=0))


# --- the parts, directly -----------------------------------------------------------------------------------------


def test_lookup_finds_saved_keys_and_only_those() -> None:
    saved = Assignment(np.array([10, 20, 30], dtype=np.uint64), np.array([0, 1, 2], dtype=np.int8), {})
    queries = np.array([5, 10, 15, 20, 30, 35, 2**64 - 1], dtype=np.uint64)  # below, between, on and above them
    assert saved.lookup(queries).tolist() == [-1, 0, -1, 1, 2, -1, -1]
    empty = Assignment(np.array([], dtype=np.uint64), np.array([], dtype=np.int8), {})
    assert empty.lookup(queries).tolist() == [-1] * 7


def test_groups_are_stratified_by_their_most_frequent_label() -> None:
    from trainflow.data.split import _strata

    frame = pd.DataFrame({"y": ["b", "a", "a", "b", "b", "c", "a", "b"]})
    unit_of_row = np.array([0, 0, 0, 1, 1, 1, 2, 2])  # unit 0: a a b -> a; 1: b b c -> b; 2: a b (a tie) -> a
    stratum, labels = _strata(frame, schema_for(frame.assign(x=0.0), ["x"]), "y", unit_of_row, 3)
    assert list(labels) == ["a", "b", "c"] and [labels[s] for s in stratum] == ["a", "b", "a"]


def test_stratified_groups_split_each_majority_class_by_its_fractions() -> None:
    rng = np.random.default_rng(0)
    groups = 300
    majority = rng.choice(["a", "b", "c"], size=groups, p=[0.6, 0.3, 0.1])
    rows = []
    for g, label in enumerate(majority):  # three rows per group: two of its class, one of another
        other = "b" if label != "b" else "a"
        rows += [(g, label, rng.normal()), (g, label, rng.normal()), (g, other, rng.normal())]
    frame = pd.DataFrame(rows, columns=["user", "y", "x"])
    p = SplitParams(group_by="user", seed=5)
    split = assign(frame, schema_for(frame, ["x"]), p).split
    group_split = pd.Series(split).groupby(frame["user"].to_numpy()).first().to_numpy()
    for label in ("a", "b", "c"):
        in_class = group_split[majority == label]
        counts = np.bincount(in_class, minlength=3)
        assert np.abs(counts - len(in_class) * fractions(p)).max() < 1, label  # groups of equal size: exact


def test_quotas_round_by_largest_fractional_part() -> None:
    """10 rows at .71/.12/.17: 7.1, 1.2, 1.7 -> 7, 1, 2 (test has the largest part; train first would give 8, 1, 1)."""
    frame = pd.DataFrame({"id": np.arange(10), "x": 0.0, "y": "a"})
    p = SplitParams(val_fraction=0.12, test_fraction=0.17, stratify=False, key=["id"], seed=0)
    assert np.bincount(assign(frame, schema_for(frame), p).split, minlength=3).tolist() == [7, 1, 2]


def test_quotas_keep_what_was_kept_even_beyond_the_fractions() -> None:
    """A saved history that is not a split of these fractions (say, edited by hand): kept rows stay, new rows go to
    the splits furthest below their ideal counts, and no rounding of the totals is reachable."""
    from trainflow.data.split import fraction_parts, quotas

    p = SplitParams()  # .7 / .15 / .15
    sizes = np.array([20, 10])
    kept = np.array([[2, 1, 9], [7, 1, 1]])  # class 0: 9 of 12 kept rows in test, far beyond 15% of 20
    quota, exact = quotas(sizes, kept, fraction_parts(p))
    assert (quota >= kept).all() and quota.sum(axis=1).tolist() == [20, 10]
    assert quota[0].tolist() == [10, 1, 9]  # 8 new rows, all to train: the split furthest below its ideal 14
    assert quota[1].tolist() == [7, 2, 1]  # within one row of 7, 1.5, 1.5
    assert not exact  # the totals (17, 3, 10) are far from 21, 4.5, 4.5: no rounding reachable


def test_split_frame_keeps_the_saved_assignment() -> None:
    frame = random_frame(300)
    _, first = split_frame(frame, schema_for(frame), SplitParams(seed=1))
    grown = pd.concat([frame, random_frame(30, seed=4).assign(id=lambda f: f["id"] + 1000)], ignore_index=True)
    parts, again = split_frame(grown, schema_for(grown), SplitParams(seed=1), previous=first.assignment)
    assert again.kept == 300
    before = {name: set(frame.loc[first.split == i, "id"]) for i, name in enumerate(SPLITS)}
    assert all(before[name] <= set(parts[name]["id"]) for name in SPLITS)


def test_a_schema_column_missing_from_the_table_is_named() -> None:
    frame = random_frame(50)
    with pytest.raises(DataError, match=r"schema's column\(s\) 'gone' are not in the processed table \(available: id"):
        assign(frame, schema_for(frame, ["x", "gone"]), SplitParams(seed=0))


def test_an_empty_train_split_says_to_lower_the_held_out_fractions() -> None:
    frame = pd.concat([random_frame(1)] * 6, ignore_index=True)  # one key: it goes to the largest split
    with pytest.raises(DataError, match=r"the train split is empty .*lower split.val_fraction / split.test_fraction"):
        assign(frame, schema_for(frame), SplitParams(val_fraction=0.45, test_fraction=0.44, stratify=False, seed=0))


def test_an_id_splits_the_same_typed_or_as_read() -> None:
    """split.key on an id column: the same split whether ingest typed it (a feature: float64) or carried it as read
    (excluded: int64, or text)."""
    frame = random_frame(400)
    p = SplitParams(key=["id"], seed=3)
    split = assign(frame, schema_for(frame), p).split
    for typed in (frame["id"].astype(np.float64), frame["id"].astype(str)):
        np.testing.assert_array_equal(assign(frame.assign(id=typed), schema_for(frame), p).split, split)


def test_the_raw_row_key_decides_and_stays_out_of_the_split_files() -> None:
    """With ingest's raw-row key, the split depends on nothing else: any change of the other columns (a feature
    dropped, a column retyped) leaves every row where it was."""
    from trainflow.data.schema import ROW_KEY

    frame = random_frame(500).assign(**{ROW_KEY: np.arange(500, dtype=np.uint64) * 7919})
    parts, first = split_frame(frame, schema_for(frame), SplitParams(seed=5))
    assert all(ROW_KEY not in part.columns for part in parts.values())
    changed = frame.drop(columns=["s"]).assign(x=frame["x"].astype(str))
    _, again = split_frame(changed, schema_for(changed, ["x"]), SplitParams(seed=5), previous=first.assignment)
    np.testing.assert_array_equal(again.split, first.split)
    assert again.kept == 500


def test_the_note_on_small_classes_names_those_missing_from_val_or_test_and_no_other() -> None:
    """Counted by hand: 'a' is in all three splits, 'b' has no test row, 'c' no val row, 'd' one row of each."""
    from trainflow.data.split import _small_class_notes

    target = ["a"] * 5 + ["b"] * 3 + ["c"] * 3 + ["d"] * 3
    split = np.array([0, 0, 0, 1, 2] + [0, 0, 1] + [0, 0, 2] + [0, 1, 2])
    frame = pd.DataFrame({"y": target})
    schema = schema_for(frame)
    (note,) = _small_class_notes(pd.Index(["a", "b", "c", "d"]), split, frame, schema)
    assert "missing from val or test (no metric covers them there): 'b' (3 rows), 'c' (3 rows); add rows" in note
    assert (
        _small_class_notes(
            pd.Index(["a", "d"]), split[[0, 1, 2, 3, 4, 11, 12, 13]], frame.iloc[[0, 1, 2, 3, 4, 11, 12, 13]], schema
        )
        == []
    )


def test_each_row_knows_the_generation_it_arrived_in(tmp_path: Path) -> None:
    """The gate's new-rows slice: a key's generation is the assignment that first placed it. A rerun without new rows
    is no new generation; new settings (every row assigned afresh) are; an assignment saved without generations reads
    as generation 0."""
    p = SplitParams(key=["id"], val_fraction=0.2, test_fraction=0.2, seed=0)
    first = random_frame(300)
    one = assign(first, schema_for(first), p)
    assert one.assignment is not None and one.assignment.generation == 1 and set(one.since.tolist()) == {1}
    one.assignment.save(tmp_path / "a.parquet")
    saved = Assignment.load(tmp_path / "a.parquet")
    assert saved is not None and saved.generation == 1

    grown = pd.concat([first, random_frame(30, seed=1).assign(id=lambda f: f["id"] + 300)], ignore_index=True)
    two = assign(grown, schema_for(grown), p, previous=saved)
    assert two.assignment is not None and two.assignment.generation == 2
    np.testing.assert_array_equal(two.since, np.where(grown["id"] >= 300, 2, 1))  # by id: the appended rows are new
    same = assign(grown, schema_for(grown), p, previous=two.assignment)
    assert same.assignment is not None and same.assignment.generation == 2
    np.testing.assert_array_equal(same.since, two.since)
    another = p.model_copy(update={"seed": 1})
    afresh = assign(grown, schema_for(grown), another, previous=two.assignment)  # another seed: assigned afresh
    assert afresh.assignment is not None and afresh.assignment.generation == 3 and set(afresh.since.tolist()) == {3}

    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "a.parquet").drop(["since"])  # as saved before generations
    pq.write_table(table.replace_schema_metadata({b"trainflow": table.schema.metadata[b"trainflow"]}), tmp_path / "o")
    old = Assignment.load(tmp_path / "o")
    assert old is not None and old.generation == 0 and not old.since.any()
    after_old = assign(grown, schema_for(grown), p, previous=old)
    np.testing.assert_array_equal(after_old.since, np.where(grown["id"] >= 300, 1, 0))


# --- split: settings, the saved assignment, notes ------------------------------------------------------------------


def split_schema(features: list[str], task: str = "classification") -> Schema:
    return Schema(
        source="test",
        target="y",
        task=task,  # type: ignore[arg-type]
        features=features,
        kinds=dict.fromkeys(features, "numeric"),
        classes=["a", "b"] if task == "classification" else [],
        n_rows=0,
    )


def ids(n: int, labels: str = "ab") -> pd.DataFrame:
    return pd.DataFrame({"id": np.arange(n), "x": np.arange(n) * 0.5, "y": [labels[i % len(labels)] for i in range(n)]})


def test_the_settings_a_saved_assignment_must_match_are_complete_for_each_keying() -> None:
    frame = ids(10).assign(user=np.arange(10) // 2)
    s = split_schema(["x"])
    base = {"format": 2, "seed": 7, "val_fraction": 0.15, "test_fraction": 0.15, "stratify_by": "y"}
    assert sp.settings(frame, s, SplitParams(group_by="user", key=["id"], seed=7)) == {
        **base,
        "mode": "group_by",
        "columns": ["user"],
    }
    assert sp.settings(frame, s, SplitParams(key=["id", "x"], seed=7)) == {
        **base,
        "mode": "key",
        "columns": ["id", "x"],
    }
    assert sp.settings(frame, s, SplitParams(seed=7)) == {**base, "mode": "row", "columns": ["x", "y"]}
    keyed = frame.assign(**{ROW_KEY: np.arange(10, dtype=np.uint64)})
    assert sp.settings(keyed, s, SplitParams(val_fraction=0.2, test_fraction=0.1, seed=7)) == {
        **base,
        "val_fraction": 0.2,
        "test_fraction": 0.1,
        "mode": "row",
        "columns": [ROW_KEY],
    }
    assert sp.settings(frame, s, SplitParams(stratify=False, seed=7))["stratify_by"] is None
    texts = Schema("t", "y", "classification", ["x"], {"x": "numeric", "note": "text"}, ["a", "b"], 10, "note")
    assert sp.settings(frame.assign(note="hi"), texts, SplitParams(seed=7))["columns"] == ["x", "note", "y"]
    assert sp.settings(frame, split_schema(["x"], "regression"), SplitParams(seed=7))["stratify_by"] is None


def test_a_fresh_split_reports_its_generation_kept_rows_and_exactness() -> None:
    frame = ids(20)
    result = sp.assign(frame, split_schema(["x"]), SplitParams(key=["id"], seed=3))
    assert (result.kept, result.exact, result.notes) == (0, True, [])
    assert result.since is not None and result.since.tolist() == [1] * 20 and result.since.dtype == np.int32
    a = result.assignment
    assert a is not None and a.generation == 1 and len(a.keys) == 20 and a.keys.dtype == np.uint64
    assert (np.diff(a.keys.astype(np.float64)) > 0).all()  # sorted and unique
    assert np.bincount(result.split, minlength=3).tolist() == [14, 3, 3]
    # 10 rows of each class at .7/.15/.15: 7, 1.5, 1.5 each; the totals 14, 3, 3 need one class to give val the
    # rounding up and the other test.
    for label in "ab":
        assert sorted(np.bincount(result.split[frame["y"] == label], minlength=3).tolist()) == [1, 2, 7]


def test_the_saved_assignment_file_holds_typed_columns_and_its_settings_as_metadata(tmp_path: Path) -> None:
    settings = {"seed": 1, "mode": "key", "columns": ["id"], "format": 2}
    a = sp.Assignment(
        np.array([3, 9], dtype=np.uint64), np.array([2, 0], dtype=np.int8), settings, np.array([1, 2], np.int32), 2
    )
    a.save(tmp_path / "a.parquet")
    table = pq.read_table(tmp_path / "a.parquet")
    assert table.schema.metadata == {
        b"trainflow": b'{"columns": ["id"], "format": 2, "mode": "key", "seed": 1}',
        b"generation": b"2",
    }
    assert [(f.name, str(f.type)) for f in table.schema] == [("key", "uint64"), ("split", "int8"), ("since", "int32")]
    assert table.to_pydict() == {"key": [3, 9], "split": [2, 0], "since": [1, 2]}
    back = sp.Assignment.load(tmp_path / "a.parquet")
    assert back is not None and back.settings == settings and back.generation == 2
    assert back.keys.tolist() == [3, 9] and back.split.tolist() == [2, 0] and back.since.tolist() == [1, 2]
    assert back.generation_of(np.array([9, 4, 3], dtype=np.uint64)).tolist() == [2, -1, 1]
    assert sp.Assignment.load(tmp_path / "none.parquet") is None


def test_an_unreadable_assignment_is_named_with_its_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "a.parquet"
    path.write_bytes(b"not parquet")
    try:
        pq.ParquetFile(path)  # the reader Assignment.load opens it with, a column at a time
    except Exception as exc:  # noqa: BLE001 - the reader's own words, for the expected message
        why = f"{type(exc).__name__}: {exc}"
    assert sp.Assignment.load(path) is None
    assert capsys.readouterr().err == f"split: cannot read {path} ({why}); assigning every row afresh\n"
    pq.write_table(pa.table({"key": pa.array([1], pa.uint64())}), path)  # no settings in its metadata
    assert sp.Assignment.load(path) is None
    assert (
        capsys.readouterr().err == f"split: cannot read {path} (KeyError: b'trainflow'); assigning every row afresh\n"
    )


def test_other_settings_or_an_older_format_reassign_every_row_with_one_note(capsys: pytest.CaptureFixture[str]) -> None:
    frame = ids(20)
    s = split_schema(["x"])
    first = sp.assign(frame, s, SplitParams(key=["id"], seed=3))
    assert first.assignment is not None
    capsys.readouterr()
    again = sp.assign(frame, s, SplitParams(key=["id"], val_fraction=0.2, seed=4), previous=first.assignment)
    note = "split: the saved assignment was made with other settings (seed, val_fraction); every row is assigned afresh"
    assert again.notes == [note] and again.kept == 0
    assert again.assignment is not None and again.assignment.generation == 2
    assert capsys.readouterr().err == note + "\n"
    old = sp.Assignment(first.assignment.keys, first.assignment.split, {**first.assignment.settings, "format": 1})
    older = sp.assign(frame, s, SplitParams(key=["id"], seed=3), previous=old)
    assert older.notes == [
        "split: the saved assignment was made by an older trainflow, whose row keys did not depend on the seed; every "
        "row is assigned afresh"
    ]
    np.testing.assert_array_equal(older.split, first.split)  # afresh, with the same settings: the same split
    same = sp.assign(frame, s, SplitParams(key=["id"], seed=3), previous=first.assignment)
    assert same.notes == [] and same.kept == 20 and same.assignment is not None and same.assignment.generation == 1


def test_the_small_class_note_lists_ten_classes_and_counts_the_rest(capsys: pytest.CaptureFixture[str]) -> None:
    labels = [f"r{i:02d}" for i in range(12)]
    frame = pd.DataFrame({"id": np.arange(112), "x": 0.0, "y": ["big"] * 100 + labels})
    s = Schema("t", "y", "classification", ["x"], {"x": "numeric"}, sorted({*labels, "big"}), 112)
    result = sp.assign(frame, s, SplitParams(key=["id"], seed=0))
    listed = ", ".join(f"'{label}' (1 row)" for label in labels[:10])
    note = (
        "split: too few rows for val and test, so these classes are in train but missing from val or test (no metric "
        f"covers them there): {listed} and 2 more; add rows of them, or merge rare classes"
    )
    assert result.notes == [note] and capsys.readouterr().err == note + "\n"
    assert (result.split[100:] == 0).all()


# --- split: errors ---------------------------------------------------------------------------------------------------


def test_every_empty_split_message_names_the_split_its_fraction_and_the_fix() -> None:
    five = pd.DataFrame({"x": [1.0] * 5, "y": ["a"] * 5, "user": [1, 1, 2, 2, 2]})
    s = split_schema(["x"])
    with pytest.raises(DataError) as exc:
        sp.assign(five, s, SplitParams(stratify=False, seed=0))
    assert (
        str(exc.value)
        == "split: the val split is empty (5 rows, val fraction 0.15); add rows or raise split.val_fraction"
    )
    with pytest.raises(DataError) as exc:
        sp.assign(five, s, SplitParams(stratify=False, group_by="user", seed=0))
    assert str(exc.value) in {
        f"split: the {name} split is empty (5 rows in 2 groups of split.group_by 'user', {name} fraction 0.15); add "
        f"groups or raise split.{name}_fraction"
        for name in ("val", "test")
    }
    timed = five.assign(when=pd.Timestamp("2024-01-01"))
    with pytest.raises(DataError) as exc:
        sp.assign(timed, s, SplitParams(time_column="when", group_by="user", seed=0))
    assert str(exc.value) == (
        "split: the val split is empty (5 rows, 1 distinct timestamps, val fraction 0.15); add rows with other "
        "timestamps or raise split.val_fraction"
    )
    with pytest.raises(DataError) as exc:
        six = pd.concat([five.iloc[:1]] * 6, ignore_index=True)  # one key: its six rows land where their middle falls
        sp.assign(six, s, SplitParams(val_fraction=0.45, test_fraction=0.44, stratify=False, seed=0))
    assert str(exc.value) == (
        "split: the train split is empty (6 rows, train fraction 0.11); add rows or lower split.val_fraction / "
        "split.test_fraction"
    )


def test_column_errors_name_the_parameter_and_the_columns_there_are() -> None:
    frame = ids(10)
    s = split_schema(["x"])
    with pytest.raises(DataError) as exc:
        sp.assign(frame, s, SplitParams(key=[], seed=0))
    assert str(exc.value) == "split.key is an empty list: name the id column(s) to hash, or set it to null to hash rows"
    with pytest.raises(DataError) as exc:
        sp.assign(frame, s, SplitParams(group_by="user", seed=0))
    assert str(exc.value) == (
        "split.group_by: column 'user' is not in the processed table (for this data: -S 'split.group_by=null'); "
        "available columns: id, x, y"
    )
    with pytest.raises(DataError) as exc:
        sp.assign(frame, s, SplitParams(time_column="ts", key=["id"], seed=0))
    assert str(exc.value) == (
        "split.time_column: column 'ts' is not in the processed table (for this data: -S 'split.time_column=null'); "
        "available columns: id, x, y"
    )
    with pytest.raises(DataError) as exc:
        sp.assign(frame.drop(columns=["y"]), s, SplitParams(key=["id"], seed=0))
    assert str(exc.value) == (
        "split: the target column 'y' is not in the processed table (available: id, x); run `trainflow stage ingest` "
        "again"
    )
    with pytest.raises(DataError) as exc:
        sp.assign(frame.drop(columns=["x", "y"]), s, SplitParams(seed=0))
    assert str(exc.value) == (
        "split: the schema's column(s) 'x', 'y' are not in the processed table (available: id); run `trainflow stage "
        "ingest` again"
    )
    timed = frame.assign(when=pd.to_datetime(["2024-01-01"] * 9 + [None]))
    with pytest.raises(DataError) as exc:
        sp.assign(timed, s, SplitParams(time_column="when", seed=0))
    assert str(exc.value) == (
        "split.time_column: 1 of 10 rows have no timestamp in column 'when'; fill or drop them (data.missing: drop) "
        "or split without split.time_column"
    )


# --- split: time order, by hand --------------------------------------------------------------------------------------


def test_a_time_split_of_twenty_rows_is_the_hand_counted_one() -> None:
    """20 rows, .7/.15/.15: test from position 20 - 3 = 17, val from 17 - 3 = 14. Days 0..19 shuffled; rows carry
    no assignment."""
    days = np.random.default_rng(0).permutation(20)
    frame = ids(20).assign(when=pd.Timestamp("2024-01-01") + pd.to_timedelta(days, unit="D"))
    result = sp.assign(frame, split_schema(["x"]), SplitParams(time_column="when", seed=0))
    assert result.assignment is None and result.kept == 0 and result.exact and result.since is None
    np.testing.assert_array_equal(result.split, np.where(days >= 17, 2, np.where(days >= 14, 1, 0)))
    parts, _ = sp.split_frame(frame, split_schema(["x"]), SplitParams(time_column="when", seed=0))
    assert [len(p) for p in parts.values()] == [14, 3, 3]


@pytest.mark.parametrize(
    ("values", "cut", "moved"),
    [
        ([1, 2, 2, 2, 3], 2, 1),  # inside a run of 3 starting at 1: one back to its start
        ([1, 2, 2, 2, 3], 3, 4),  # two from the start, one from the end: to the end
        ([1, 2, 2, 3], 2, 1),  # equally near both ends: to the older side (the start)
        ([1, 2, 2, 3], 1, 1),  # at a run's start already
        ([1, 2, 2, 3], 3, 3),  # at a run's end already
        ([2, 2, 2], 0, 0),
        ([2, 2, 2], 3, 3),
        ([2, 2, 2, 2], 1, 0),
        ([2, 2, 2, 2], 3, 4),
    ],
)
def test_a_time_boundary_inside_equal_timestamps_moves_to_the_nearer_end(
    values: list[int], cut: int, moved: int
) -> None:
    assert sp._boundary(np.array(values), cut) == moved


def test_a_val_boundary_never_passes_the_test_boundary() -> None:
    """Ten rows, days 0 0 0 0 0 0 0 1 1 1 at .2/.2: test would start at 8, inside the run of day 1 (7..9): to 7;
    val at 6, inside the run of day 0 (0..6): to its end, 7, the same place: val is empty."""
    frame = ids(10).assign(when=pd.Timestamp("2024-01-01") + pd.to_timedelta([0] * 7 + [1] * 3, unit="D"))
    with pytest.raises(DataError) as exc:
        sp.assign(
            frame, split_schema(["x"]), SplitParams(time_column="when", val_fraction=0.2, test_fraction=0.2, seed=0)
        )
    assert str(exc.value) == (
        "split: the val split is empty (10 rows, 2 distinct timestamps, val fraction 0.2); add rows with other "
        "timestamps or raise split.val_fraction"
    )
    days = [0, 1, 2, 3, 4, 5, 6, 7, 7, 8]  # test at 8, inside 7 7 (7..8), equally near both ends: to 7; val at 6
    frame = frame.assign(when=pd.Timestamp("2024-01-01") + pd.to_timedelta(days, unit="D"))
    split = sp.assign(
        frame, split_schema(["x"]), SplitParams(time_column="when", val_fraction=0.2, test_fraction=0.2, seed=0)
    )
    assert split.split.tolist() == [0, 0, 0, 0, 0, 0, 1, 2, 2, 2]


# --- split: quotas, by hand ------------------------------------------------------------------------------------------


def test_fractions_are_integer_parts_per_billion() -> None:
    assert sp.fraction_parts(SplitParams()).tolist() == [700_000_000, 150_000_000, 150_000_000]
    assert sp.fraction_parts(SplitParams(val_fraction=0.123456789, test_fraction=0.1)).tolist() == [
        776_543_211,
        123_456_789,
        100_000_000,
    ]


def test_the_candidate_totals_are_the_roundings_largest_fractional_parts_first() -> None:
    w = sp.fraction_parts(SplitParams())
    # 24 rows: 16.8, 3.6, 3.6 -> floors 16, 3, 3 and two rows to place: train+val and train+test (.8+.6) before
    # val+test (.6+.6).
    assert [t.tolist() for t in sp._total_candidates(24, w)] == [[17, 4, 3], [17, 3, 4], [16, 4, 4]]
    assert [t.tolist() for t in sp._total_candidates(20, w)] == [[14, 3, 3]]  # exact: nothing to round
    # 10 rows: 7, 1.5, 1.5: one row to place; train (no fractional part) may not round up.
    assert [t.tolist() for t in sp._total_candidates(10, w)] == [[7, 2, 1], [7, 1, 2]]
    assert sp._choices(np.array([True, True, True]), 2, np.array([5, 9, 7])) == [(1, 2), (0, 1), (0, 2)]
    assert sp._choices(np.array([True, False, True]), 1, np.array([5, 9, 7])) == [(2,), (0,)]
    assert sp._choices(np.array([False, True, True]), 1, np.array([0, 3, 3])) == [(1,), (2,)]


def test_quotas_settle_each_class_and_the_totals_exactly() -> None:
    """Two classes of 10 rows at .7/.15/.15: each 7 / 1.5 / 1.5; the totals 14, 3, 3 need one class to round val up
    and the other test."""
    w = sp.fraction_parts(SplitParams())
    quota, exact = sp.quotas(np.array([10, 10]), np.zeros((2, 3), dtype=np.int64), w)
    assert exact and quota.tolist() == [[7, 2, 1], [7, 1, 2]]
    one, exact = sp.quotas(np.array([1, 3]), np.zeros((2, 3), dtype=np.int64), w)
    assert exact and one.tolist() == [[1, 0, 0], [2, 1, 0]]  # each class trains on one row at least; totals 3, 1, 0
    empty, exact = sp.quotas(np.array([0, 20]), np.zeros((2, 3), dtype=np.int64), w)
    assert exact and empty.tolist() == [[0, 0, 0], [14, 3, 3]]
    assert sp._settle(np.ones((1, 3), bool), np.array([1]), np.array([[0, 5, 5]]), np.array([0, 0, 2])) is None
    assert sp._settle(np.ones((1, 3), bool), np.array([1]), np.array([[0, 5, 5]]), np.array([0, -1, 2])) is None
    picks = sp._settle(np.ones((2, 3), bool), np.array([1, 1]), np.array([[0, 5, 4], [0, 5, 4]]), np.array([0, 1, 1]))
    assert picks is not None and picks.tolist() == [[0, 1, 0], [0, 0, 1]]


def test_new_units_fill_test_then_val_then_train_in_key_order() -> None:
    fixed = np.array([-1, -1, 0, -1, -1, -1], dtype=np.int8)
    stratum = np.array([0, 0, 0, 1, 1, 1])
    weight = np.array([1, 2, 1, 1, 1, 1])
    places = np.array([[0, 1, 1], [1, 1, 1]])
    # stratum 0: unit 0 (middle 0.5) < 1 test; unit 1 (rows 1..3, middle 2) -> train (val ends at 2); stratum 1 in
    # order: test, val, train.
    assert sp._fill(fixed, stratum, weight, places).tolist() == [2, 0, 0, 2, 1, 0]
    assert sp._fill(np.array([1, 2], np.int8), np.array([0, 0]), np.array([1, 1]), places).tolist() == [1, 2]
    one = sp._fill(np.array([-1, -1, -1], np.int8), np.zeros(3, np.int64), np.ones(3, np.int64), np.array([[1, -1, 1]]))
    assert one.tolist() == [2, 0, 0]  # a negative count of places is none


def test_duplicate_rows_count_as_rows_in_the_quotas_and_in_what_was_kept() -> None:
    """20 ids, each twice (40 rows), unstratified: quotas of 28, 6, 6 rows; each id's two rows go where their middle
    falls (1, 3, 5 for the first three ids in key order: test ends at 6), so 3 ids test, 3 val, 14 train."""
    frame = pd.concat([ids(20), ids(20)], ignore_index=True)
    p = SplitParams(key=["id"], stratify=False, seed=2)
    first = sp.assign(frame, split_schema(["x"]), p)
    assert np.bincount(first.split, minlength=3).tolist() == [28, 6, 6]
    np.testing.assert_array_equal(first.split[:20], first.split[20:])
    assert first.assignment is not None and len(first.assignment.keys) == 20
    again = sp.assign(frame, split_schema(["x"]), p, previous=first.assignment)
    assert again.kept == 40 and again.assignment is not None and again.assignment.generation == 1
    np.testing.assert_array_equal(again.split, first.split)


# --- split: keys -------------------------------------------------------------------------------------------------


def test_key_columns_are_hashed_as_text_with_whole_numbers_as_integers() -> None:
    from pandas.util import hash_pandas_object

    def by_hand(text: pd.DataFrame, seed: int) -> list[int]:
        return [splitmix64_by_hand(int(h), seed) for h in hash_pandas_object(text, index=False)]

    whole = pd.DataFrame({"k": [3.0, np.nan, 10.0], "g": ["a", "b", None]})
    text = pd.DataFrame(
        {"k": pd.Series(["3", None, "10"], dtype="string"), "g": pd.Series(["a", "b", None], dtype="string")}
    )
    assert sp.row_keys(whole, ["k", "g"], 5).tolist() == by_hand(text, 5)
    fractions = pd.DataFrame({"k": [3.0, 2.5]})
    assert sp.row_keys(fractions, ["k"], 5).tolist() == by_hand(
        pd.DataFrame({"k": pd.Series(["3.0", "2.5"], dtype="string")}), 5
    )
    ints = pd.DataFrame({"k": [3, 10]})
    assert sp.row_keys(ints, ["k"], 9).tolist() == by_hand(
        pd.DataFrame({"k": pd.Series(["3", "10"], dtype="string")}), 9
    )
    raw = pd.DataFrame({ROW_KEY: np.array([7, 2**63], dtype=np.uint64)})  # the raw-row key: hashed as the number
    assert sp.row_keys(raw, [ROW_KEY], 1).tolist() == by_hand(raw, 1)
    assert int(sp.seed_word(4)) == int.from_bytes(hashlib.blake2b(b"trainflow.split:4", digest_size=8).digest(), "big")
    assert sp.seeded(np.array([0, 1, 2**64 - 1], dtype=np.uint64), 3).tolist() == [
        splitmix64_by_hand(k, 3) for k in (0, 1, 2**64 - 1)
    ]
