"""Preprocessing: statistics from train only, each kind's transform, text tokens, labels, and the JSON round trip."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from trainflow.core.errors import DataError
from trainflow.data.preprocess import CLS_ID, PAD_ID, UNK_ID, Preprocessor, encode, train_tokenizer
from trainflow.data.schema import Kind, Schema
from trainflow.params import FeatureParams

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "omega"]


def schema_for(
    kinds: dict[str, Kind],
    task: str = "classification",
    classes: list[str] | None = None,
    text_column: str | None = None,
) -> Schema:
    features = [c for c in kinds if c != text_column]
    return Schema(
        source="test",
        target="y",
        task=task,  # type: ignore[arg-type]
        features=features,
        kinds=kinds,
        classes=classes if classes is not None else (["a", "b"] if task == "classification" else []),
        n_rows=0,
        text_column=text_column,
    )


def fit(frame: pd.DataFrame, schema: Schema, **params: object) -> Preprocessor:
    return Preprocessor.fit(frame, schema, FeatureParams(**params))  # type: ignore[arg-type]


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
