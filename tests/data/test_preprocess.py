"""Preprocessing: statistics from train only, each kind's transform, text tokens, images, labels, and the JSON
round trip; the whole fitted state and every message, on tables small enough to work out by hand."""

from __future__ import annotations

import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support.preprocessing import TABULAR, fit, message, schema, tabular_train
from support.preprocessing import schema as schema_for

from trainflow.core.errors import DataError
from trainflow.data.preprocess import CLS_ID, PAD_ID, UNK_ID, Column, Preprocessor, encode, train_tokenizer
from trainflow.data.schema import Kind, Schema
from trainflow.params import FeatureParams

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "omega"]


def column(pre: Preprocessor, x: np.ndarray, name: str) -> np.ndarray:
    return x[:, pre.output_names.index(name)]


def mixed_frame(n: int, seed: int) -> pd.DataFrame:
    """All four tabular kinds with missing values, typed as the processed table is."""
    rng = np.random.default_rng(seed)
    num = rng.normal(10.0, 3.0, n)
    num[rng.random(n) < 0.1] = np.nan
    flag = pd.array(rng.random(n) < 0.3, dtype="boolean")
    flag[rng.random(n) < 0.1] = pd.NA
    cat = rng.choice(["red", "green", "blue", "teal"], n).astype(object)
    cat[rng.random(n) < 0.1] = None
    when = pd.Series(pd.to_datetime(rng.integers(1_500_000_000, 1_700_000_000, n), unit="s"))
    when[rng.random(n) < 0.1] = pd.NaT
    return pd.DataFrame(
        {"num": num, "flag": flag, "cat": pd.Series(cat, dtype="string"), "when": when, "y": rng.choice(["a", "b"], n)}
    )


MIXED: dict[str, Kind] = {"num": "numeric", "flag": "boolean", "cat": "categorical", "when": "datetime"}


# --- numeric ------------------------------------------------------------------------------------------------------


def test_numeric_statistics_come_from_train_only() -> None:
    train = pd.DataFrame({"x": [1.0, 2.0, 3.0, np.nan, 10.0], "y": ["a", "b", "a", "b", "a"]})
    val = pd.DataFrame({"x": [100.0, 200.0, np.nan], "y": ["a", "a", "b"]})
    pre = fit(train, schema_for({"x": "numeric"}))
    median = 2.5  # of the present train values
    imputed = np.array([1.0, 2.0, 3.0, median, 10.0])
    mean, std = imputed.mean(), imputed.std()

    x_train = column(pre, pre.features(train), "x")
    np.testing.assert_allclose(x_train, (imputed - mean) / std, rtol=1e-6)
    assert abs(x_train.mean()) < 1e-6 and abs(x_train.std() - 1) < 1e-6

    # Val has a very different distribution: it is transformed with train's median, mean and std, not its own.
    x_val = column(pre, pre.features(val, "val"), "x")
    np.testing.assert_allclose(x_val, (np.array([100.0, 200.0, median]) - mean) / std, rtol=1e-6)
    # Transforming a frame never refits: the same rows give the same values, alone or among others.
    np.testing.assert_array_equal(pre.features(val.iloc[[2]]), pre.features(val)[[2]])


def test_constant_and_all_missing_numeric_columns() -> None:
    train = pd.DataFrame({"c": [5.0, 5.0, 5.0], "m": [np.nan] * 3, "inf": [1.0, np.inf, 3.0], "y": ["a"] * 3})
    pre = fit(train, schema_for(dict.fromkeys(["c", "m", "inf"], "numeric")))
    x = pre.features(train)
    assert np.isfinite(x).all()
    np.testing.assert_array_equal(column(pre, x, "c"), 0.0)  # std 0 -> 1: centred only
    np.testing.assert_array_equal(column(pre, x, "m:missing"), 1.0)
    np.testing.assert_array_equal(column(pre, x, "inf:missing"), [0.0, 1.0, 0.0])  # inf counts as missing


def test_missing_indicators() -> None:
    train = pd.DataFrame({"gappy": [1.0, np.nan, 3.0], "full": [1.0, 2.0, 3.0], "y": ["a", "b", "a"]})
    val = pd.DataFrame({"gappy": [np.nan, 5.0], "full": [np.nan, 2.0], "y": ["a", "b"]})
    pre = fit(train, schema_for({"gappy": "numeric", "full": "numeric"}))
    assert pre.output_names == ["gappy", "gappy:missing", "full"]  # only columns missing in train get one
    x = pre.features(val, "val")
    np.testing.assert_array_equal(column(pre, x, "gappy:missing"), [1.0, 0.0])
    np.testing.assert_allclose(column(pre, x, "full"), [0.0, 0.0], atol=1e-6)  # imputed with train's median 2

    off = fit(train, schema_for({"gappy": "numeric", "full": "numeric"}), missing_indicators=False)
    assert off.output_names == ["gappy", "full"]


def test_numeric_input_as_strings_and_bad_values() -> None:
    train = pd.DataFrame({"x": [1.0, 2.0, 3.0], "y": ["a", "b", "a"]})
    pre = fit(train, schema_for({"x": "numeric"}))
    as_text = pd.DataFrame({"x": ["1", "3", ""]}, dtype=object)  # e.g. JSON or CSV prediction input
    np.testing.assert_allclose(pre.features(as_text)[:, 0], pre.features(pd.DataFrame({"x": [1.0, 3.0, 2.0]}))[:, 0])
    with pytest.raises(DataError, match=r"predict\.csv.*'x'.*numbers.*'oops'"):
        pre.features(pd.DataFrame({"x": ["1", "oops"]}), "predict.csv")


def test_a_numeric_column_of_whole_numbers_as_strings_fits_and_transforms_as_the_numbers() -> None:
    """Whole numbers given as text, none missing (pandas parses them to int64, not float64): the same fit and the same
    features as the numbers themselves, in train and at prediction time."""
    schema = schema_for({"x": "numeric"})
    numbers = pd.DataFrame({"x": [1, 2, 3, 10], "y": ["a", "b", "a", "b"]})
    as_text = pd.DataFrame({"x": ["1", "2", "3", "10"], "y": ["a", "b", "a", "b"]}, dtype=object)
    got, want = fit(as_text, schema), fit(numbers, schema)
    assert got.to_json() == want.to_json() and want.columns[0].fill == [2.5]
    prediction_input = pd.DataFrame({"x": ["7", "1"]}, dtype=object)  # e.g. JSON or CSV read as text
    np.testing.assert_array_equal(want.features(prediction_input), want.features(pd.DataFrame({"x": [7.0, 1.0]})))
    np.testing.assert_array_equal(got.features(as_text), want.features(numbers))


# --- categorical, boolean, datetime ------------------------------------------------------------------------------


def test_categories_most_frequent_first_ties_by_value_and_unknown_column() -> None:
    train = pd.DataFrame({"c": ["b", "a", "c", "c", "b", "a", "d", None, "c"], "y": ["a"] * 9})
    pre = fit(train, schema_for({"c": "categorical"}), max_categories=2)
    # c: 3, then a and b tie at 2 (a wins by value); d and missing fall into unknown.
    assert pre.output_names == ["c=c", "c=a", "c:unknown"]
    val = pd.DataFrame({"c": ["a", "b", "never-seen", None, "c"]})
    x = pre.features(val, "val")
    expected = [[0, 1, 0], [0, 0, 1], [0, 0, 1], [0, 0, 1], [1, 0, 0]]
    np.testing.assert_array_equal(x, np.array(expected, dtype=np.float32))
    # Shuffling the train rows does not change the categories or their order.
    again = fit(train.sample(frac=1.0, random_state=3), schema_for({"c": "categorical"}), max_categories=2)
    assert again.output_names == pre.output_names


def test_categories_match_across_value_types() -> None:
    train = pd.DataFrame({"zip": ["10", "20", "10"], "y": ["a", "b", "a"]})
    pre = fit(train, schema_for({"zip": "categorical"}))
    ints = pre.features(pd.DataFrame({"zip": [10, 20, 30]}))  # parsed as numbers at prediction time
    np.testing.assert_array_equal(ints, pre.features(pd.DataFrame({"zip": ["10", "20", "30"]})))
    assert ints[:, -1].tolist() == [0, 0, 1]


def test_booleans_zero_one_with_mode_and_indicator() -> None:
    train = pd.DataFrame({"b": pd.array([True, True, False, None], dtype="boolean"), "y": ["a", "b", "a", "b"]})
    pre = fit(train, schema_for({"b": "boolean"}))
    assert pre.output_names == ["b", "b:missing"]
    x = pre.features(train)
    np.testing.assert_array_equal(x, [[1, 0], [1, 0], [0, 0], [1, 1]])  # missing -> mode True
    words = pd.DataFrame({"b": ["yes", "False", None, "1"]}, dtype=object)
    np.testing.assert_array_equal(pre.features(words), [[1, 0], [0, 0], [1, 1], [1, 0]])
    np.testing.assert_array_equal(pre.features(pd.DataFrame({"b": [False, True]})), [[0, 0], [1, 0]])
    with pytest.raises(DataError, match=r"'b'.*booleans.*'maybe'"):
        pre.features(pd.DataFrame({"b": ["yes", "maybe"]}))


@pytest.mark.parametrize(
    ("values", "fill"),
    [
        ([False, False, True, None], 0.0),
        ([True, False, None], 0.0),
        ([None, None], 0.0),
        ([True, True, False, None], 1.0),
    ],
    ids=["mostly-false", "a-tie", "all-missing", "mostly-true"],
)
def test_a_missing_boolean_is_the_majority_value_and_false_without_one(values: list[bool | None], fill: float) -> None:
    train = pd.DataFrame({"b": pd.array(values, dtype="boolean"), "y": ["a"] * len(values)})
    pre = fit(train, schema_for({"b": "boolean"}))
    assert pre.columns[0].fill == [fill]
    np.testing.assert_array_equal(pre.features(pd.DataFrame({"b": pd.array([None], dtype="boolean")}))[:, 0], [fill])


def test_datetime_parts() -> None:
    when = pd.to_datetime(["2020-01-01 10:00", "2021-06-15 00:30", "2022-03-04 23:00", None])
    train = pd.DataFrame({"t": when, "y": ["a", "b", "a", "b"]})
    pre = fit(train, schema_for({"t": "datetime"}))
    parts = ["t.year", "t.month", "t.dayofweek", "t.day", "t.hour", "t.days"]
    assert pre.output_names == [*parts, "t:missing"]
    x = pre.features(train)
    col = pre.columns[0]
    raw = x[:, :6].astype(np.float64) * np.asarray(col.scale) + np.asarray(col.center)  # undo standardisation
    present = when[:3]
    np.testing.assert_allclose(raw[:3, 0], present.year, atol=1e-3)
    np.testing.assert_allclose(raw[:3, 1], present.month, atol=1e-4)
    np.testing.assert_allclose(raw[:3, 2], present.dayofweek, atol=1e-4)
    np.testing.assert_allclose(raw[:3, 3], present.day, atol=1e-4)
    np.testing.assert_allclose(raw[:3, 4], present.hour, atol=1e-4)
    np.testing.assert_allclose(raw[:3, 5], (present - pd.Timestamp("1970-01-01")) / pd.Timedelta(days=1), rtol=1e-6)
    # The missing timestamp takes the parts of the train median (2021-06-15 00:30) and is flagged.
    np.testing.assert_array_equal(x[3], np.append(x[1, :6], 1.0))
    np.testing.assert_array_equal(x[:, 6], [0, 0, 0, 1])
    # Each part is standardised with train statistics.
    np.testing.assert_allclose(x[:, :6].mean(axis=0), 0.0, atol=1e-5)

    # Strings and time-zone-aware values are read as the same instants (in UTC).
    text = pd.DataFrame({"t": ["2020-01-01T10:00:00", "2020-01-01T12:00:00+02:00"]})
    paris = pd.DataFrame({"t": pd.to_datetime(["2020-01-01 11:00"]).tz_localize("Europe/Paris")})
    new_york = pd.DataFrame({"t": pd.to_datetime(["2020-01-01 05:00"]).tz_localize("America/New_York")})
    np.testing.assert_allclose(pre.features(text), x[[0, 0]], atol=1e-6)
    np.testing.assert_allclose(pre.features(paris), x[[0]], atol=1e-6)
    np.testing.assert_allclose(pre.features(new_york), x[[0]], atol=1e-6)
    with pytest.raises(DataError, match=r"'t'.*dates"):
        pre.features(pd.DataFrame({"t": ["2020-01-01", "next tuesday"]}))


# --- shapes and errors -------------------------------------------------------------------------------------------


def test_width_and_output_names_are_consistent() -> None:
    train, val = mixed_frame(400, seed=0), mixed_frame(50, seed=1)
    pre = fit(train, schema_for(MIXED), max_categories=3)
    x = pre.features(val, "val")
    assert x.dtype == np.float32 and x.shape == (50, pre.width) == (50, len(pre.output_names))
    assert len(set(pre.output_names)) == pre.width
    assert pre.raw_features == list(MIXED)
    assert pre.output_names == [
        "num",
        "num:missing",
        "flag",
        "flag:missing",
        *[f"cat={c}" for c in pre.columns[2].categories],
        "cat:unknown",
        *[f"when.{p}" for p in ("year", "month", "dayofweek", "day", "hour", "days")],
        "when:missing",
    ]
    assert np.isfinite(x).all()
    onehot = [i for i, n in enumerate(pre.output_names) if n.startswith("cat")]
    np.testing.assert_array_equal(x[:, onehot].sum(axis=1), 1.0)
    assert pre.features(val.iloc[:0]).shape == (0, pre.width)


def test_missing_input_columns_are_named() -> None:
    pre = fit(mixed_frame(50, seed=0), schema_for(MIXED))
    with pytest.raises(DataError, match=r"data/split/test\.parquet.*\['flag', 'when'\]"):
        pre.features(mixed_frame(5, seed=1).drop(columns=["flag", "when"]), "data/split/test.parquet")
    with pytest.raises(DataError, match=r"train.*\['cat'\]"):
        fit(mixed_frame(50, seed=0).drop(columns=["cat"]), schema_for(MIXED))


# --- labels --------------------------------------------------------------------------------------------------------


def test_classification_labels_and_unseen_label_error() -> None:
    train = pd.DataFrame({"x": [1.0, 2.0, 3.0], "y": ["b", "a", "c"]})
    pre = fit(train, schema_for({"x": "numeric"}, classes=["a", "b", "c"]))
    y = pre.labels(train, "train")
    assert y.dtype == np.int64 and y.tolist() == [1, 0, 2]
    with pytest.raises(DataError, match=r"val.*'y'.*\['d', 'e'\].*\['a', 'b', 'c'\]"):
        pre.labels(pd.DataFrame({"y": ["a", "e", "d", "e"]}), "val")
    with pytest.raises(DataError, match=r"val.*<missing>"):
        pre.labels(pd.DataFrame({"y": ["a", None]}), "val")
    with pytest.raises(DataError, match=r"val.*\['y'\]"):
        pre.labels(pd.DataFrame({"x": [1.0]}), "val")
    # Integer-coded classes read back as numbers still match their string labels.
    digits = fit(pd.DataFrame({"x": [1.0, 2.0], "y": ["0", "1"]}), schema_for({"x": "numeric"}, classes=["0", "1"]))
    assert digits.labels(pd.DataFrame({"y": [1, 0]})).tolist() == [1, 0]
    assert digits.labels(pd.DataFrame({"y": [1.0, 0.0]})).tolist() == [1, 0]


def test_regression_targets_stay_raw_and_scale_round_trips() -> None:
    train = pd.DataFrame({"x": [1.0, 2.0, 3.0, 4.0], "y": [100.0, 200.0, 300.0, 400.0]})
    pre = fit(train, schema_for({"x": "numeric"}, task="regression"))
    y = pre.labels(train)
    assert y.dtype == np.float32 and y.tolist() == [100.0, 200.0, 300.0, 400.0]
    scaled = pre.scale_target(y)
    assert scaled.dtype == np.float32
    assert abs(scaled.mean()) < 1e-6 and abs(scaled.std() - 1) < 1e-6
    back = pre.unscale_target(scaled)
    assert back.dtype == np.float64
    np.testing.assert_allclose(back, y, rtol=1e-6)
    # Statistics are train's: a val target far away scales with them.
    assert pre.scale_target(np.array([250.0]))[0] == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(DataError, match=r"test.*'y'.*1 row"):
        pre.labels(pd.DataFrame({"y": [1.0, np.nan]}), "test")


# --- text ----------------------------------------------------------------------------------------------------------


def text_frame(n: int, seed: int, words: list[str] = WORDS) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(words, rng.integers(1, 12))) + rng.choice([".", "!", ""]) for _ in range(n)]
    return pd.DataFrame({"text": texts, "y": rng.choice(["a", "b"], n)})


TEXT = schema_for({"text": "text"}, text_column="text")


def test_tokenizer_trained_on_train_texts_only() -> None:
    train = text_frame(300, seed=0)
    pre = fit(train, TEXT, vocab_size=200, max_length=16)
    assert pre.text_column == "text" and pre.width == 0 and pre.raw_features == []
    vocab = pre.tokenizer.get_vocab()  # type: ignore[union-attr]
    assert {"alpha", "omega", "lambda"} <= vocab.keys()  # frequent train words become single tokens
    assert "zebra" not in vocab
    (zebra,) = pre.tokens(pd.DataFrame({"text": ["Zebra"]}))
    assert zebra[0] == CLS_ID and len(zebra) > 2  # an unseen word splits into pieces

    # Normalisation: case and accents do not matter.
    a, b = pre.tokens(pd.DataFrame({"text": ["ALPHA Béta!", "alpha beta!"]}))
    np.testing.assert_array_equal(a, b)


def test_tokens_are_cls_first_within_vocab_and_truncated() -> None:
    train = text_frame(300, seed=0)
    pre = fit(train, TEXT, vocab_size=150, max_length=8)
    assert pre.vocab_size <= 150
    rows = text_frame(200, seed=1)
    rows.loc[0, "text"] = " ".join(["alpha"] * 50)
    rows.loc[1, "text"] = ""
    rows.loc[2, "text"] = None
    rows.loc[3, "text"] = "日本語 ☃"  # characters never seen in train
    seqs = pre.tokens(rows)
    assert len(seqs) == len(rows)
    for s in seqs:
        assert s.dtype == np.int32 and 1 <= len(s) <= 8
        assert s[0] == CLS_ID and (s != PAD_ID).all() and (s < pre.vocab_size).all()
        assert (s[1:] != CLS_ID).all()
    assert len(seqs[0]) == 8
    assert seqs[1].tolist() == [CLS_ID] and seqs[2].tolist() == [CLS_ID]
    assert UNK_ID in seqs[3].tolist()


def test_long_texts_cut_before_encoding_match_whole_encoding() -> None:
    pre = fit(text_frame(300, seed=0), TEXT, vocab_size=150, max_length=8)
    rng = np.random.default_rng(2)
    texts = [" ".join(rng.choice(WORDS, n)) for n in (1, 5, 20, 40, 200)]
    texts += ["x" * 200 + " alpha", "a" * 500, "! " * 300]  # few tokens per character: the cut is undone
    whole = [e.ids for e in pre.tokenizer.encode_batch(texts)]  # type: ignore[union-attr]
    assert [s.tolist() for s in encode(pre.tokenizer, texts, 8)] == whole  # type: ignore[arg-type]


def test_tokenizer_is_deterministic_across_processes() -> None:
    texts = text_frame(300, seed=0)["text"].tolist()
    one, two = train_tokenizer(texts, 120, 16), train_tokenizer(list(texts), 120, 16)
    assert one.to_str() == two.to_str()
    # Hash-order dependence would show between processes (it does for WordPiece's continuation alphabet).
    code = (
        "import json, sys; from trainflow.data.preprocess import train_tokenizer; "
        "print(train_tokenizer(json.load(sys.stdin), 120, 16).to_str())"
    )
    import json

    out = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(texts), capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == one.to_str()


# --- persistence ---------------------------------------------------------------------------------------------------


def test_save_load_round_trip_is_identical_and_json_only(tmp_path: Path) -> None:
    train, val = mixed_frame(300, seed=0), mixed_frame(80, seed=1)
    pre = fit(train, schema_for(MIXED), max_categories=3)
    pre.save(tmp_path / "tab")
    assert sorted(p.name for p in (tmp_path / "tab").iterdir()) == ["preprocess.json"]
    back = Preprocessor.load(tmp_path / "tab")
    assert back == pre
    np.testing.assert_array_equal(back.features(val), pre.features(val))
    np.testing.assert_array_equal(back.labels(val), pre.labels(val))
    assert back.output_names == pre.output_names and back.width == pre.width

    reg = train.assign(y=np.linspace(0.0, 50.0, len(train)))
    rpre = fit(reg, schema_for(MIXED, task="regression"))
    rpre.save(tmp_path / "reg")
    rback = Preprocessor.load(tmp_path / "reg")
    np.testing.assert_array_equal(rback.scale_target(rback.labels(reg)), rpre.scale_target(rpre.labels(reg)))
    np.testing.assert_array_equal(rback.unscale_target(np.array([0.5])), rpre.unscale_target(np.array([0.5])))

    texts = text_frame(200, seed=0)
    tpre = fit(texts, TEXT, vocab_size=150, max_length=8)
    tpre.save(tmp_path / "text")
    assert sorted(p.name for p in (tmp_path / "text").iterdir()) == ["preprocess.json", "tokenizer.json"]
    tback = Preprocessor.load(tmp_path / "text")
    assert tback.vocab_size == tpre.vocab_size and tback.max_length == 8
    for a, b in zip(tback.tokens(texts), tpre.tokens(texts)):
        np.testing.assert_array_equal(a, b)

    (tmp_path / "text" / "tokenizer.json").unlink()
    with pytest.raises(DataError, match="tokenizer.json"):
        Preprocessor.load(tmp_path / "text")


def test_a_column_read_by_the_fit_is_let_go_of_before_its_median(monkeypatch: pytest.MonkeyPatch) -> None:
    """A streamed split hands the fit each column afresh (stream.ParquetColumns): the raw column (8 bytes a row) is
    freed once converted, so the median and the standard deviation do not hold it too (streamed train's peak on 42M
    rows). The statistics are numpy's own of the values."""
    import weakref

    rng = np.random.default_rng(0)
    values = {"a": np.where(rng.random(500) < 0.1, np.nan, rng.normal(3, 2, 500)), "b": rng.normal(0, 1, 500)}
    handed: list[weakref.ref[pd.Series]] = []

    class Columns:  # what the fit reads of stream.ParquetColumns: a new Series for every column asked for
        columns = ["a", "b", "y"]

        def __len__(self) -> int:
            return 500

        def __getitem__(self, name: str) -> pd.Series:
            s = pd.Series(values[name].copy(), name=name) if name in values else pd.Series(["a", "b"] * 250)
            handed.append(weakref.ref(s))
            return s

    median = np.median

    def checked(a: np.ndarray, *args: object, **kwargs: object) -> object:
        assert handed and handed[-1]() is None, "the raw column was still held at the median"
        return median(a, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(np, "median", checked)
    pre = fit(Columns(), schema_for({"a": "numeric", "b": "numeric"}))  # type: ignore[arg-type]
    monkeypatch.undo()
    for c, name in zip(pre.columns, ("a", "b"), strict=True):
        x = values[name]
        fill = float(np.nanmedian(x))
        filled = np.where(np.isnan(x), fill, x)
        assert c.fill == [fill] and c.center == [filled.mean()] and c.scale == [filled.std()]


approx = pytest.approx


# --- preprocessing: the fitted state, whole ----------------------------------------------------------------------

EMPTY_EXTRAS = {
    "text_column": None,
    "max_length": 0,
    "pad_id": 0,
    "image_column": None,
    "image_size": [],
    "image_resize": False,
    "image_channels": 0,
    "image_mean": [],
    "image_std": [],
}


def test_the_saved_json_of_a_tabular_fit_is_its_whole_state_computed_by_hand(tmp_path: Path) -> None:
    """num imputed with the median 3 -> [1, 3, 3, 4, 3]: mean 2.8, population std sqrt(0.96); the boolean's mode is
    true and it is not standardised; the categorical keeps the 2 most frequent values (ties by value)."""
    pre = fit(tabular_train(), schema(TABULAR), max_categories=2)
    expected = {
        "format": 1,
        "target": "y",
        "task": "classification",
        "classes": ["a", "b"],
        "raw_features": ["num", "flag", "cat"],
        "columns": [
            {
                "name": "num",
                "kind": "numeric",
                "fill": [3.0],
                "center": approx([2.8], rel=1e-12),
                "scale": approx([math.sqrt(0.96)], rel=1e-12),
                "categories": [],
                "indicator": True,
            },
            {
                "name": "flag",
                "kind": "boolean",
                "fill": [1.0],
                "center": [0.0],
                "scale": [1.0],
                "categories": [],
                "indicator": True,
            },
            {
                "name": "cat",
                "kind": "categorical",
                "fill": [],
                "center": [],
                "scale": [],
                "categories": ["b", "a"],
                "indicator": False,
            },
        ],
        "target_mean": 0.0,
        "target_std": 1.0,
        **EMPTY_EXTRAS,
    }
    assert pre.to_json() == expected
    pre.save(tmp_path / "model")
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["preprocess.json"]
    assert json.loads((tmp_path / "model" / "preprocess.json").read_text()) == expected
    back = Preprocessor.load(tmp_path / "model")
    assert back == pre and back.tokenizer is None and back.vocab_size == 0
    assert all(isinstance(c, Column) for c in back.columns)

    assert pre.output_names == ["num", "num:missing", "flag", "flag:missing", "cat=b", "cat=a", "cat:unknown"]
    assert pre.width == 7 and [c.width for c in pre.columns] == [2, 2, 3]


def test_the_features_of_unseen_rows_use_the_train_statistics_exactly() -> None:
    """A missing number takes the median, a missing boolean the mode (each flagged); an unseen, a rare and a missing
    category all go to the unknown column."""
    pre = fit(tabular_train(), schema(TABULAR), max_categories=2)
    rows = pd.DataFrame(
        {
            "num": [np.nan, 10.0, -np.inf, 2.8],
            "flag": pd.array([None, False, True, False], dtype="boolean"),
            "cat": pd.Series(["a", "zzz", None, "c"], dtype="string"),
        }
    )
    sd = math.sqrt(0.96)
    expected = np.array(
        [
            [(3 - 2.8) / sd, 1, 1, 1, 0, 1, 0],
            [(10 - 2.8) / sd, 0, 0, 0, 0, 0, 1],
            [(3 - 2.8) / sd, 1, 1, 0, 0, 0, 1],
            [0.0, 0, 0, 0, 0, 0, 1],
        ],
        dtype=np.float32,
    )
    x = pre.features(rows, "val")
    assert x.dtype == np.float32 and x.shape == (4, 7)
    np.testing.assert_allclose(x, expected, rtol=1e-6, atol=1e-7)


def test_without_missing_indicators_or_missing_values_no_indicator_column_is_added() -> None:
    off = fit(tabular_train(), schema(TABULAR), max_categories=5, missing_indicators=False)
    assert [c.indicator for c in off.columns] == [False, False, False]
    assert off.output_names == ["num", "flag", "cat=b", "cat=a", "cat=c", "cat:unknown"]
    assert off.features(tabular_train()).shape == (5, 6)
    full = pd.DataFrame({"num": [1.0, 2.0], "flag": pd.array([True, False], dtype="boolean"), "y": ["a", "b"]})
    on = fit(full, schema({"num": "numeric", "flag": "boolean"}))
    assert [c.indicator for c in on.columns] == [False, False]
    assert on.columns[1].fill == [0.0]  # a tie (1 of 2) is not a majority: false


def test_a_datetime_fit_is_each_parts_mean_and_std_with_the_median_timestamp_filled_in() -> None:
    """Present: Wed 2020-01-01 10:00, Fri 2020-01-03 00:00, Thu 2020-01-02 12:00 (the median); 2020-01-01 is day
    18262 since 1970-01-01."""
    t = pd.to_datetime(["2020-01-01 10:00", "2020-01-03 00:00", None, "2020-01-02 12:00"])
    pre = fit(pd.DataFrame({"t": t, "y": ["a"] * 4}), schema({"t": "datetime"}))
    (col,) = pre.columns
    median = [2020.0, 1.0, 3.0, 2.0, 12.0, 18263.5]
    rows = np.array([[2020, 1, 2, 1, 10, 18262 + 10 / 24], [2020, 1, 4, 3, 0, 18264], median, median])
    assert col.fill == median
    assert col.center == approx(rows.mean(axis=0).tolist(), rel=1e-12)
    assert col.center[:5] == [2020.0, 1.0, 3.0, 2.0, 8.5]
    assert col.scale == approx([1.0, 1.0, math.sqrt(0.5), math.sqrt(0.5), math.sqrt(24.75), rows[:, 5].std()])
    assert col.indicator and col.categories == []
    assert pre.output_names == [f"t.{p}" for p in ("year", "month", "dayofweek", "day", "hour", "days")] + ["t:missing"]
    assert pre.width == 7
    x = pre.features(pd.DataFrame({"t": pd.to_datetime([None, "2020-01-03 00:00"])}))
    want = (np.array([median, rows[1]]) - np.array(col.center)) / np.array(col.scale)
    np.testing.assert_allclose(x[:, :6], want, rtol=1e-5, atol=1e-6)
    assert x[:, 6].tolist() == [1.0, 0.0]


def test_an_all_missing_datetime_fills_the_epoch_and_a_seconds_column_reads_as_nanoseconds() -> None:
    frame = pd.DataFrame({"t": pd.Series([pd.NaT, pd.NaT], dtype="datetime64[ns]"), "y": ["a", "b"]})
    (col,) = fit(frame, schema({"t": "datetime"})).columns
    assert col.fill == [1970.0, 1.0, 3.0, 1.0, 0.0, 0.0]  # 1970-01-01 was a Thursday
    assert col.scale == [1.0] * 6
    seconds = pd.DataFrame({"t": pd.Series(pd.to_datetime(["2020-01-01", "2021-01-01"])).astype("datetime64[s]")})
    nanos = pd.DataFrame({"t": pd.to_datetime(["2020-01-01", "2021-01-01"])})
    pre = fit(nanos.assign(y=["a", "b"]), schema({"t": "datetime"}))
    np.testing.assert_array_equal(pre.features(seconds), pre.features(nanos))


def test_a_constant_regression_target_scales_by_one_and_a_varied_one_by_its_std() -> None:
    frame = pd.DataFrame({"x": [1.0, 2.0, 3.0], "y": [5.0, 5.0, 5.0]})
    flat = fit(frame, schema({"x": "numeric"}, task="regression"))
    assert (flat.target_mean, flat.target_std) == (5.0, 1.0)
    varied = fit(frame.assign(y=[1.0, 2.0, 6.0]), schema({"x": "numeric"}, task="regression"))
    assert varied.target_mean == 3.0 and varied.target_std == approx(math.sqrt(14 / 3), rel=1e-12)
    assert varied.to_json()["classes"] == [] and varied.to_json()["task"] == "regression"
    np.testing.assert_allclose(varied.scale_target(np.array([3.0, 6.0])), [0.0, 3 / math.sqrt(14 / 3)], rtol=1e-6)
    np.testing.assert_allclose(varied.unscale_target(np.array([1.0])), [3.0 + math.sqrt(14 / 3)], rtol=1e-12)


def test_a_large_frame_is_transformed_block_by_block_into_the_same_matrix() -> None:
    """Over 2 MiB of output (width 5: 104,857 rows a block): the rows of every block are the plain computation's."""
    n = 250_000
    rng = np.random.default_rng(0)
    num = rng.normal(5.0, 2.0, n)
    num[::7] = np.nan
    cat = rng.choice(["p", "q", "r", "s"], n)
    train = pd.DataFrame({"num": num, "cat": pd.Series(cat, dtype="string"), "y": ["a"] * n})
    pre = fit(train, schema({"num": "numeric", "cat": "categorical"}), max_categories=2)
    assert pre.width == 5
    present = num[~np.isnan(num)]
    filled = np.where(np.isnan(num), np.median(present), num)
    want = np.zeros((n, 5), dtype=np.float32)
    want[:, 0] = (filled - filled.mean()) / filled.std()
    want[:, 1] = np.isnan(num)
    kept = pre.columns[1].categories
    for i, value in enumerate(kept):
        want[:, 2 + i] = cat == value
    want[:, 4] = ~np.isin(cat, kept)
    np.testing.assert_allclose(pre.features(train), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "given",
    [
        pd.array([True, None, False], dtype="boolean"),
        [1.0, np.nan, 0.0],  # a csv/json column of 1/0 with a blank reads as float64: it crashed (a read-only view)
        pd.array([1, None, 0], dtype="Int64"),
    ],
    ids=["boolean", "float", "Int64"],
)
def test_a_missing_boolean_at_prediction_is_the_train_mode_with_its_indicator(given: object) -> None:
    """Train: True, True, False and one missing -> mode 1.0, and a missing-indicator column. Each way a 0/1 column
    can arrive at prediction gives [value or mode, missing?] worked out by hand."""
    s = Schema(source="t", target="y", task="classification", features=["b"], kinds={"b": "boolean"},
               classes=["a", "b"], n_rows=4)  # fmt: skip
    train = pd.DataFrame({"b": pd.array([True, True, False, None], dtype="boolean"), "y": ["a", "b", "a", "b"]})
    pre = Preprocessor.fit(train, s, FeatureParams())
    np.testing.assert_array_equal(pre.features(pd.DataFrame({"b": given})), [[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])


# --- preprocessing: messages -----------------------------------------------------------------------------------------


def test_fitting_on_no_rows_or_on_a_text_feature_says_what_to_do() -> None:
    with pytest.raises(DataError) as empty:
        fit(tabular_train().iloc[:0], schema(TABULAR))
    assert message(empty) == "train: the train split has no rows; nothing to fit the preprocessing on"
    with pytest.raises(DataError) as text:
        fit(pd.DataFrame({"note": ["hi"], "y": ["a"]}), schema({"note": "text"}))
    assert message(text) == "train: feature 'note' is text; only data.text_column can hold text"
    with pytest.raises(DataError) as gone:
        fit(pd.DataFrame({"y": ["a"]}), schema(TABULAR))
    assert message(gone) == "train: required column(s) ['num', 'flag', 'cat'] are missing (it has ['y'])"
    with pytest.raises(DataError) as gone:
        fit(pd.DataFrame({"y": ["a"]}), schema({"img": "image"}, image_column="img"))
    assert message(gone) == "train: required column(s) ['img'] are missing (it has ['y'])"
    with pytest.raises(DataError) as unknown:
        fit(pd.DataFrame({"x": [1.0, 2.0], "y": ["a", "c"]}), schema({"x": "numeric"}))
    assert message(unknown) == (
        "train: target column 'y' has labels ['c'] in 1 row(s) that the schema does not know (known labels: ['a', 'b'])"
    )


def test_a_missing_column_message_lists_at_most_twenty_of_the_columns_there_are() -> None:
    pre = fit(tabular_train(), schema(TABULAR))
    frame = pd.DataFrame({f"c{i}": [0] for i in range(25)})
    with pytest.raises(DataError) as exc:
        pre.features(frame, "predict.csv")
    shown = [f"c{i}" for i in range(20)]
    assert message(exc) == f"predict.csv: required column(s) ['num', 'flag', 'cat'] are missing (it has {shown})"


def test_values_that_do_not_convert_are_named_with_their_count_and_first_row() -> None:
    pre = fit(tabular_train(), schema(TABULAR))
    bad_numbers = pd.DataFrame(
        {"num": ["1", "oops", "NA", "bad", "oops", "?", " "], "flag": [True] * 7, "cat": ["a"] * 7}, dtype=object
    )
    with pytest.raises(DataError) as exc:
        pre.features(bad_numbers, "predict.csv")
    assert message(exc) == (
        "predict.csv: column 'num' should hold numbers but has ['oops', 'bad'] in 3 row(s) (first at row 1)"
    )
    bad_flags = pd.DataFrame({"num": [1.0] * 3, "flag": ["yes", "maybe", "N/A"], "cat": ["a"] * 3})
    with pytest.raises(DataError) as exc:
        pre.features(bad_flags)
    assert message(exc) == (
        "input: column 'flag' should hold booleans (true/false, yes/no, 1/0) but has ['maybe'] in 1 row(s) "
        "(first at row 1)"
    )
    coded = pd.DataFrame({"num": [1.0] * 4, "flag": [0, 1, 2, 1], "cat": ["a"] * 4})
    with pytest.raises(DataError) as exc:
        pre.features(coded)
    assert message(exc) == "input: column 'flag' should hold booleans (0/1) but has ['2'] in 1 row(s) (first at row 2)"
    np.testing.assert_array_equal(pre.features(coded.iloc[[0, 1]])[:, 2:4], [[0, 0], [1, 0]])
    t = fit(pd.DataFrame({"t": pd.to_datetime(["2020-01-01"]), "y": ["a"]}), schema({"t": "datetime"}))
    with pytest.raises(DataError) as exc:
        t.features(pd.DataFrame({"t": ["2020-01-01", "someday", ""]}), "val")
    assert message(exc) == "val: column 't' should hold dates/times but has ['someday'] in 1 row(s) (first at row 1)"


def test_boolean_words_of_any_case_and_spacing_read_as_true_and_false() -> None:
    pre = fit(pd.DataFrame({"b": pd.array([True, False], dtype="boolean"), "y": ["a", "b"]}), schema({"b": "boolean"}))
    words = ["true", " T ", "YES", "y", "1", "1.0", "false", "F", "No", "n", "0", "0.0"]
    x = pre.features(pd.DataFrame({"b": pd.Series(words, dtype=object)}))
    assert x[:, 0].tolist() == [1.0] * 6 + [0.0] * 6
    floats = pre.features(pd.DataFrame({"b": [1.0, 0.0, 1.0]}))
    assert floats.tolist() == [[1.0], [0.0], [1.0]]  # no indicator: nothing was missing in train


def test_categories_are_matched_as_text_whatever_the_dtype() -> None:
    """3, 3.0 and "3" are one category in a column of whole numbers; a float column with fractions is written as floats
    (3.0 is "3.0", not "3"); booleans read as their words."""
    pre = fit(pd.DataFrame({"c": ["3", "4", "2.5", "True"], "y": ["a"] * 4}), schema({"c": "categorical"}))
    assert pre.columns[0].categories == ["2.5", "3", "4", "True"]  # all once: by value
    rows = [
        pd.Series([3.0, 4.0, np.nan]),
        pd.Series([3, 4, 5]),
        pd.Series([2.5, 3.0, np.inf]),
        pd.Series([True, False, True]),
        pd.Series(pd.array([3, None, 4], dtype="Int64")),
        pd.Series([3, "4", None, 2.5], dtype=object),
    ]
    got = [pre.features(pd.DataFrame({"c": s})).argmax(axis=1).tolist() for s in rows]
    assert got == [[1, 2, 4], [1, 2, 4], [0, 4, 4], [3, 4, 3], [1, 4, 2], [1, 2, 4, 0]]


def test_classification_label_errors_list_at_most_ten_unknown_labels_sorted() -> None:
    pre = fit(pd.DataFrame({"x": [1.0], "y": ["a"]}), schema({"x": "numeric"}))
    with pytest.raises(DataError) as exc:
        pre.labels(pd.DataFrame({"y": ["a", None, "d", "d", "b"]}), "val")
    assert message(exc) == (
        "val: target column 'y' has labels ['<missing>', 'd'] in 3 row(s) that the schema does not know (known "
        "labels: ['a', 'b'])"
    )
    many = [f"z{i:02d}" for i in range(13)]
    with pytest.raises(DataError) as exc:
        pre.labels(pd.DataFrame({"y": many[::-1]}), "test")
    assert message(exc) == (
        f"test: target column 'y' has labels {many[:10]} and 3 more in 13 row(s) that the schema does not know "
        "(known labels: ['a', 'b'])"
    )
    with pytest.raises(DataError) as exc:
        pre.labels(pd.DataFrame({"x": [1.0]}))
    assert message(exc) == "input: required column(s) ['y'] are missing (it has ['x'])"


def test_a_regression_target_that_is_missing_or_infinite_is_counted() -> None:
    pre = fit(pd.DataFrame({"x": [1.0, 2.0], "y": [1.0, 2.0]}), schema({"x": "numeric"}, task="regression"))
    with pytest.raises(DataError) as exc:
        pre.labels(pd.DataFrame({"y": [1.0, np.inf, 2.0, np.nan]}), "test")
    assert message(exc) == (
        "test: target column 'y' is missing or not finite in 2 row(s) (first at row 1); drop or fix those rows"
    )
    with pytest.raises(DataError) as exc:
        fit(pd.DataFrame({"x": [1.0, 2.0], "y": [1.0, np.nan]}), schema({"x": "numeric"}, task="regression"))
    assert message(exc) == (
        "train: target column 'y' is missing or not finite in 1 row(s) (first at row 1); drop or fix those rows"
    )
    labels = pre.labels(pd.DataFrame({"y": ["1.5", "2"]}, dtype=object))
    assert labels.dtype == np.float32 and labels.tolist() == [1.5, 2.0]


def test_loading_names_the_missing_or_incompatible_file(tmp_path: Path) -> None:
    with pytest.raises(DataError) as exc:
        Preprocessor.load(tmp_path)
    assert message(exc) == f"{tmp_path}: preprocess.json is missing; train the model first"
    pre = fit(tabular_train(), schema(TABULAR))
    pre.save(tmp_path)
    state = json.loads((tmp_path / "preprocess.json").read_text())
    (tmp_path / "preprocess.json").write_text(json.dumps({**state, "format": 2}))
    with pytest.raises(DataError) as exc:
        Preprocessor.load(tmp_path)
    assert message(exc) == (
        f"{tmp_path / 'preprocess.json'}: written by an incompatible version of trainflow; train the model again"
    )
    (tmp_path / "preprocess.json").write_text(json.dumps({**state, "text_column": "note"}))
    with pytest.raises(DataError) as exc:
        Preprocessor.load(tmp_path)
    assert message(exc) == f"{tmp_path}: tokenizer.json is missing; train the model again"
    with pytest.raises(ValueError, match="^this preprocessor has no text column$"):
        pre.tokens(pd.DataFrame({"note": ["x"]}))
    with pytest.raises(ValueError, match="^this preprocessor has no image column$"):
        pre.image_source(pd.DataFrame({"img": [b""]}))


# --- preprocessing: images and text --------------------------------------------------------------------------------


def png(mode: str, size: tuple[int, int], color: int | tuple[int, ...]) -> bytes:
    """An encoded PNG of one colour; size is (width, height), as PIL has it."""
    from PIL import Image

    out = io.BytesIO()
    Image.new(mode, size, color).save(out, format="PNG")
    return out.getvalue()


IMAGES = schema({"img": "image"}, image_column="img")


def test_image_statistics_are_the_train_pixels_per_channel() -> None:
    """Two grayscale 3x2 (width x height) images of 10 and 30: mean 20, std 10, one channel, kept at 2x3."""
    frame = pd.DataFrame({"img": [png("L", (3, 2), 10), png("L", (3, 2), 30)], "y": ["a", "b"]})
    pre = fit(frame, IMAGES)
    state = pre.to_json()
    assert {k: state[k] for k in ("image_column", "image_size", "image_resize", "image_channels")} == {
        "image_column": "img", "image_size": [2, 3], "image_resize": False, "image_channels": 1
    }  # fmt: skip
    assert state["image_mean"] == approx([20.0]) and state["image_std"] == approx([10.0])
    assert pre.raw_features == [] and pre.width == 0
    values, names = pre.image_source(frame, "train")
    assert names == ["in train, row 0", "in train, row 1"]
    pixels = pre.decode(values, names)
    assert pixels.dtype == np.uint8 and pixels.shape == (2, 1, 2, 3) and pixels[:, 0, 0, 0].tolist() == [10, 30]

    # One colour image among grey ones makes every image RGB; a constant image has std 0 -> 1.
    rgb = pd.DataFrame({"img": [png("L", (3, 2), 10), png("RGB", (3, 2), (10, 20, 30))], "y": ["a", "b"]})
    colour = fit(rgb, IMAGES)
    assert colour.image_channels == 3
    assert colour.image_mean == approx([10.0, 15.0, 20.0]) and colour.image_std == approx([1.0, 5.0, 10.0])


def test_images_of_other_sizes_need_image_size_and_are_resized_to_it() -> None:
    frame = pd.DataFrame({"img": [png("L", (3, 2), 10), png("L", (5, 4), 30)], "y": ["a", "b"]})
    with pytest.raises(DataError) as exc:
        fit(frame, IMAGES)
    assert message(exc) == (
        "train: image in train, row 1 is 4x5 (height x width) but in train, row 0 is 2x3; images of different sizes "
        "need features.image_size, the [height, width] to resize them to"
    )
    square = fit(frame, IMAGES, image_size=4)
    assert (square.image_size, square.image_resize) == ([4, 4], True)
    assert square.image_mean == approx([20.0]) and square.image_std == approx([10.0])
    wide = fit(frame, IMAGES, image_size=[2, 6])
    assert wide.image_size == [2, 6]
    assert wide.decode(*wide.image_source(frame)).shape == (2, 1, 2, 6)

    kept = fit(frame.iloc[:1], IMAGES)  # 2x3, not resized: another size at prediction is an error
    with pytest.raises(DataError) as exc:
        kept.decode(*kept.image_source(frame.iloc[[1]], "predict.csv"), "predict.csv")
    assert message(exc) == (
        "predict.csv: image in predict.csv, row 0 is 4x5 (height x width) but the model takes 2x3 images; resize it, "
        "or train with features.image_size set to resize every image"
    )


def test_image_cells_are_bytes_or_paths_named_as_given(tmp_path: Path) -> None:
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "one.png").write_bytes(png("L", (3, 2), 40))
    frame = pd.DataFrame({"img": [png("L", (3, 2), 10)], "y": ["a"]})
    pre = fit(frame.assign(img_path=["raw/zero.png"]), IMAGES)
    cells = pd.DataFrame({"img": [b"", "pics/one.png", str(tmp_path / "pics" / "one.png")]})
    values, names = pre.image_source(cells.iloc[1:], base=tmp_path)
    assert values == [tmp_path / "pics" / "one.png"] * 2
    assert names == ["pics/one.png", str(tmp_path / "pics" / "one.png")]
    assert pre.image_source(cells.iloc[1:2])[0] == [Path("pics/one.png")]
    with_paths = pd.DataFrame({"img": [png("L", (3, 2), 1)], "img_path": ["raw/a.png"]})
    assert pre.image_source(with_paths)[1] == ["raw/a.png"]
    with pytest.raises(DataError) as exc:
        pre.image_source(pd.DataFrame({"img": [png("L", (3, 2), 1), None]}), "predict.csv")
    assert message(exc) == (
        "predict.csv, row 1: column 'img' should hold an image (a file's path, or its bytes) but has None; fill it in "
        "or drop the row"
    )
    with pytest.raises(DataError) as exc:
        pre.image_source(pd.DataFrame({"img": ["  "]}))
    assert message(exc) == (
        "input, row 0: column 'img' should hold an image (a file's path, or its bytes) but has '  '; fill it in or "
        "drop the row"
    )
    with pytest.raises(DataError) as exc:
        pre.decode([tmp_path / "gone.png"], ["gone.png"])
    assert message(exc) == f"image gone.png: no such file (looked for {tmp_path / 'gone.png'})"
    from PIL import Image, UnidentifiedImageError

    try:
        Image.open(io.BytesIO(b"junk"))
    except UnidentifiedImageError as why:
        reason = str(why)
    with pytest.raises(DataError) as exc:
        pre.decode([b"junk"], ["in input, row 0"])
    # PIL names the BytesIO it read by its address: the same text but for that
    assert re.sub("0x[0-9a-f]+", "0x", message(exc)) == re.sub(
        "0x[0-9a-f]+", "0x", f"image in input, row 0 cannot be read ({reason}); replace the file or remove its row"
    )
    cut = png("L", (30, 20), 7)[:-30]  # its header reads; its pixels do not
    try:
        Image.open(io.BytesIO(cut)).load()
    except OSError as why:
        reason = str(why)
    with pytest.raises(DataError) as exc:
        pre.decode([cut], ["cut.png"])
    assert message(exc) == f"image cut.png cannot be read ({reason}); replace the file or remove its row"


def test_a_pretrained_tokenizer_is_used_as_given_and_an_empty_encoding_is_named() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<pad>": 0, "<unk>": 1, "hello": 2, "world": 3}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    s = schema({"note": "text", "x": "numeric"}, text_column="note")
    frame = pd.DataFrame({"note": ["hello world", "world"], "x": [1.0, 2.0], "y": ["a", "b"]})
    pre = Preprocessor.fit(frame, s, FeatureParams(max_length=16), tokenizer=(tok, 7))
    assert pre.tokenizer is tok and pre.pad_id == 7 and pre.vocab_size == 4
    assert (pre.text_column, pre.max_length, pre.raw_features) == ("note", 16, ["x"])
    assert [t.tolist() for t in pre.tokens(pd.DataFrame({"note": ["hello", "world hello nope"]}))] == [[2], [3, 2, 1]]
    with pytest.raises(DataError) as exc:
        pre.tokens(pd.DataFrame({"note": ["hello", None]}), "val")
    assert message(exc) == (
        "val, row 1: the text in 'note' encodes to no tokens (the tokenizer adds no special tokens, and the text is "
        "empty or missing); give it text or drop the row"
    )


def test_a_trained_tokenizer_is_saved_beside_the_json_and_numbers_are_texts_too(tmp_path: Path) -> None:
    s = schema({"note": "text"}, text_column="note")
    frame = pd.DataFrame({"note": ["red fox", None, "blue fox", 42], "y": ["a", "b", "a", "b"]}, dtype=object)
    pre = fit(frame, s, vocab_size=100, max_length=8)
    state = pre.to_json()
    assert (state["text_column"], state["max_length"], state["pad_id"], state["columns"]) == ("note", 8, 0, [])
    vocab = pre.tokenizer.get_vocab()  # type: ignore[union-attr]
    assert {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2}.items() <= vocab.items() and {"fox", "42"} <= vocab.keys()
    pre.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["preprocess.json", "tokenizer.json"]
    assert json.loads((tmp_path / "tokenizer.json").read_text()) == json.loads(pre.tokenizer.to_str())  # type: ignore[union-attr]
    back = Preprocessor.load(tmp_path)
    ids = [t.tolist() for t in back.tokens(pd.DataFrame({"note": ["RED fox", None, 42]}))]
    assert ids == [[2, vocab["red"], vocab["fox"]], [2], [2, vocab["42"]]]


def test_a_long_text_whose_cut_keeps_too_few_tokens_is_encoded_whole() -> None:
    """A text longer than CHARS_PER_TOKEN * max_length is cut at its last space in the second half of that many
    characters. Here the cut keeps one unknown word (one [UNK]): too few tokens, so the whole text is encoded."""
    from trainflow.data.preprocess import CHARS_PER_TOKEN, CLS_ID, UNK_ID, encode, train_tokenizer

    tok = train_tokenizer(["a b", "b a"], vocab_size=50, max_length=8)
    a, b = tok.token_to_id("a"), tok.token_to_id("b")
    limit = CHARS_PER_TOKEN * 8
    long_text = "z" * (limit // 2 + 1) + " " + "z" * limit + " a b a b a b a b"  # z is not in the vocabulary
    [whole, short] = encode(tok, [long_text, "b a"], max_length=8)
    assert whole.dtype == "int32"
    assert whole.tolist() == [CLS_ID, UNK_ID, UNK_ID, a, b, a, b, a]  # [CLS] + 7 tokens of the whole text
    assert short.tolist() == [CLS_ID, b, a]
