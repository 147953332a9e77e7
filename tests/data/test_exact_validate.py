"""Exact behaviour of ingest's checks (trainflow.data.validate) on tables small enough to work by hand: every message
in full, both sides of each threshold (the typed share, the id rules, auto task, singleton classes), the typed values
and dtypes, the rows dropped and why, and the spilled path against the in-memory one. Expected values are written out
by hand (or computed by pandas/numpy directly), never by the function under test."""

from __future__ import annotations

import datetime
import decimal
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from trainflow.core.errors import DataError
from trainflow.data import spill
from trainflow.data import validate as v
from trainflow.data.schema import ROW_KEY, Schema, parquet_options
from trainflow.data.spill import ColumnSpill, SpilledFrame
from trainflow.params import DataParams

SRC = "data/raw/f.csv"


class T:
    """Stand-in for RawTable: row r of the frame is line r + 2 of f.csv; extra attributes (delimiter, image_column)
    as given."""

    def __init__(self, frame: Any, **extra: Any) -> None:
        self.frame, self.source = frame, SRC
        for k, val in extra.items():
            setattr(self, k, val)

    def where(self, row: int, column: str | None = None) -> str:
        return f"f.csv, line {row + 2}" + (f", column {column!r}" if column is not None else "")


def P(**params: Any) -> DataParams:
    params.setdefault("target", "y")
    return DataParams(**params)


def ingest(frame: Any, previous: Schema | None = None, table: dict[str, Any] | None = None, **params: Any) -> Any:
    return v.infer_schema(T(pd.DataFrame(frame), **(table or {})), P(**params), previous)


def fails(frame: Any, previous: Schema | None = None, table: dict[str, Any] | None = None, **params: Any) -> str:
    with pytest.raises(DataError) as info:
        ingest(frame, previous, table, **params)
    return str(info.value)


def col(frame: Any, name: str = "c", **params: Any) -> v._Column:
    """_column of one column of `frame` (a dict of columns or a frame)."""
    f = pd.DataFrame(frame)
    return v._column(T(f), P(**params), name)


# --- small helpers ---------------------------------------------------------------------------------------------------


def test_names_quotes_each_and_counts_those_past_the_limit() -> None:
    assert v._names([]) == ""
    assert v._names(["a", 1]) == "'a', '1'"
    assert v._names(range(30)) == ", ".join(f"'{i}'" for i in range(30))
    assert v._names(range(32)) == ", ".join(f"'{i}'" for i in range(30)) + " and 2 more"
    assert v._names(["a", "b", "c"], limit=2) == "'a', 'b' and 1 more"


def test_yaml_list_quotes_only_what_yaml_would_read_otherwise() -> None:
    assert v._yaml_list([]) == "[]"
    assert v._yaml_list(["a", "b c"]) == "[a, b c]"
    assert v._yaml_list(["yes", "1", "null", "x: y", "[q", "a,b"]) == '["yes", "1", "null", "x: y", "[q", "a,b"]'


def test_pct_floors_and_stops_at_99() -> None:
    assert [v._pct(s) for s in (0.0, 0.5, 0.956, 0.95, 0.999, 1.0)] == [0, 50, 95, 95, 99, 99]


def test_kind_accepts_the_schema_kinds_only() -> None:
    for kind in ("numeric", "categorical", "boolean", "datetime", "text", "image"):
        assert v._kind(kind) == kind
    with pytest.raises(AssertionError, match="entirely missing"):
        v._kind(v.MISSING_KIND)


def test_hint_names_the_setting_that_stops_using_a_column() -> None:
    assert v._hint(P(text_column="t"), "t") == "or set data.text_column to another column"
    assert v._hint(P(features=["a"]), "a") == "or remove 'a' from data.features"
    assert v._hint(P(), "a") == "or add 'a' to data.exclude"
    assert v._hint(P(text_column="t"), "a") == "or add 'a' to data.exclude"


def test_at_names_the_line_and_column() -> None:
    err = v._at(T(None), np.int64(3), "c", "bad")  # type: ignore[arg-type]
    assert isinstance(err, DataError) and str(err) == "data.source: f.csv, line 5, column 'c': bad"
    assert str(v._at(T(None), 0, None, "x")) == "data.source: f.csv, line 2: x"


def test_per_row_share_and_first_row() -> None:
    got = v._per_row([10, 20], -1, np.array([1, -1, 0]))
    assert got.tolist() == [20, -1, 10] and got.dtype == np.int64
    got = v._per_row(np.array(["a", "b"], dtype=object), None, np.array([-1, 0]))
    assert got.tolist() == [None, "a"] and got.dtype == object
    assert v._per_row(np.array([1.5]), np.nan, np.array([0, -1])).dtype == np.float64
    codes = np.array([0, 0, 1, -1, 2])
    assert v._row_share(np.array([True, False, True]), codes) == 3 / 4
    assert v._row_share(np.array([False, True, False]), codes) == 1 / 4
    assert v._row_share(np.array([True]), np.array([-1, -1])) == 0.0
    assert v._first_row(np.array([False, True]), np.array([0, -1, 1, 1])) == 2
    assert v._first_row(np.array([True, False]), np.array([-1, 1, 0])) == 2


def test_series_keeps_object_arrays_object_and_others_as_they_are() -> None:
    s = v._series(np.array(["a", None], dtype=object))
    assert s.dtype == object and s.tolist() == ["a", None]
    floats = np.array([1.0, 2.0])
    s = v._series(floats)
    assert s.dtype == np.float64 and np.shares_memory(s.to_numpy(), floats)
    s = v._series(pd.array([True, None], dtype="boolean"))
    assert s.dtype == "boolean"


def test_carried_columns_of_mixed_values_become_text() -> None:
    mixed = pd.Series([1, "a", None], dtype=object)
    out = v._carried(mixed)
    assert out.dtype == "string" and out.tolist() == ["1", "a", pd.NA]
    strings = pd.Series(["a", None], dtype=object)
    assert v._carried(strings) is strings
    empty = pd.Series([None, None], dtype=object)
    assert v._carried(empty) is empty
    ints = pd.Series([1, 2])
    assert v._carried(ints) is ints


def test_raw_row_keys_hash_rows_and_fall_back_to_text_for_unhashable_values() -> None:
    frame = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    expected = pd.util.hash_pandas_object(frame, index=False).to_numpy(dtype=np.uint64)
    assert v.raw_row_keys(frame).dtype == np.uint64
    np.testing.assert_array_equal(v.raw_row_keys(frame), expected)
    nested = pd.DataFrame({"a": [1, 2], "b": pd.Series([[1, 2], {"k": 1}], dtype=object)})
    as_text = pd.DataFrame({"a": [1, 2], "b": pd.Series(["[1, 2]", "{'k': 1}"], dtype=object).astype(str)})
    np.testing.assert_array_equal(
        v.raw_row_keys(nested), pd.util.hash_pandas_object(as_text, index=False).to_numpy(dtype=np.uint64)
    )


def test_schema_params_leave_out_what_only_decides_rows() -> None:
    d = P(missing="drop", duplicates="drop", missing_target="drop", unseen_labels="drop", memory_budget_mb=5.0)
    got = v.schema_params(d)
    rows = {"missing", "duplicates", "missing_target", "unseen_labels", "memory_budget_mb"}
    assert got == {k: val for k, val in d.model_dump().items() if k not in rows}
    assert set(got) == {"source", "format", "delimiter", "header", "header_rows", "quoting", "columns", "encoding",
                        "target", "task", "features", "exclude", "text_column", "image_column"}  # fmt: skip


# --- the params' columns against the table ---------------------------------------------------------------------------


def test_column_names_given_twice_are_named_once_each() -> None:
    frame = pd.DataFrame([[1, 2, 3, 4, 5, 6]], columns=["a", "a", "y", "b", "b", "b"])
    assert fails(frame) == f"data.source: {SRC}: column names appear more than once: 'a', 'b'; rename them"
    frame = pd.DataFrame([[1, 2, 3]], columns=[1, "1", "y"])  # two labels, one name
    assert fails(frame) == f"data.source: {SRC}: column names appear more than once: '1'; rename them"


def test_a_table_without_rows_is_refused() -> None:
    frame = pd.DataFrame({"x": pd.Series([], dtype=float), "y": pd.Series([], dtype=object)})
    assert fails(frame) == f"data.source: {SRC}: the data has no rows; point data.source at a file with data"


def test_an_unknown_target_lists_the_columns_or_names_the_delimiter() -> None:
    assert fails({"x": [1.0], "label": ["a"]}) == (
        f"data.source: {SRC}: data.target 'y' is not a column; the columns are: 'x', 'label'. "
        "Set data.target to one of them (-S data.target=<column>)"
    )
    assert fails({"abc": [1]}) == (
        f"data.source: {SRC}: data.target 'y' is not a column; the columns are: 'abc'. Set data.target to one of them "
        "(-S data.target=<column>)"
    )
    assert fails({"a;b;y": ["1;2;3"]}, table={"delimiter": ","}) == (
        f"data.source: {SRC}: data.target 'y' is not a column; the whole header 'a;b;y' was read as one column "
        "(delimiter ','), but it holds 2 ';': the file is delimited by ';'. Set data.delimiter: -S "
        "'data.delimiter=\";\"'"
    )
    # without the table's delimiter (a fake without it): no "(delimiter ...)"
    assert fails({"a|b|y": ["1|2|3"]}) == (
        f"data.source: {SRC}: data.target 'y' is not a column; the whole header 'a|b|y' was read as one column, but "
        "it holds 2 '|': the file is delimited by '|'. Set data.delimiter: -S 'data.delimiter=\"|\"'"
    )
    # two columns: not a header read as one, whatever it holds
    assert fails({"a;b": [1], "c;d": [2]}) == (
        f"data.source: {SRC}: data.target 'y' is not a column; the columns are: 'a;b', 'c;d'. "
        "Set data.target to one of them (-S data.target=<column>)"
    )


def test_delimiter_hint_picks_the_most_frequent_other_delimiter() -> None:
    assert v._delimiter_hint("abc", None) is None
    assert v._delimiter_hint("a,b,c", ",") is None  # the delimiter read by is not another one
    assert v._delimiter_hint("a;b\tc\td", ";") == (
        "the whole header 'a;b\\tc\\td' was read as one column (delimiter ';'), but it holds 2 '\\t': the file is "
        "delimited by '\\t'. Set data.delimiter: -S 'data.delimiter=\"\\t\"'"
    )
    assert v._delimiter_hint("a|b,c,d;e", "") == (
        "the whole header 'a|b,c,d;e' was read as one column, but it holds 2 ',': the file is delimited by ','. "
        "Set data.delimiter: -S 'data.delimiter=\",\"'"
    )
    # a tie goes to the first in OTHER_DELIMITERS (; tab | ,)
    assert v._delimiter_hint("a,b|c", None) == (
        "the whole header 'a,b|c' was read as one column, but it holds 1 '|': the file is delimited by '|'. "
        "Set data.delimiter: -S 'data.delimiter=\"|\"'"
    )


def test_unknown_feature_exclude_and_text_columns_are_listed_together() -> None:
    frame = {"x": [1.0], "yes": [2.0], "y": ["a"]}
    assert fails(frame, features=["x", "nope", "zz"], exclude=["gone", "yes"], text_column="body") == (
        f"data.source: {SRC}: data.features names columns that do not exist: 'nope', 'zz' (for this data: -S "
        "'data.features=[x]'); data.exclude names columns that do not exist: 'gone' (for this data: -S "
        "'data.exclude=[\"yes\"]'); data.text_column 'body' is not a column (for this data: -S data.text_column=null); "
        "the columns are: 'x', 'yes', 'y'"
    )
    assert fails(frame, features=["nope"], exclude=["gone"]) == (
        f"data.source: {SRC}: data.features names columns that do not exist: 'nope' (for this data: -S "
        "'data.features=null'); data.exclude names columns that do not exist: 'gone' (for this data: -S "
        "'data.exclude=[]'); the columns are: 'x', 'yes', 'y'"
    )
    assert fails(frame, text_column="body") == (
        f"data.source: {SRC}: data.text_column 'body' is not a column (for this data: -S data.text_column=null); the "
        "columns are: 'x', 'yes', 'y'"
    )


def test_features_listed_twice_or_naming_the_text_column() -> None:
    frame = {"x": [1.0], "z": [2.0], "t": ["w"], "y": ["a"]}
    assert fails(frame, features=["x", "z", "x", "z", "x"]) == (
        f"data.source: {SRC}: data.features lists 'x', 'z' more than once; list each column once"
    )
    assert fails(frame, features=["x", "t"], text_column="t") == (
        f"data.source: {SRC}: data.features lists the text column 't'; the text column is modelled on its own, "
        "remove it from data.features"
    )
    assert fails(frame, exclude=["z", "t"], text_column="t") == (
        f"data.source: {SRC}: data.exclude lists the text column 't'; remove it there or unset data.text_column"
    )


def test_check_columns_maps_names_to_the_frames_labels() -> None:
    frame = pd.DataFrame({1: [1.0], "y": ["a"]})
    assert v._check_columns(T(frame), P()) == {"1": 1, "y": "y"}


def test_features_are_the_listed_ones_or_every_other_column() -> None:
    columns = {"a": "a", "b": "b", "t": "t", "e": "e", "y": "y"}
    table = T(pd.DataFrame())
    assert v._features(table, P(features=["b", "a"]), columns) == ["b", "a"]
    assert v._features(table, P(exclude=["e"], text_column="t"), columns) == ["a", "b"]
    assert v._features(table, P(exclude=["a", "b", "e"], text_column="t"), columns) == []
    with pytest.raises(DataError) as info:
        v._features(table, P(exclude=["a", "b", "e", "t"]), columns)
    assert str(info.value) == (
        f"data.source: {SRC}: no feature columns are left after data.features/data.exclude (the columns are: 'a', "
        "'b', 't', 'e', 'y'); name some in data.features or shorten data.exclude"
    )
    assert v._features(table, P(), columns, image="img") == []
    for params in (P(features=["a"]), P(text_column="t")):
        with pytest.raises(DataError) as info:
            v._features(table, params, columns, image="img")
        assert str(info.value) == (
            f"data.source: {SRC}: with images (column 'img') the other columns are not used; remove data.features "
            "and data.text_column"
        )


# --- id-like features ------------------------------------------------------------------------------------------------


def numeric(values: Any) -> v._Column:
    return v._Column("n", "numeric", np.asarray(values, dtype=np.float64))


def test_id_like_needs_enough_rows() -> None:
    assert v._id_like(v._Column("c", "categorical", None, distinct=19), 19) is None
    assert v._id_like(v._Column("c", "categorical", None, distinct=20), 20) == "a different value in every row"
    assert v._id_like(v._Column("c", "categorical", None, distinct=19), 20) is None
    assert v._id_like(numeric(np.arange(19)), 19) is None
    assert v._id_like(numeric(np.arange(20)), 20) == "a different integer in every row, in row order"
    for kind in ("boolean", "datetime", "text"):
        assert v._id_like(v._Column("c", kind, np.arange(30), distinct=30), 30) is None


def id_like_reference(values: np.ndarray, n: int) -> str | None:
    """_id_like of a numeric column as written before its passes went a block at a time: whole-column numpy."""
    if n < v.ID_MIN_ROWS or np.isnan(values).any() or (values != np.round(values)).any():
        return None
    steps = np.diff(values)
    rising, falling = bool((steps >= 0).all()), bool((steps <= 0).all())
    if (rising and (steps > 0).all()) or (falling and (steps < 0).all()):
        return "a different integer in every row, in row order"
    distinct = len(set(values.tolist()))
    if distinct == n:
        return "a different integer in every row"
    if (rising or falling) and distinct * 2 >= n:
        return f"integers that {'rise' if rising else 'fall'} with the row order"
    return None


@pytest.mark.parametrize("block", [1, 2, 7, 1 << 20])
def test_id_like_a_block_at_a_time_is_the_whole_column_answer(monkeypatch: pytest.MonkeyPatch, block: int) -> None:
    """Blocks of a few rows: a step, a fraction or a missing value on either side of a block boundary counts."""
    monkeypatch.setattr(v, "ID_BLOCK", block)
    rng = np.random.default_rng(0)
    n = 40
    up = np.arange(n, dtype=np.float64)
    cases = [up, up[::-1], np.repeat(np.arange(20.0), 2), np.repeat(np.arange(20.0), 2)[::-1], rng.permutation(up),
             np.sort(rng.integers(0, 25, n)).astype(np.float64), rng.integers(0, 5, n).astype(np.float64)]  # fmt: skip
    for at in (6, 7, 8, 13, 14, 39):  # a step down, a fraction and a missing value near block edges
        down = up.copy()
        down[at] = down[at - 1]
        cases.append(down)
        swapped = up.copy()
        swapped[[at - 1, at]] = swapped[[at, at - 1]]
        cases.append(swapped)
        for bad in (0.5, np.nan):
            spoiled = up.copy()
            spoiled[at] += bad
            cases.append(spoiled)
    answers = set()
    for values in cases:
        got = v._id_like(numeric(values), n)
        assert got == id_like_reference(values, n), values
        answers.add(got)
    assert answers == {None, "a different integer in every row, in row order", "a different integer in every row",
                       "integers that rise with the row order", "integers that fall with the row order"}  # fmt: skip


def test_id_like_integers_in_row_order_or_all_different() -> None:
    n = 24
    assert v._id_like(numeric(np.arange(n)[::-1]), n) == "a different integer in every row, in row order"
    perm = np.array([5, 3, 0, 1, 2, 4] + list(range(6, n)))
    assert v._id_like(numeric(perm), n) == "a different integer in every row"
    rising = np.repeat(np.arange(12), 2)  # 12 distinct of 24, never falling
    assert v._id_like(numeric(rising), n) == "integers that rise with the row order"
    assert v._id_like(numeric(rising[::-1]), n) == "integers that fall with the row order"
    assert v._id_like(numeric(np.repeat(np.arange(8), 3)), n) is None  # 8 * 2 < 24
    # 12 distinct (12 * 2 >= 24, once the other way) but up and down: no order
    assert v._id_like(numeric(np.r_[np.arange(12), np.arange(12)]), n) is None
    assert v._id_like(numeric(np.r_[0, np.arange(1, 12).repeat(2), 12]), 24) == "integers that rise with the row order"


def test_id_like_never_for_fractions_or_missing_values() -> None:
    n = 1100
    values = np.arange(n, dtype=np.float64)
    for bad in (np.nan, 0.5):
        for at in (3, 1050):  # in the first 1024 values, or after them
            changed = values.copy()
            changed[at] = at + bad
            assert v._id_like(numeric(changed), n) is None, (bad, at)
    assert v._id_like(numeric(values), n) == "a different integer in every row, in row order"


def test_warn_of_ids_names_them_and_the_setting_that_leaves_them_out(capsys: pytest.CaptureFixture[str]) -> None:
    cols = [v._Column("id", "numeric", None, id_like="a different integer in every row"),
            v._Column("x", "numeric", None),
            v._Column("code", "categorical", None, id_like="a different value in every row")]  # fmt: skip
    v._warn_of_ids(P(exclude=["e"]), cols)
    text = (
        "ingest: warning: features that look like ids, not measurements: 'id' (a different integer in every row), "
        "'code' (a different value in every row). A model memorises rows by an id instead of learning from the data "
        "(and where rows are sorted by the label, an id gives it away). If they are ids, leave them out: -S "
    )
    assert capsys.readouterr().err == text + "'data.exclude=[e, id, code]'\n"
    v._warn_of_ids(P(features=["id", "x", "code"]), cols)
    assert capsys.readouterr().err == text + "'data.features=[x]'\n"
    v._warn_of_ids(P(), [cols[1]])
    assert capsys.readouterr().err == ""


def test_ingest_warns_of_an_id_column_but_not_of_one_with_a_problem(capsys: pytest.CaptureFixture[str]) -> None:
    n = 20
    schema, _ = ingest({"id": np.arange(n), "x": np.arange(n) % 3 + 0.5, "y": ["a", "b"] * 10})
    assert schema.features == ["id", "x"]
    assert capsys.readouterr().err == (
        "ingest: warning: features that look like ids, not measurements: 'id' (a different integer in every row, in "
        "row order). A model memorises rows by an id instead of learning from the data (and where rows are sorted by "
        "the label, an id gives it away). If they are ids, leave them out: -S 'data.exclude=[id]'\n"
    )
    # an id column with a problem: the problem is raised, with no warning before it
    ids = [str(i) for i in range(n)]
    ids[5] = "five"
    with pytest.raises(DataError):
        ingest({"id": ids, "y": ["a", "b"] * 10})
    assert capsys.readouterr().err == ""


# --- feature columns: kind and typed values --------------------------------------------------------------------------


def assert_column(c: v._Column, name: str, kind: str, values: list[Any], dtype: Any) -> None:
    assert (c.name, c.kind, c.problem) == (name, kind, None)
    assert pd.Series(c.values).tolist() == values or (
        pd.isna(pd.Series(c.values)).tolist() == pd.isna(pd.Series(values, dtype=object)).tolist()
        and [x for x in pd.Series(c.values).tolist() if not pd.isna(x)] == [x for x in values if not pd.isna(x)]
    ), (pd.Series(c.values).tolist(), values)
    assert c.values.dtype == dtype


def test_object_columns_typed_from_their_python_values() -> None:
    obj = lambda values: pd.Series(values, dtype=object)  # noqa: E731
    assert_column(col({"c": obj([True, None, False])}), "c", "boolean", [True, pd.NA, False], "boolean")
    assert_column(col({"c": obj([1, None, 3])}), "c", "numeric", [1.0, np.nan, 3.0], np.float64)
    assert_column(col({"c": obj([1, 2.5])}), "c", "numeric", [1.0, 2.5], np.float64)
    assert_column(col({"c": obj([decimal.Decimal("1.5"), None])}), "c", "numeric", [1.5, np.nan], np.float64)
    days = obj([datetime.date(2026, 1, 2), None])
    c = col({"c": days})
    assert c.kind == "datetime" and c.values.dtype == "datetime64[ns]"
    np.testing.assert_array_equal(c.values, np.array(["2026-01-02", "NaT"], dtype="datetime64[ns]"))
    # Python datetimes, one with a time zone, one past 2262: read in UTC, the far one out of range
    far = obj([datetime.datetime(2026, 1, 1, 5, tzinfo=datetime.timezone(datetime.timedelta(hours=5))),
               datetime.datetime(3000, 1, 2)])  # fmt: skip
    c = col({"c": far})
    assert c.kind == "datetime" and str(c.problem) == (
        "data.source: f.csv, line 3, column 'c': 3000-01-02 00:00:00+00:00 is out of the supported date range "
        "(1677-2262); fix it or add 'c' to data.exclude"
    )
    np.testing.assert_array_equal(c.values, np.array(["2026-01-01T00:00", "NaT"], dtype="datetime64[ns]"))
    # values that are not all dates (a time of day beside a date) are strings: categorical
    c = col({"c": obj([datetime.date(2026, 1, 1), datetime.time(3, 4)])})
    assert c.kind == "categorical" and c.get().tolist() == ["2026-01-01", "03:04:00"] and c.distinct == 2
    c = col({"c": obj([None, None])})
    assert c.kind == v.MISSING_KIND and str(c.problem) == (
        f"data.source: {SRC}, column 'c': every value is missing; fill it in or add 'c' to data.exclude"
    )
    assert c.values.tolist() == [None, None]


def test_typed_columns_by_dtype() -> None:
    assert_column(col({"c": [True, False]}), "c", "boolean", [True, False], "boolean")
    nullable = pd.array([True, None], dtype="boolean")
    c = col({"c": nullable})
    assert c.kind == "boolean" and c.values.tolist() == [True, pd.NA]
    c = col({"c": pd.array([None, None], dtype="boolean")})
    assert c.kind == v.MISSING_KIND and "every value is missing" in str(c.problem)
    assert_column(col({"c": np.array([3, 1], dtype=np.int64)}), "c", "numeric", [3.0, 1.0], np.float64)
    assert_column(col({"c": pd.array([3, None], dtype="Int64")}), "c", "numeric", [3.0, np.nan], np.float64)
    floats = np.array([0.5, np.nan])
    frame = pd.DataFrame({"c": floats})
    c = v._column(T(frame), P(), "c")
    assert c.kind == "numeric" and np.shares_memory(c.values, frame["c"].to_numpy())
    stamps = pd.Series(pd.to_datetime(["2026-01-01", None])).astype("datetime64[s]")
    c = col({"c": stamps})
    assert c.kind == "datetime" and c.values.dtype == "datetime64[ns]"
    np.testing.assert_array_equal(c.values, np.array(["2026-01-01", "NaT"], dtype="datetime64[ns]"))
    aware = pd.Series(pd.to_datetime(["2026-01-01 10:00"])).dt.tz_localize("Europe/Paris")
    np.testing.assert_array_equal(col({"c": aware}).values, np.array(["2026-01-01T09:00"], dtype="datetime64[ns]"))
    c = col({"c": pd.Series(["b", "a", None], dtype="category")})
    assert c.kind == "categorical" and c.get().tolist() == ["b", "a", None] and c.distinct == 2


def test_non_finite_and_all_missing_numbers() -> None:
    c = col({"c": [1.0, -np.inf, np.inf]})
    assert c.kind == "numeric" and str(c.problem) == (
        "data.source: f.csv, line 3, column 'c': -inf is not a finite number; fix the value or add 'c' to data.exclude"
    )
    c = col({"c": [1.0, np.inf]}, features=["c"])
    assert str(c.problem) == (
        "data.source: f.csv, line 3, column 'c': inf is not a finite number; fix the value or remove 'c' from "
        "data.features"
    )
    c = col({"c": [np.nan, np.nan]})
    assert c.kind == v.MISSING_KIND and str(c.problem) == (
        f"data.source: {SRC}, column 'c': every value is missing; fill it in or add 'c' to data.exclude"
    )
    assert np.isnan(c.values).all() and len(c.values) == 2


def test_dates_out_of_range_and_all_missing() -> None:
    far = pd.Series(np.array(["2026-01-01", "3000-06-01", "NaT"], dtype="datetime64[s]"))
    c = col({"c": far})
    assert c.kind == "datetime" and str(c.problem) == (
        "data.source: f.csv, line 3, column 'c': 3000-06-01 00:00:00 is out of the supported date range "
        "(1677-2262); fix it or add 'c' to data.exclude"
    )
    np.testing.assert_array_equal(c.values, np.array(["2026-01-01", "NaT", "NaT"], dtype="datetime64[ns]"))
    c = col({"c": pd.Series(np.array(["NaT", "NaT"], dtype="datetime64[ns]"))})
    assert c.kind == v.MISSING_KIND and "every value is missing" in str(c.problem)


def test_to_ns_marks_what_is_out_of_range() -> None:
    values, out = v._to_ns(
        pd.Series(np.array(["1500-01-01", "2000-01-01", "NaT", "2300-01-01"], dtype="datetime64[s]"))
    )
    assert out is not None and out.tolist() == [True, False, False, True]
    np.testing.assert_array_equal(values, np.array(["NaT", "2000-01-01", "NaT", "NaT"], dtype="datetime64[ns]"))
    values, out = v._to_ns(pd.Series(np.array(["2000-01-01"], dtype="datetime64[us]")))
    assert out is None and values.dtype == "datetime64[ns]"


def test_nested_values_are_refused_with_their_line() -> None:
    frame = {"c": pd.Series(["a", {"k": 1}, [1, 2]], dtype=object), "y": ["a", "b", "a"]}
    assert fails(frame) == (
        "data.source: f.csv, line 3, column 'c': {'k': 1} is a nested value (a list or object); flatten it into columns"
    )
    frame = {"x": [1.0, 2.0, 3.0], "y": pd.Series(["a", "b", [1]], dtype=object)}
    assert fails(frame) == (
        "data.source: f.csv, line 4, column 'y': [1] is a nested value (a list or object); flatten it into columns"
    )


# --- string columns: numbers, booleans, dates or categories ----------------------------------------------------------


def strings(values: list[Any], **params: Any) -> v._Column:
    return col({"c": pd.Series(values, dtype=object)}, **params)


def test_strings_of_numbers_are_numeric() -> None:
    assert_column(strings([" 1", "2.5 ", None, "1"]), "c", "numeric", [1.0, 2.5, np.nan, 1.0], np.float64)
    c = strings(["1", " -inf", "2"], features=["c"])  # numbers all, one of them not finite
    assert (c.name, c.kind) == ("c", "numeric") and str(c.problem) == (
        "data.source: f.csv, line 3, column 'c': -inf is not a finite number; fix the value or remove 'c' from "
        "data.features"
    )
    c = col({"c": pd.Series(["3", None], dtype="str")})
    assert c.kind == "numeric" and c.values.dtype == np.float64 and c.values[0] == 3.0 and np.isnan(c.values[1])


def test_a_stray_value_in_a_numeric_column_at_95_percent_of_the_rows() -> None:
    values: list[Any] = ["7"] * 19 + [None] * 5  # the missing rows count for neither side
    values.insert(4, "x")
    c = strings(values)
    assert c.kind == "numeric" and str(c.problem) == (
        "data.source: f.csv, line 6, column 'c': 'x' is not a number (the column is numeric in 95% of rows); "
        "fix the value or add 'c' to data.exclude"
    )
    expected = [7.0] * 4 + [np.nan] + [7.0] * 15 + [np.nan] * 5
    np.testing.assert_array_equal(c.values, np.array(expected))
    c = strings(["7"] * 18 + ["x", "z"])  # 90%: categorical
    assert c.kind == "categorical" and c.problem is None and c.distinct == 3
    assert c.get().tolist() == ["7"] * 18 + ["x", "z"]
    # the first problem is the stray text; a non-finite number after it is not reported instead
    c = strings(["inf"] + ["1"] * 18 + ["x"], features=["c"])
    assert str(c.problem) == (
        "data.source: f.csv, line 21, column 'c': 'x' is not a number (the column is numeric in 95% of rows); "
        "fix the value or remove 'c' from data.features"
    )
    c = strings(["5"] * 99 + [" x "] * 1 + ["5"] * 900)  # 99.9%: shown as 99
    assert str(c.problem) == (
        "data.source: f.csv, line 101, column 'c': ' x ' is not a number (the column is numeric in 99% of rows); "
        "fix the value or add 'c' to data.exclude"
    )


def test_yes_no_true_false_in_any_case_are_booleans() -> None:
    c = strings([" Yes", "NO", None, "true", "False", "yes"])
    assert c.kind == "boolean" and c.problem is None and c.values.dtype == "boolean"
    assert c.values.tolist() == [True, False, pd.NA, True, False, True]
    c = strings(["yes", "no", "maybe"])
    assert c.kind == "categorical" and c.get().tolist() == ["yes", "no", "maybe"]


def test_iso_dates_are_datetimes() -> None:
    c = strings(["2024-01-31", " 2024-02-01T12:30:00 ", None, "2024-02-02 08:15", "2024-01-31"])
    assert c.kind == "datetime" and c.problem is None
    expected = ["2024-01-31", "2024-02-01T12:30", "NaT", "2024-02-02T08:15", "2024-01-31"]
    np.testing.assert_array_equal(c.values, np.array(expected, dtype="datetime64[ns]"))
    c = strings(["2024-01-01T00:00:00+02:00", "2024-01-01T00:00:00Z", "2024-01-01T01:30:00-0130"])
    np.testing.assert_array_equal(
        c.values, np.array(["2023-12-31T22:00", "2024-01-01T00:00", "2024-01-01T03:00"], dtype="datetime64[ns]")
    )


def test_a_stray_value_in_a_date_column_at_95_percent_of_the_rows() -> None:
    dates = [f"2024-01-{d:02d}" for d in range(1, 20)]
    c = strings(dates[:7] + ["soon"] + dates[7:] + [None, None])
    assert (c.name, c.kind) == ("c", "datetime") and str(c.problem) == (
        "data.source: f.csv, line 9, column 'c': 'soon' is not an ISO date or timestamp like 2024-01-31 or "
        "2024-01-31T12:00:00 (the column is dates in 95% of rows); fix the value or add 'c' to data.exclude"
    )
    expected = dates[:7] + ["NaT"] + dates[7:] + ["NaT", "NaT"]
    np.testing.assert_array_equal(c.values, np.array(expected, dtype="datetime64[ns]"))
    c = strings(dates[:18] + ["soon", "later"])  # 90%: categorical
    assert c.kind == "categorical" and c.distinct == 20 and c.problem is None
    # shaped like a date but no date: the same message
    c = strings(dates + ["2024-13-45"], features=["c"])
    assert str(c.problem) == (
        "data.source: f.csv, line 21, column 'c': '2024-13-45' is not an ISO date or timestamp like 2024-01-31 or "
        "2024-01-31T12:00:00 (the column is dates in 95% of rows); fix the value or remove 'c' from data.features"
    )
    c = strings(dates[:18] + ["2024-13-45", "2024-02-30"])
    assert c.kind == "categorical" and c.problem is None


def test_dates_past_2262_are_dates_out_of_range() -> None:
    dates = [f"2024-01-{d:02d}" for d in range(1, 20)]
    c = strings(dates[:3] + ["3000-01-01"] + dates[3:])
    assert (c.name, c.kind) == ("c", "datetime") and str(c.problem) == (
        "data.source: f.csv, line 5, column 'c': 3000-01-01 is out of the supported date range (1677-2262); fix it "
        "or add 'c' to data.exclude"
    )
    np.testing.assert_array_equal(c.values, np.array(dates[:3] + ["NaT"] + dates[3:], dtype="datetime64[ns]"))
    # 18 dates, one out of range and one impossible: dates in 95% of rows counting the one out of range
    c = strings(dates[:18] + ["2024-13-45", "3000-01-01"])
    assert c.kind == "datetime" and str(c.problem) == (
        "data.source: f.csv, line 20, column 'c': '2024-13-45' is not an ISO date or timestamp like 2024-01-31 or "
        "2024-01-31T12:00:00 (the column is dates in 95% of rows); fix the value or add 'c' to data.exclude"
    )


def test_categories_as_text_one_per_printed_value() -> None:
    c = strings([1, "1", "a", None, "a", " a"])
    assert (c.kind, c.problem, c.distinct) == ("categorical", None, 3)
    assert c.get().dtype == object and c.get().tolist() == ["1", "1", "a", None, "a", " a"]
    c = strings(["b", None, "a", "b"])
    assert (c.kind, c.distinct) == ("categorical", 2) and c.get().tolist() == ["b", None, "a", "b"]
    c = col({"c": pd.Series([None, None], dtype="str")})
    assert c.kind == v.MISSING_KIND and "every value is missing" in str(c.problem)


# --- the text column -------------------------------------------------------------------------------------------------


def test_text_column_values_as_strings() -> None:
    words = pd.Series(["good", None, "bad"], dtype=object)
    c = v._text(T(pd.DataFrame({"t": words})), "t", "t")
    assert (c.name, c.kind, c.problem) == ("t", "text", None)
    assert c.values.dtype == object and c.values.tolist() == ["good", None, "bad"] and c.values[0] is words[0]
    c = v._text(T(pd.DataFrame({"t": [1.5, np.nan, 2.0]})), "text", "t")
    assert (c.name, c.kind) == ("text", "text") and c.values.tolist() == ["1.5", None, "2.0"]
    c = v._text(T(pd.DataFrame({"t": pd.Series([None, None], dtype=object)})), "t", "t")
    assert c.kind == v.MISSING_KIND and str(c.problem) == (
        f"data.source: {SRC}, column 't': every value of the text column is missing; fill it in or set "
        "data.text_column to another column"
    )
    assert c.values.tolist() == [None, None]


def test_ingest_with_a_text_column_only() -> None:
    schema, out = ingest({"t": ["a b", "c", None, "d e"], "n": [1, 2, 3, 4], "y": ["p", "q", "p", "q"]},
                         text_column="t", features=[])  # fmt: skip
    assert (schema.features, schema.kinds, schema.text_column, schema.carried) == ([], {"t": "text"}, "t", ["n"])
    assert list(out.columns) == ["t", "y", "n", ROW_KEY] and out["t"].tolist() == ["a b", "c", None, "d e"]
    message = fails({"t": [None, None], "y": ["p", "q"]}, text_column="t")
    assert message == (
        f"data.source: {SRC}, column 't': every value of the text column is missing; fill it in or set "
        "data.text_column to another column"
    )


def test_ingest_of_an_image_column() -> None:
    frame = {"image": pd.Series([b"\x89PNG1", b"\x89PNG2"], dtype=object), "image_path": ["a.png", "b.png"],
             "y": ["cat", "dog"]}  # fmt: skip
    schema, out = ingest(frame, table={"image_column": "image"})
    assert (schema.features, schema.kinds, schema.image_column) == ([], {"image": "image"}, "image")
    assert schema.carried == ["image_path"] and schema.classes == ["cat", "dog"]
    assert list(out.columns) == ["image", "y", "image_path", ROW_KEY]
    assert out["image"].tolist() == [b"\x89PNG1", b"\x89PNG2"] and out["image"].dtype == object


# --- schema drift ----------------------------------------------------------------------------------------------------


def prev(**overrides: Any) -> Schema:
    fields: dict[str, Any] = dict(
        source=SRC,
        target="y",
        task="classification",
        features=["age", "city"],
        kinds={"age": "numeric", "city": "categorical"},
        classes=["b", "a"],
        n_rows=10,
    )
    return Schema(**(fields | overrides))


def test_drift_lists_every_change_in_order() -> None:
    frame = {"age": ["x", "y"], "zip": [1.0, 2.0], "t": [1.0, 2.0], "y": ["a", "b"]}
    assert fails(
        frame, prev(text_column="t", kinds={"age": "numeric", "city": "categorical", "t": "text"}), exclude=["t"]
    ) == (  # fmt: skip
        f"data.source: {SRC}: the data changed since the last ingest under the same data params (3 changes: 'age': "
        "numeric -> categorical; 'city' (categorical) is missing; 'zip' (numeric) is new). If the new data is "
        "right, accept its schema once with `trainflow stage ingest --accept-schema`, then rerun"
    )


def test_drift_of_new_columns_only_offers_the_columns_of_before() -> None:
    frame = {"age": [1.0, 2.0], "city": ["x", "y"], "zip": [1.0, 2.0], "y": ["a", "b"]}
    assert fails(frame, prev()) == (
        f"data.source: {SRC}: the data changed since the last ingest under the same data params (1 change: 'zip' "
        "(numeric) is new). If the new data is right, accept its schema once with `trainflow stage ingest "
        "--accept-schema`, then rerun; or keep training on the columns of before: -S 'data.features=[age, city]'"
    )
    # with data.features the new columns are not features: no drift
    schema, _ = ingest(frame, prev(), features=["age", "city"])
    assert schema.features == ["age", "city"]


def test_drift_reported_before_a_columns_problem() -> None:
    frame = {"age": [1.0, np.inf], "city": ["x", "y"], "y": ["a", "b"]}
    message = fails(frame, prev(kinds={"age": "numeric", "city": "numeric"}))
    assert message == (
        f"data.source: {SRC}: the data changed since the last ingest under the same data params (1 change: 'city': "
        "numeric -> categorical). If the new data is right, accept its schema once with `trainflow stage ingest "
        "--accept-schema`, then rerun"
    )
    assert fails(frame, prev()) == (
        "data.source: f.csv, line 3, column 'age': inf is not a finite number; fix the value or add 'age' to "
        "data.exclude"
    )


def test_drift_of_text_and_image_columns_and_unknown_kinds() -> None:
    table = T(pd.DataFrame({"a": [1.0]}))
    old = prev(features=["a"], kinds={}, text_column="t", image_column="img")
    with pytest.raises(DataError) as info:
        v._check_drift(table, P(), old, ["a"], {"a": "numeric", "t": "categorical"}, {"a": "a", "t": "t"})
    assert str(info.value) == (
        f"data.source: {SRC}: the data changed since the last ingest under the same data params (3 changes: 'a': "
        "? -> numeric; 't': ? -> categorical; 'img' (?) is missing). If the new data is right, accept its schema "
        "once with `trainflow stage ingest --accept-schema`, then rerun"
    )
    same = prev(features=["a"], kinds={"a": "numeric", "t": "text"}, text_column="t")
    v._check_drift(table, P(), same, ["a"], {"a": "numeric", "t": "text"}, {"a": "a", "t": "t"})  # no drift
    # a known column present but not typed this time (excluded now) is no change
    v._check_drift(table, P(), same, ["a"], {"a": "numeric"}, {"a": "a", "t": "t"})


# --- the target: auto task -------------------------------------------------------------------------------------------


def test_auto_task_rules_and_reasons() -> None:
    a = np.array
    assert v.auto_task("y", None, 5, "booleans") == ("classification", "target 'y' holds booleans")
    assert v.auto_task("y", a([1.0, 2.25, 3.5]), 5, "") == (
        "regression", "target 'y' holds numbers with fractions (e.g. 2.25)")  # fmt: skip
    assert v.auto_task("y", a(np.arange(100.0)), 100, "") == (
        "classification", "target 'y' holds the integer codes 0..99 (100 classes)")  # fmt: skip
    assert v.auto_task("y", a(np.arange(1.0, 101.0)), 100, "") == (
        "classification", "target 'y' holds the integer codes 1..100 (100 classes)")  # fmt: skip
    assert v.auto_task("y", a(np.arange(101.0)), 1000, "") == (
        "regression", "target 'y' holds 101 distinct integers, too many to be classes of 1,000 rows")  # fmt: skip
    assert v.auto_task("y", a(np.arange(2.0, 22.0)), 200, "") == (
        "classification", "target 'y' holds 20 distinct integers, few for 200 rows")  # fmt: skip
    assert v.auto_task("y", a(np.arange(2.0, 22.0)), 199, "") == (
        "regression", "target 'y' holds 20 distinct integers, too many to be classes of 199 rows")  # fmt: skip
    assert v.auto_task("y", a(np.arange(2.0, 23.0)), 5000, "") == (
        "regression", "target 'y' holds 21 distinct integers, too many to be classes of 5,000 rows")  # fmt: skip
    assert v.auto_task("y", a([0.0, 1.0, 3.0]), 10, "") == (  # a gap: not codes, and 3 * 10 > 10 rows
        "regression", "target 'y' holds 3 distinct integers, too many to be classes of 10 rows")  # fmt: skip
    assert v.auto_task("y", a([-1.0, 0.0, 1.0]), 30, "") == (
        "classification", "target 'y' holds 3 distinct integers, few for 30 rows")  # fmt: skip
    assert v.auto_task("y", a([2.0, 3.0]), 19, "")[0] == "regression"


def test_num_label_prints_integers_without_a_fraction() -> None:
    assert [v._num_label(x) for x in (1.0, -2.0, 2.5, np.float64(3.0), 1e20)] == [
        "1", "-2", "2.5", "3", "100000000000000000000"]  # fmt: skip


def test_auto_task_on_ingest_and_its_reason() -> None:
    y = [0, 1, 2, 3] * 3
    schema, out = ingest({"x": np.arange(12.0), "y": y})
    assert (schema.task, schema.task_reason) == (
        "classification",
        "target 'y' holds the integer codes 0..3 (4 classes)",
    )
    assert schema.classes == ["0", "1", "2", "3"] and out["y"].tolist() == [str(i) for i in y]
    schema, out = ingest({"x": np.arange(4.0), "y": [1.5, 2.0, 1.5, 3.0]})
    assert (schema.task, schema.task_reason) == ("regression", "target 'y' holds numbers with fractions (e.g. 1.5)")
    assert out["y"].tolist() == [1.5, 2.0, 1.5, 3.0]
    schema, _ = ingest({"x": np.arange(4.0), "y": ["b", "a", "b", "a"]})
    assert (schema.task, schema.task_reason) == ("classification", "target 'y' holds text labels")
    schema, _ = ingest({"x": np.arange(4.0), "y": [True, False, True, False]})
    assert (schema.task, schema.task_reason, schema.classes) == (
        "classification", "target 'y' holds booleans", ["False", "True"])  # fmt: skip
    # numbers written as text: decided as numbers, "01" and "1" being one value
    schema, out = ingest({"x": np.arange(5.0), "y": pd.Series(["01", "1", " 2", "3", "1"], dtype=object)})
    assert (schema.task, schema.task_reason) == (
        "classification",
        "target 'y' holds the integer codes 1..3 (3 classes)",
    )
    assert schema.classes == ["1", "2", "3"] and out["y"].tolist() == ["1", "1", "2", "3", "1"]


def test_task_from_params_or_the_previous_ingest() -> None:
    frame = {"age": np.arange(4.0), "city": ["p", "q", "p", "q"], "y": [1, 2, 1, 2]}
    schema, out = ingest(frame, task="regression")
    assert (schema.task, schema.task_reason, schema.classes) == ("regression", "data.task is regression", [])
    assert out["y"].dtype == np.float64 and out["y"].tolist() == [1.0, 2.0, 1.0, 2.0]
    schema, out = ingest(frame, task="classification")
    assert (schema.task, schema.task_reason) == ("classification", "data.task is classification")
    old = prev(task="regression", classes=[], task_reason="")
    schema, _ = ingest(frame, old)
    assert (schema.task, schema.task_reason) == ("regression", "the previous ingest found regression")
    schema, _ = ingest(frame, prev(task="regression", classes=[], task_reason="because"))
    assert (schema.task, schema.task_reason) == ("regression", "because")
    schema, out = ingest(frame, prev(classes=["2", "1"], task_reason="kept"))
    assert (schema.task, schema.task_reason, schema.classes) == ("classification", "kept", ["2", "1"])
    assert out["y"].tolist() == ["1", "2", "1", "2"]
    # data.task wins over the previous ingest
    schema, _ = ingest(frame, old, task="classification")
    assert (schema.task, schema.task_reason) == ("classification", "data.task is classification")


# --- the target: values and problems ---------------------------------------------------------------------------------


def test_regression_targets_as_float64() -> None:
    frame = pd.DataFrame({"x": np.arange(4.0), "y": [1.5, 2.0, 1.5, 3.0]})
    out = ingest(frame)[1]
    assert np.shares_memory(out["y"].to_numpy(), frame["y"].to_numpy())  # shared, not copied
    out = ingest(frame, task="regression")[1]
    assert np.shares_memory(out["y"].to_numpy(), frame["y"].to_numpy())
    schema, out = ingest({"x": np.arange(3.0), "y": pd.array([1, 5, 2], dtype="Int64")}, task="regression")
    assert out["y"].dtype == np.float64 and out["y"].tolist() == [1.0, 5.0, 2.0]
    schema, out = ingest({"x": np.arange(3.0), "y": pd.Series(["1.5", " 2", "1.5"], dtype=object)}, task="regression")
    assert out["y"].dtype == np.float64 and out["y"].tolist() == [1.5, 2.0, 1.5]
    schema, out = ingest({"x": np.arange(3.0), "y": pd.Series([1, 2.5, 1], dtype=object)})
    assert schema.task == "regression" and out["y"].dtype == np.float64 and out["y"].tolist() == [1.0, 2.5, 1.0]
    # integers too many to be classes
    schema, out = ingest({"x": np.arange(25.0), "y": np.arange(2, 27)})
    assert schema.task == "regression" and out["y"].dtype == np.float64 and out["y"].tolist() == list(range(2, 27))


def test_non_finite_targets_name_the_first_row() -> None:
    msg = "data.source: f.csv, line {}, column 'y': the target {} is not a finite number; fix the value"
    assert fails({"x": np.arange(4.0), "y": [1.0, 2.0, np.inf, -np.inf]}, task="regression") == msg.format(4, "inf")
    assert fails({"x": np.arange(4.0), "y": [1.0, -np.inf, 2.0, np.inf]}) == msg.format(3, "-inf")
    y = pd.Series([1, 2.5, float("inf")], dtype=object)
    assert fails({"x": np.arange(3.0), "y": y}) == msg.format(4, "inf")
    assert fails({"x": np.arange(3.0), "y": y}, task="regression") == msg.format(4, "inf")


def test_a_regression_target_that_is_not_numbers() -> None:
    frame = {"x": np.arange(3.0), "y": pd.Series(["1.5", "inf", "lots"], dtype=object)}
    assert fails(frame, task="regression") == (
        "data.source: f.csv, line 3, column 'y': 'inf' is not a finite number, but data.task is regression: a "
        "regression target must be numbers; fix the value, or set data.task: classification"
    )
    frame = {"x": np.arange(4.0), "y": [True, False, True, True]}
    assert fails(frame, task="regression") == (
        "data.source: f.csv, line 2, column 'y': the target is boolean (False, True), but data.task is regression: a "
        "regression target must be numbers; fix the value, or set data.task: classification"
    )
    old = prev(task="regression", classes=[], task_reason="fare is money")
    assert fails({"age": [1.0, 2.0], "city": ["p", "q"], "y": ["a", "b"]}, old) == (
        "data.source: f.csv, line 2, column 'y': 'a' is not a finite number, but fare is money: a regression target "
        "must be numbers; fix the value, or set data.task: classification"
    )
    # text labels with task classification are labels, stripped
    schema, out = ingest({"x": np.arange(3.0), "y": pd.Series(["inf", " b", "inf"], dtype=object)})
    assert schema.classes == ["b", "inf"] and out["y"].tolist() == ["inf", "b", "inf"]


def test_a_constant_regression_target_is_refused() -> None:
    assert fails({"x": np.arange(3.0), "y": [2.5, 2.5, 2.5]}) == (
        f"data.source: {SRC}, column 'y': every target value is 2.5; there is nothing to learn, check data.target"
    )
    frame = {"x": np.arange(3.0), "y": [np.nan, 7.0, 7.0]}
    assert fails(frame, task="regression", missing_target="drop") == (
        f"data.source: {SRC}, column 'y': every target value is 7; there is nothing to learn, check data.target"
    )


def test_classification_labels_of_numbers() -> None:
    schema, out = ingest({"x": np.arange(5.0), "y": [3, 1, 2, 10, 3]}, task="classification")
    assert schema.classes == ["1", "2", "3", "10"] and out["y"].tolist() == ["3", "1", "2", "10", "3"]
    schema, out = ingest({"x": np.arange(4.0), "y": [2.0, 0.5, 2.0, 1.0]}, task="classification")
    assert schema.classes == ["0.5", "1", "2"] and out["y"].tolist() == ["2", "0.5", "2", "1"]
    big = np.array([2**62 + 1, 2**62], dtype=np.int64)  # ints keep their digits (as floats they would be one)
    schema, out = ingest({"x": np.arange(2.0), "y": big}, task="classification")
    assert out["y"].tolist() == [str(2**62 + 1), str(2**62)]
    schema, out = ingest({"x": np.arange(3.0), "y": pd.Series([1, 2.0, 1.0], dtype=object)}, task="classification")
    assert schema.classes == ["1", "2"] and out["y"].tolist() == ["1", "2", "1"]
    assert out["y"].dtype == object


def test_missing_target_values_error_or_drop(capsys: pytest.CaptureFixture[str]) -> None:
    frame = {"x": np.arange(5.0), "y": pd.Series(["a", " ", "b", None, "a"], dtype=object)}
    assert fails(frame) == (
        "data.source: f.csv, line 3, column 'y': the target value is missing (2 rows without one); fill in the "
        "labels, or set data.missing_target: drop"
    )
    frame1 = {"x": np.arange(3.0), "y": [1.5, np.nan, 2.5]}
    assert fails(frame1) == (
        "data.source: f.csv, line 3, column 'y': the target value is missing (1 row without one); fill in the "
        "labels, or set data.missing_target: drop"
    )
    blank = {"x": np.arange(2.0), "y": pd.Series(["", None], dtype=object)}
    assert fails(blank, missing_target="drop") == (
        "data.source: f.csv, line 2, column 'y': the target value is missing (2 rows without one); fill in the label"
    )
    capsys.readouterr()
    schema, out = ingest(frame, missing_target="drop")
    assert capsys.readouterr().err == (
        "ingest: dropped 2 rows without a target value 'y' (data.missing_target: drop)\n"
    )
    assert (schema.n_rows, schema.dropped, schema.classes) == (3, {"missing_target": 2}, ["a", "b"])
    assert out["y"].tolist() == ["a", "b", "a"] and out["x"].tolist() == [0.0, 2.0, 4.0]
    schema, out = ingest(frame1, missing_target="drop")
    assert capsys.readouterr().err == "ingest: dropped 1 row without a target value 'y' (data.missing_target: drop)\n"
    assert (schema.task, schema.n_rows, schema.dropped) == ("regression", 2, {"missing_target": 1})
    assert out["y"].tolist() == [1.5, 2.5]


def test_missing_target_rows() -> None:
    s = pd.Series(["a", "", "  ", None, np.nan, "b"], dtype=object)
    assert v._missing_target_rows(s).tolist() == [False, True, True, True, True, False]
    s = pd.Series(["a", "", None], dtype="string")
    assert v._missing_target_rows(s).tolist() == [False, True, True]
    s = pd.Series(["a", " ", None], dtype="str")
    assert v._missing_target_rows(s).tolist() == [False, True, True]
    assert v._missing_target_rows(pd.Series([1.0, np.nan, 0.0])).tolist() == [False, True, False]
    filled, missing = v._without_missing(T(None), P(missing_target="drop"), pd.Series([np.nan, 4.0, np.nan, 5.0]))
    assert filled.tolist() == [4.0, 4.0, 4.0, 5.0] and missing is not None and missing.tolist() == [
        True, False, True, False]  # fmt: skip
    s = pd.Series([1.0, 2.0])
    same, none = v._without_missing(T(None), P(), s)
    assert same is s and none is None


def test_the_auto_task_counts_the_rows_with_a_target() -> None:
    # 20 distinct integers 2..21 on 200 rows + 1 without a target: classes with 10 rows each of the 200 kept
    y = list(np.repeat(np.arange(2, 22), 10).astype(float)) + [np.nan]
    schema, _ = ingest({"x": np.arange(201.0), "y": y}, missing_target="drop")
    assert (schema.task, schema.task_reason) == (
        "classification",
        "target 'y' holds 20 distinct integers, few for 200 rows",
    )
    y = list(np.repeat(np.arange(2, 22), 10).astype(float))
    y[5] = np.nan  # 199 rows with a target
    schema, _ = ingest({"x": np.arange(200.0), "y": y}, missing_target="drop")
    assert (schema.task, schema.task_reason) == (
        "regression", "target 'y' holds 20 distinct integers, too many to be classes of 199 rows")  # fmt: skip


# --- classes ---------------------------------------------------------------------------------------------------------


def test_mostly_single_row_classes_are_refused_in_auto() -> None:
    # 10 classes, 6 of one row: more than half
    y = list("abcdef") + ["g"] * 2 + ["h"] * 2 + ["i"] * 2 + ["j"] * 2
    assert fails({"x": np.arange(14.0), "y": y}) == (
        f"data.source: {SRC}, column 'y': as classes, the target has 10 of them and 6 have a single row; check "
        "data.target (is it an id or a free-text column?), or set data.task: classification to train on it anyway"
    )
    # 5 of 10: not more than half
    y5 = list("abcde") + ["f"] * 2 + ["g"] * 2 + ["h"] * 2 + ["i"] * 2 + ["j"] * 2
    schema, _ = ingest({"x": np.arange(15.0), "y": y5})
    assert len(schema.classes) == 10
    # 9 classes of one row each: too few classes to tell
    schema, _ = ingest({"x": np.arange(9.0), "y": list("abcdefghi")})
    assert len(schema.classes) == 9
    # with data.task: classification, or a previous ingest, it is the user's choice
    schema, _ = ingest({"x": np.arange(14.0), "y": y}, task="classification")
    assert len(schema.classes) == 10
    # integer codes, one row each
    ids = [f"id{i}" for i in range(1001)] + ["id0"]
    assert fails({"x": np.arange(1002.0), "y": ids}) == (
        f"data.source: {SRC}, column 'y': as classes, the target has 1,001 of them and 1,000 have a single row; "
        "check data.target (is it an id or a free-text column?), or set data.task: classification to train on it "
        "anyway"
    )
    assert fails({"x": np.arange(12.0), "y": np.arange(12)}) == (
        f"data.source: {SRC}, column 'y': as classes, the target has 12 of them and 12 have a single row; it looks "
        "like a number to predict: set data.task: regression"
    )


def test_single_row_classes_counted_over_the_rows_with_a_target() -> None:
    # 6 single-row classes of 10 once the row without a target is left out; counted with it (filled by the first
    # label, 'a'), 'a' would have two rows and only 5 of 10 would be single
    y: list[Any] = list("abcdef") + ["g"] * 2 + ["h"] * 2 + ["i"] * 2 + ["j"] * 2 + [None]
    assert fails({"x": np.arange(15.0), "y": pd.Series(y, dtype=object)}, missing_target="drop") == (
        f"data.source: {SRC}, column 'y': as classes, the target has 10 of them and 6 have a single row; check "
        "data.target (is it an id or a free-text column?), or set data.task: classification to train on it anyway"
    )


def test_classes_sorted_by_value_or_text_and_a_single_class_refused(capsys: pytest.CaptureFixture[str]) -> None:
    schema, _ = ingest({"x": np.arange(4.0), "y": pd.Series(["10", "9", "x", "9"], dtype=object)})
    assert schema.classes == ["10", "9", "x"]
    schema, _ = ingest({"x": np.arange(4.0), "y": ["10", "9", "-1", "9"]}, task="classification")
    assert schema.classes == ["-1", "9", "10"]
    assert fails({"x": np.arange(2.0), "y": ["a", "a"]}) == (
        f"data.source: {SRC}, column 'y': the target has a single class ('a'); a classifier needs at least two, "
        "check data.target and the data"
    )
    # the classes are those of the rows kept: 'b' only in a dropped row
    assert fails({"x": [1.0, np.nan, 2.0], "y": ["a", "b", "a"]}, missing="drop") == (
        f"data.source: {SRC}, column 'y': the target has a single class ('a'); a classifier needs at least two, "
        "check data.target and the data"
    )
    schema, _ = ingest({"x": [1.0, np.nan, 2.0, 3.0], "y": ["a", "b", "c", "a"]}, missing="drop")
    assert schema.classes == ["a", "c"]
    capsys.readouterr()
    schema, _ = ingest({"x": np.arange(6.0), "y": ["Spam", "spam", "A", "a", "SPAM", "b"]})
    assert schema.classes == ["A", "SPAM", "Spam", "a", "b", "spam"]
    assert capsys.readouterr().err == (
        "ingest: warning: target 'y' has labels that differ only in case ('A'/'a', 'SPAM'/'Spam'/'spam'); they stay "
        "separate classes, fix the data if they are the same\n"
    )
    ingest({"x": np.arange(3.0), "y": ["a", "b", "a"]})
    assert capsys.readouterr().err == ""


def test_unseen_labels_error_or_drop(capsys: pytest.CaptureFixture[str]) -> None:
    frame = {"age": np.arange(5.0), "city": list("pqpqp"), "y": ["a", "new", "b", "old", "new"]}
    assert fails(frame, prev()) == (
        "data.source: f.csv, line 3, column 'y': label 'new' is not among the classes the current model was trained "
        "on ('b', 'a'); unseen labels 'new', 'old' in 3 rows. Set data.unseen_labels: drop to drop those rows, or "
        "accept the new labels once with `trainflow stage ingest --accept-schema`, then rerun"
    )
    one = {"age": np.arange(3.0), "city": list("pqp"), "y": ["a", "b", "c"]}
    assert fails(one, prev()) == (
        "data.source: f.csv, line 4, column 'y': label 'c' is not among the classes the current model was trained "
        "on ('b', 'a'); unseen labels 'c' in 1 row. Set data.unseen_labels: drop to drop those rows, or "
        "accept the new labels once with `trainflow stage ingest --accept-schema`, then rerun"
    )
    capsys.readouterr()
    schema, out = ingest(frame, prev(), unseen_labels="drop")
    assert capsys.readouterr().err == (
        "ingest: dropped 3 rows whose target 'y' has a label the current model was not trained on ('new', 'old'; "
        "data.unseen_labels: drop)\n"
    )
    assert (schema.n_rows, schema.dropped, schema.classes) == (2, {"unseen_labels": 3}, ["b", "a"])
    assert out["y"].tolist() == ["a", "b"] and out["age"].tolist() == [0.0, 2.0]
    schema, out = ingest(one, prev(), unseen_labels="drop")
    assert capsys.readouterr().err == (
        "ingest: dropped 1 row whose target 'y' has a label the current model was not trained on ('c'; "
        "data.unseen_labels: drop)\n"
    )
    assert (schema.n_rows, schema.dropped) == (2, {"unseen_labels": 1})
    # a previous regression ingest knows no classes: no unseen labels when data.task says classification
    schema, _ = ingest(one, prev(task="regression", classes=[]), task="classification")
    assert schema.classes == ["a", "b", "c"] and schema.dropped == {}


def test_rows_dropped_for_several_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    frame = {
        "age": [1.0, 2.0, np.nan, 4.0, 5.0, 1.0, 7.0],
        "city": ["p", "q", "p", "q", "p", "p", "q"],
        "y": ["a", None, "a", "new", "b", "a", "b"],
    }
    schema, out = ingest(frame, prev(), missing_target="drop", unseen_labels="drop", missing="drop",
                         duplicates="drop")  # fmt: skip
    assert list(schema.dropped.items()) == [("missing_target", 1), ("unseen_labels", 1), ("missing", 1),
                                            ("duplicates", 1)]  # fmt: skip
    assert schema.n_rows == 3 and schema.classes == ["b", "a"]
    assert out["age"].tolist() == [1.0, 5.0, 7.0] and out["y"].tolist() == ["a", "b", "b"]
    raw = pd.DataFrame(frame)
    keys = pd.util.hash_pandas_object(raw, index=False).to_numpy(dtype=np.uint64)
    assert out[ROW_KEY].tolist() == keys[[0, 4, 6]].tolist() and list(out.index) == [0, 1, 2]


def test_no_rows_left_names_every_reason() -> None:
    frame = {"x": [np.nan, np.nan, 1.0], "y": ["a", "b", None]}
    assert fails(frame, missing="drop", missing_target="drop") == (
        f"data.source: {SRC}: no rows left after dropping 3 of 3 (missing_target: 1, missing: 2); fix the data or "
        "set data.missing/data.duplicates/data.unseen_labels to keep them"
    )


# --- missing feature values and duplicate rows -----------------------------------------------------------------------


def test_missing_values_error_names_the_first_row_and_its_first_column() -> None:
    frame = {"x": [1.0, 2.0, 3.0, np.nan], "c": pd.Series(["p", None, "q", None], dtype=object), "y": list("abab")}
    assert fails(frame, missing="error") == (
        "data.source: f.csv, line 3, column 'c': the value is missing (2 rows have missing values; data.missing: "
        "error); fill it in, or set data.missing: impute or drop"
    )
    one = {"x": [1.0, np.nan, 3.0], "c": pd.Series(["p", None, "q"], dtype=object), "y": list("aba")}
    assert fails(one, missing="error") == (
        "data.source: f.csv, line 3, column 'x': the value is missing (1 row has missing values; data.missing: "
        "error); fill it in, or set data.missing: impute or drop"
    )
    # rows already dropped (no target) are not counted
    frame = {"x": [np.nan, 2.0, np.nan, 1.0, 3.0], "y": pd.Series([None, "a", "b", "a", "b"], dtype=object)}
    assert fails(frame, missing="error", missing_target="drop") == (
        "data.source: f.csv, line 4, column 'x': the value is missing (1 row has missing values; data.missing: "
        "error); fill it in, or set data.missing: impute or drop"
    )
    schema, out = ingest(frame, missing="drop", missing_target="drop")
    assert schema.dropped == {"missing_target": 1, "missing": 1} and out["x"].tolist() == [2.0, 1.0, 3.0]
    # a missing text or boolean value counts too; none missing: nothing dropped (but counted as 0)
    frame = {"b": pd.array([True, None, False, False], dtype="boolean"), "t": ["w", "v", None, "u"], "y": list("abab")}
    schema, out = ingest(frame, missing="drop", text_column="t")
    assert schema.dropped == {"missing": 2} and out["b"].tolist() == [True, False]
    schema, out = ingest({"x": [1.0, 2.0], "y": ["a", "b"]}, missing="drop")
    assert (schema.dropped, schema.n_rows) == ({"missing": 0}, 2)
    schema, out = ingest({"x": [1.0, 2.0], "y": ["a", "b"]}, missing="error")
    assert (schema.dropped, schema.n_rows) == ({"missing": 0}, 2)
    schema, out = ingest({"x": [1.0, np.nan], "y": ["a", "b"]})  # impute: not checked
    assert (schema.dropped, schema.n_rows) == ({}, 2)


def test_missing_of_no_columns_keeps_the_rows_as_they_are() -> None:
    keep = np.array([True, False])
    assert v._missing(T(pd.DataFrame({"y": [1, 2]})), P(missing="drop"), [], keep, {}) is keep


DUPS = {"x": [1.0, 2.0, 1.0, 3.0, 2.0, 1.0], "c": list("pqppqp"), "y": list("abaabb")}


def test_duplicates_error_names_the_row_and_the_earlier_one() -> None:
    assert fails(DUPS, duplicates="error") == (
        "data.source: f.csv, line 4: the row duplicates f.csv, line 2 (2 duplicate rows; data.duplicates: error); "
        "remove the duplicates, or set data.duplicates: keep or drop"
    )
    one = {"x": [1.0, 2.0, 3.0, 2.0], "y": list("abab")}
    assert fails(one, duplicates="error") == (
        "data.source: f.csv, line 5: the row duplicates f.csv, line 3 (1 duplicate row; data.duplicates: error); "
        "remove the duplicates, or set data.duplicates: keep or drop"
    )
    # a duplicate of a dropped row: the earlier row is dropped for the same reason, so this one is not counted
    dropped = {"x": [np.nan, 2.0, np.nan, 3.0, 3.0], "y": list("abaaa")}
    assert fails(dropped, duplicates="error", missing="drop") == (
        "data.source: f.csv, line 6: the row duplicates f.csv, line 5 (1 duplicate row; data.duplicates: error); "
        "remove the duplicates, or set data.duplicates: keep or drop"
    )
    schema, out = ingest(dropped, duplicates="drop", missing="drop")
    assert schema.dropped == {"missing": 2, "duplicates": 1} and out["x"].tolist() == [2.0, 3.0]
    schema, out = ingest({"x": [1.0, 2.0], "y": ["a", "b"]}, duplicates="drop")
    assert schema.dropped == {"duplicates": 0}
    schema, out = ingest({"x": [1.0, 2.0], "y": ["a", "b"]}, duplicates="error")
    assert schema.dropped == {"duplicates": 0}
    schema, out = ingest({"x": [1.0, 1.0, 2.0], "y": ["a", "a", "b"]})  # keep: not checked
    assert (schema.dropped, schema.n_rows) == ({}, 3)


def test_duplicated_is_pandas_duplicated() -> None:
    frame = pd.DataFrame({"a": [1.0, 2.0, 1.0, 1.0, 2.0], "b": ["x", "y", "x", "z", "y"]})
    columns = v._FrameColumns(frame)
    assert columns.names == ["a", "b"]
    want_b = pd.util.hash_pandas_object(frame["b"], index=False).to_numpy(dtype=np.uint64)
    np.testing.assert_array_equal(columns.hashes("b"), want_b)
    hashes = v._hashes(columns)
    np.testing.assert_array_equal(hashes, pd.util.hash_pandas_object(frame, index=False).to_numpy(dtype=np.uint64))
    assert v._duplicated(columns, hashes).tolist() == frame.duplicated().tolist() == [False, False, True, False, True]
    # rows whose hashes collide but whose values differ are not duplicates
    fake = np.array([7, 7, 7, 8, 9], dtype=np.uint64)
    assert v._duplicated(columns, fake).tolist() == [False, False, True, False, False]
    assert v._duplicated(columns, np.arange(5, dtype=np.uint64)).tolist() == [False] * 5
    assert columns.take(np.array([3, 0])).index.tolist() == [3, 0]


# --- a table spilled to disk -----------------------------------------------------------------------------------------


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


# --- the whole schema, and rows keyed by their raw values ------------------------------------------------------------


def test_the_whole_schema_of_an_ingest() -> None:
    frame = {"x": [1.0, 2.0, 3.0], "t": ["a b", "c", "d"], "id": [7, 8, 9], "y": pd.Series([True, False, True],
                                                                                             dtype=object)}  # fmt: skip
    schema, out = ingest(frame, exclude=["id"], text_column="t")
    assert schema == Schema(
        source=SRC,
        target="y",
        task="classification",
        features=["x"],
        kinds={"x": "numeric", "t": "text"},
        classes=["False", "True"],
        n_rows=3,
        text_column="t",
        dropped={},
        task_reason="target 'y' holds booleans",
        carried=["id"],
        data_params={"source": "builtin:digits", "format": "auto", "delimiter": None, "header": True,
                     "header_rows": 1, "quoting": "auto", "columns": None, "encoding": "utf-8", "target": "y",
                     "task": "auto", "features": None, "exclude": ["id"], "text_column": "t", "image_column": None},
        image_column=None,
    )  # fmt: skip
    assert out["y"].tolist() == ["True", "False", "True"]


def test_row_keys_of_a_table_with_nested_values_carried_along() -> None:
    tags = pd.Series([[1, 2], {"k": 1}, None], dtype=object)
    frame = pd.DataFrame({"x": [1.0, 2.0, 3.0], "tags": tags, "y": ["a", "b", "a"]})
    schema, out = ingest(frame, exclude=["tags"])
    assert schema.carried == ["tags"] and out["tags"].dtype == "string"
    assert out["tags"].tolist() == ["[1, 2]", "{'k': 1}", pd.NA]
    as_str = pd.Series(["[1, 2]", "{'k': 1}", None], dtype="str")  # what astype(str) makes of them
    text = pd.DataFrame({"x": [1.0, 2.0, 3.0], "tags": as_str, "y": pd.Series(["a", "b", "a"], dtype="str")})
    expected = pd.util.hash_pandas_object(text, index=False).to_numpy(dtype=np.uint64)
    assert out[ROW_KEY].tolist() == expected.tolist()


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


def test_row_share_of_a_single_row() -> None:
    assert v._row_share(np.array([True]), np.array([0])) == 1.0
    assert v._row_share(np.array([True, False]), np.array([1, -1, 0])) == 0.5


def test_object_targets_of_booleans_and_integers() -> None:
    schema, out = ingest({"x": np.arange(4.0), "y": pd.Series([1, 2, 1, 2], dtype=object)})
    assert (schema.task, schema.classes, out["y"].tolist()) == ("classification", ["1", "2"], ["1", "2", "1", "2"])
    assert schema.task_reason == "target 'y' holds the integer codes 1..2 (2 classes)"
    schema, out = ingest({"x": np.arange(3.0), "y": pd.Series([0.5, 1.5, 0.5], dtype=object)})
    assert (schema.task, out["y"].tolist()) == ("regression", [0.5, 1.5, 0.5])
    frame = {"x": np.arange(3.0), "y": pd.Series([True, None, False], dtype=object)}
    schema, out = ingest(frame, missing_target="drop")
    assert (schema.task, schema.classes, out["y"].tolist()) == ("classification", ["False", "True"], ["True", "False"])


def test_python_and_numpy_dates_past_2262_are_read_as_utc_timestamps() -> None:
    """Object columns of dates (with a missing value) and of numpy datetime64 values are typed as dates in UTC, not
    as their text: the value out of range is shown as the UTC timestamp it was read as."""
    days = pd.Series([datetime.date(2026, 1, 1), datetime.date(3000, 1, 1), None], dtype=object)
    c = col({"c": days})
    assert (c.kind, str(c.problem)) == ("datetime", (
        "data.source: f.csv, line 3, column 'c': 3000-01-01 00:00:00+00:00 is out of the supported date range "
        "(1677-2262); fix it or add 'c' to data.exclude"))  # fmt: skip
    np.testing.assert_array_equal(c.values, np.array(["2026-01-01", "NaT", "NaT"], dtype="datetime64[ns]"))
    stamps = pd.Series([np.datetime64("2026-01-01T10:00"), np.datetime64("3000-01-01"), None], dtype=object)
    c = col({"c": stamps})
    assert (c.kind, str(c.problem)) == ("datetime", (
        "data.source: f.csv, line 3, column 'c': 3000-01-01 00:00:00+00:00 is out of the supported date range "
        "(1677-2262); fix it or add 'c' to data.exclude"))  # fmt: skip
    np.testing.assert_array_equal(c.values, np.array(["2026-01-01T10:00", "NaT", "NaT"], dtype="datetime64[ns]"))


def test_text_held_by_arrow_factorizes_as_pandas_does_in_int32(monkeypatch: pytest.MonkeyPatch) -> None:
    """Codes in order of first appearance, -1 for missing, over several Arrow chunks (a spilled column's files): the
    same as pd.factorize on the same values as Python objects (the reference), at 4 bytes a code."""
    import pyarrow as pa

    rng = np.random.default_rng(0)
    words = np.array(["ant", "bee", "", "cat", "é", "dog"], dtype=object)
    values = words[rng.integers(0, len(words), 300)]
    values[rng.random(300) < 0.1] = None
    chunks = [pa.array(list(values[lo : lo + 70]), pa.string()) for lo in range(0, 300, 70)]
    s = pd.Series(pd.arrays.ArrowStringArray(pa.chunked_array(chunks)))
    assert s.array._pa_array.num_chunks == 5
    codes, uniques = v._factorize(None, "c", s)  # type: ignore[arg-type]
    want_codes, want_uniques = pd.factorize(pd.Series(values, dtype=object))
    assert codes.dtype == np.int32 and np.array_equal(codes, want_codes)
    assert uniques.dtype == object and uniques.tolist() == list(want_uniques)
    monkeypatch.setattr(pd, "factorize", lambda *a: pytest.fail("pandas' factorize for text held by Arrow"))
    assert np.array_equal(v._factorize(None, "c", s.iloc[:0])[0], np.zeros(0, np.int32))  # type: ignore[arg-type]


def test_codes_per_row_take_4_bytes_a_row_where_the_distinct_values_allow() -> None:
    """The target's class codes are int32, as Arrow's encoding makes them (60M rows: 240 MB less at ingest's peak
    than int64), and the same codes; a categorical whose values print the same (1 and "1") merges them."""
    frame = pd.DataFrame({"x": pd.Series([1, "1", "b", None, "b"], dtype=object), "y": ["n", "m", "n", "n", "m"]})
    target = v._target(T(frame), P(), "y", None)
    assert target.codes is not None and target.codes.dtype == np.int32
    assert target.codes.tolist() == pd.factorize(frame["y"])[0].tolist() and target.labels == ["n", "m"]
    col = v._column(T(frame), P(), "x")
    assert col.kind == "categorical" and col.get().tolist() == ["1", "1", "b", None, "b"] and col.distinct == 2
    # held as codes into the distinct values (no object per row), int32 too
    assert col.codes is not None and col.codes.dtype == np.int32 and col.values.tolist() == ["1", "b"]


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
