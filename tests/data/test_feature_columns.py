"""Ingest's feature columns (trainflow.data.validate): the columns the params name against the table's (with a
delimiter hint where the header was read as one column), each column's kind and typed values (numbers, booleans, dates
and categories, also written as text, with the 95% rule for a stray value), the text and image columns, id-like
features warned about, and the words of every message, on tables small enough to work out by hand."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import numpy as np
import pandas as pd
import pytest
from support.ingest_checks import SRC, P, T, fails, ingest

from trainflow.core.errors import DataError
from trainflow.data import validate as v
from trainflow.data.schema import ROW_KEY


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


def test_row_share_of_a_single_row() -> None:
    assert v._row_share(np.array([True]), np.array([0])) == 1.0
    assert v._row_share(np.array([True, False]), np.array([1, -1, 0])) == 0.5


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
