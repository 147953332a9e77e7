"""Preprocessing fitted on the training split only, saved as JSON, applied identically at evaluation and prediction.

Every statistic (medians, means, standard deviations, category lists, the tokenizer's vocabulary, the target's scale)
comes from the train split; `features`, `tokens` and `labels` apply them unchanged to any other frame. The tabular
transforms, per feature kind (output columns in schema order, each feature's value columns then its indicator):

- numeric: missing (NaN, +-inf) -> train median, then (x - mean) / std with the train mean/std after imputation
  (std 0 -> 1); plus a 0/1 `name:missing` column if the feature had missing values in train (missing_indicators).
- boolean: 0/1, missing -> train mode, plus the indicator as above.
- categorical: one-hot `name=value` of the `max_categories` most frequent train values (ties by value) and one
  `name:unknown` column for rarer, unseen and missing values.
- datetime: year, month, day of week, day of month, hour and days since 1970-01-01, each standardised; a missing
  timestamp takes the parts of the train median timestamp, plus the indicator as above.

Images (an image column of encoded file bytes, or of paths at prediction) are decoded to 8-bit grayscale (when every
train image is grayscale) or RGB, kept at the train images' common size or resized (bilinear) to
features.image_size; the per-channel mean and std of the train pixels normalise them (`images`, then the engine's
ImageData). Alpha is dropped.

Text is tokenized by a byte-pair-encoding tokenizer (`tokenizers`; lowercase, accents stripped, split into words and
runs of punctuation) trained on the train texts: [PAD]=0 (never emitted), [UNK]=1, [CLS]=2 starts every sequence. A
pretrained model (model.name hf:...) brings its own tokenizer instead, used as it is (`fit`'s `tokenizer`).

`save` writes preprocess.json (and tokenizer.json when there is text): JSON only, nothing is pickled.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pandas.api import types as ptypes
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

from trainflow.core.errors import DataError
from trainflow.core.io import atomic_path, read_json, write_json
from trainflow.data.schema import NA_VALUES, PATH_SUFFIX, Kind, Schema
from trainflow.params import FeatureParams

PREPROCESS, TOKENIZER = "preprocess.json", "tokenizer.json"
FORMAT = 1
PAD, UNK, CLS = "[PAD]", "[UNK]", "[CLS]"
SPECIAL_TOKENS = (PAD, UNK, CLS)  # ids 0, 1, 2: the trainer adds them first, in this order
PAD_ID, UNK_ID, CLS_ID = 0, 1, 2
DATETIME_PARTS = ("year", "month", "dayofweek", "day", "hour", "days")
NS_PER_DAY = 86_400 * 10**9
CHARS_PER_TOKEN = 8  # text: characters encoded per token kept before a long text is cut (see `encode`)
TRUE_WORDS = frozenset({"true", "t", "yes", "y", "1", "1.0"})
FALSE_WORDS = frozenset({"false", "f", "no", "n", "0", "0.0"})


@dataclass(frozen=True)
class Column:
    """How one raw feature becomes output columns. Lists run over the feature's value columns."""

    name: str
    kind: Kind
    fill: list[float] = field(default_factory=list)  # imputed raw value(s): median, mode, median timestamp's parts
    center: list[float] = field(default_factory=list)  # subtracted after imputation (train mean)
    scale: list[float] = field(default_factory=list)  # divided by after centring (train std, 1 if 0)
    categories: list[str] = field(default_factory=list)  # categorical: the kept train values, most frequent first
    indicator: bool = False  # a 0/1 missing column follows the value columns

    @property
    def output_names(self) -> list[str]:
        if self.kind == "categorical":
            names = [f"{self.name}={c}" for c in self.categories] + [f"{self.name}:unknown"]
        elif self.kind == "datetime":
            names = [f"{self.name}.{p}" for p in DATETIME_PARTS]
        else:
            names = [self.name]
        return names + ([f"{self.name}:missing"] if self.indicator else [])

    @property
    def width(self) -> int:
        if self.kind == "categorical":
            return len(self.categories) + 1
        return (len(DATETIME_PARTS) if self.kind == "datetime" else 1) + int(self.indicator)


@dataclass
class Preprocessor:
    """Fitted preprocessing: build with `fit` (train split) or `load`; apply with `features`, `tokens`, `labels`."""

    target: str
    task: Literal["classification", "regression"]
    classes: list[str]  # classification labels in index order; [] for regression
    raw_features: list[str]  # the tabular input columns `features` reads, in schema order
    columns: list[Column]
    text_column: str | None = None
    max_length: int = 0  # text: the longest sequence `tokens` returns, [CLS] included
    pad_id: int = PAD_ID  # text: the id batches are padded with (a pretrained tokenizer's own)
    target_mean: float = 0.0  # regression: train target mean/std for scale_target/unscale_target
    target_std: float = 1.0
    tokenizer: Tokenizer | None = field(default=None, repr=False, compare=False)
    image_column: str | None = None
    image_size: list[int] = field(default_factory=list)  # images: [height, width] every image has after decoding
    image_resize: bool = False  # images: resize others to image_size (features.image_size set), else an error
    image_channels: int = 0  # images: 1 (grayscale) or 3 (RGB)
    image_mean: list[float] = field(default_factory=list)  # images: per channel, of the train pixels (0..255 units)
    image_std: list[float] = field(default_factory=list)

    # --- fitting -------------------------------------------------------------------------------------------------

    @classmethod
    def fit(
        cls, train: pd.DataFrame, schema: Schema, f: FeatureParams, tokenizer: tuple[Tokenizer, int] | None = None
    ) -> Preprocessor:
        """Learn every statistic from `train` (the train split) alone. `tokenizer`: a pretrained model's tokenizer
        and pad id, taken as they are instead of training one on the texts."""
        where = "train"
        text = [schema.text_column] if schema.text_column else []
        _require(train, [*schema.features, *text, schema.target], where)
        if len(train) == 0:
            raise DataError(f"{where}: the train split has no rows; nothing to fit the preprocessing on")
        columns = [_fit_column(train, name, schema.kinds.get(name, "numeric"), f, where) for name in schema.features]
        pre = cls(
            target=schema.target,
            task=schema.task,
            classes=list(schema.classes),
            raw_features=list(schema.features),
            columns=columns,
            text_column=schema.text_column,
            max_length=f.max_length if schema.text_column else 0,
        )
        if schema.image_column:
            pre._fit_images(train, schema.image_column, f, where)
        if schema.text_column and tokenizer is not None:
            pre.tokenizer, pre.pad_id = tokenizer
        elif schema.text_column:
            pre.tokenizer = train_tokenizer(_texts(train[schema.text_column]), f.vocab_size, f.max_length)
        if schema.task == "regression":
            y = pre.labels(train, where).astype(np.float64)
            std = float(y.std())
            pre.target_mean = float(y.mean())
            pre.target_std = std if math.isfinite(std) and std > 1e-12 else 1.0
        else:
            pre.labels(train, where)  # fail now on a label the schema does not know
        return pre

    def _fit_images(self, train: pd.DataFrame, column: str, f: FeatureParams, where: str) -> None:
        """The size, channels and per-channel mean/std of the train images: two passes (headers, then pixels), one
        image at a time, over the split a block of rows at a time (`_image_blocks`: one block when it is in memory),
        so a split bigger than memory gives the same statistics, summed in the same order."""
        _require(train, [column], where)
        grayscale, first, other = True, None, None  # first: (name, (width, height)); other: the first of another size
        for values, names in _image_blocks(train, column, where):
            for value, name in zip(values, names):
                mode, found = _header(value, name)  # not decoded
                grayscale = grayscale and mode in GRAY_MODES
                if first is None:
                    first = (name, found)
                elif other is None and found != first[1]:
                    other = (name, found)
        assert first is not None, "fit refuses an empty train split"
        self.image_column, self.image_channels = column, 1 if grayscale else 3
        if f.image_size is not None:
            size = [f.image_size] * 2 if isinstance(f.image_size, int) else list(f.image_size)
            self.image_size, self.image_resize = size, True
        else:
            if other is not None:
                (w0, h0), (w, h) = first[1], other[1]
                raise DataError(
                    f"{where}: image {other[0]} is {h}x{w} (height x width) but {first[0]} is {h0}x{w0}; "
                    "images of different sizes need features.image_size, the [height, width] to resize them to"
                )
            self.image_size, self.image_resize = [first[1][1], first[1][0]], False
        total = np.zeros(self.image_channels)
        squares = np.zeros(self.image_channels)
        count = 0
        for values, names in _image_blocks(train, column, where):
            for value, name in zip(values, names):
                x = self._pixels(_open_image(value, name), name, where).astype(np.float64)
                total += x.sum(axis=(1, 2))
                squares += (x * x).sum(axis=(1, 2))
            count += len(values) * self.image_size[0] * self.image_size[1]
        mean = total / count
        std = np.sqrt(np.maximum(squares / count - mean * mean, 0.0))
        self.image_mean = mean.tolist()
        self.image_std = [float(v) if v > 1e-6 else 1.0 for v in std]

    # --- shapes --------------------------------------------------------------------------------------------------

    @property
    def width(self) -> int:
        """Columns of the `features` matrix."""
        return sum(c.width for c in self.columns)

    @property
    def output_names(self) -> list[str]:
        """One name per column of the `features` matrix, in order."""
        return [name for c in self.columns for name in c.output_names]

    @property
    def vocab_size(self) -> int:
        """Token ids `tokens` can return are below this (0 without a text column)."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True) if self.tokenizer is not None else 0

    # --- transforms ----------------------------------------------------------------------------------------------

    def features(self, frame: pd.DataFrame, where: str = "input") -> np.ndarray:
        """The float32 [len(frame), width] tabular matrix."""
        _require(frame, self.raw_features, where)
        n = len(frame)
        # Transform each feature over all rows (vectorised), then copy into the row-major matrix a block of rows at a
        # time, so the scattered writes of narrow column slices stay in cache.
        dense: list[tuple[int, np.ndarray]] = []  # (first output column, float32 [N, k] values)
        onehot: list[tuple[int, np.ndarray]] = []  # (first output column, int32 [N] category index)
        j = 0
        for c in self.columns:
            s = frame[c.name]
            if c.kind == "categorical":
                codes = pd.Categorical(_strings(s), categories=c.categories).codes.astype(np.int32)
                codes[codes < 0] = len(c.categories)  # unseen, rare and missing values share the unknown column
                onehot.append((j, codes))
            else:
                values = _raw_values(s, c.kind, c.name, where)  # [N, k] float64, NaN = missing
                missing = np.isnan(values).any(axis=1)
                if missing.any():
                    values[missing] = c.fill
                block = ((values - np.asarray(c.center)) / np.asarray(c.scale)).astype(np.float32)
                if c.indicator:
                    block = np.concatenate([block, missing[:, None].astype(np.float32)], axis=1)
                dense.append((j, block))
            j += c.width
        out = np.zeros((n, self.width), dtype=np.float32)
        step = max(1, (1 << 21) // max(1, 4 * self.width))  # ~2 MiB of output per block
        for lo in range(0, n, step):
            hi = min(lo + step, n)
            part = out[lo:hi]
            for j, block in dense:
                part[:, j : j + block.shape[1]] = block[lo:hi]
            rows = np.arange(hi - lo)
            for j, codes in onehot:
                part[rows, j + codes[lo:hi]] = 1.0
        return out

    def typed_columns(self, frame: pd.DataFrame, where: str = "input") -> dict[str, np.ndarray]:
        """Tables: each raw feature of `frame` as one typed array, what model.onnx takes (`trainflow.artifacts.onnx`):
        numeric and boolean float64 (NaN missing), categorical strings (missing: a string not among the categories),
        datetime int64 UTC nanoseconds (missing: NaT's -2**63). The same conversions, and errors, as `features`."""
        _require(frame, self.raw_features, where)
        out: dict[str, np.ndarray] = {}
        for c in self.columns:
            s = frame[c.name]
            if c.kind == "categorical":
                absent = "" if "" not in c.categories else "\x00"  # a string no category equals
                out[c.name] = _strings(s).astype(object).fillna(absent).to_numpy(dtype=object)
            elif c.kind == "datetime":
                out[c.name] = _datetimes(s, c.name, where).to_numpy(dtype="datetime64[ns]").view(np.int64)
            else:
                out[c.name] = _raw_values(s, c.kind, c.name, where)[:, 0]
        return out

    def tokens(self, frame: pd.DataFrame, where: str = "input") -> list[np.ndarray]:
        """Text: int32 token ids per row, [CLS] first, 1 <= length <= max_length; missing text gives [CLS] alone (a
        pretrained tokenizer: its own special tokens)."""
        if self.text_column is None or self.tokenizer is None:
            raise ValueError("this preprocessor has no text column")
        _require(frame, [self.text_column], where)
        ids = encode(self.tokenizer, _texts(frame[self.text_column], keep_missing=True), self.max_length)
        empty = next((i for i, x in enumerate(ids) if len(x) == 0), None)
        if empty is not None:  # only a tokenizer that adds no special tokens gets here
            raise DataError(
                f"{where}, row {empty}: the text in {self.text_column!r} encodes to no tokens (the tokenizer adds no "
                "special tokens, and the text is empty or missing); give it text or drop the row"
            )
        return ids

    def image_source(
        self, frame: pd.DataFrame, where: str = "input", base: Path | None = None
    ) -> tuple[list[bytes | Path], list[str]]:
        """Images: each row's image (bytes, or the path of its file: relative to `base`, default the working
        directory) and how messages name it. Reading and decoding wait for `decode`."""
        if self.image_column is None:
            raise ValueError("this preprocessor has no image column")
        _require(frame, [self.image_column], where)
        return _image_values(frame, self.image_column, where, base)

    def decode(self, values: Sequence[bytes | Path], names: Sequence[str], where: str = "input") -> np.ndarray:
        """uint8 [len(values), channels, height, width]: the images decoded, converted and sized as in training."""
        out = np.empty((len(values), self.image_channels, *self.image_size), dtype=np.uint8)
        for i, (v, name) in enumerate(zip(values, names)):
            out[i] = self._pixels(_open_image(v, name), name, where)
        return out

    def _pixels(self, image: Any, name: str, where: str) -> np.ndarray:
        """uint8 [channels, height, width] of an opened PIL image."""
        from PIL import Image

        height, width = self.image_size
        if image.size != (width, height) and not self.image_resize:
            raise DataError(
                f"{where}: image {name} is {image.size[1]}x{image.size[0]} (height x width) but the model takes "
                f"{height}x{width} images; resize it, or train with features.image_size set to resize every image"
            )
        converted = image.convert("L" if self.image_channels == 1 else "RGB")
        if converted.size != (width, height):
            converted = converted.resize((width, height), Image.Resampling.BILINEAR)
        x = np.asarray(converted, dtype=np.uint8)
        return x[None] if x.ndim == 2 else x.transpose(2, 0, 1)

    def labels(self, frame: pd.DataFrame, where: str = "input") -> np.ndarray:
        """Classification: int64 index into `classes`; regression: float32 targets in their own units."""
        _require(frame, [self.target], where)
        s = frame[self.target]
        if self.task == "regression":
            y = _raw_values(s, "numeric", self.target, where)[:, 0]
            bad = ~np.isfinite(y)
            if bad.any():
                raise DataError(
                    f"{where}: target column {self.target!r} is missing or not finite in {int(bad.sum())} row(s) "
                    f"(first at row {int(np.flatnonzero(bad)[0])}); drop or fix those rows"
                )
            return y.astype(np.float32)
        labels = _strings(s)
        codes = pd.Categorical(labels, categories=self.classes).codes.astype(np.int64)
        unknown = codes < 0
        if unknown.any():
            bad_labels = pd.unique(labels[unknown].astype(object).to_numpy())
            shown = sorted(("<missing>" if pd.isna(v) else str(v)) for v in bad_labels)
            more = f" and {len(shown) - 10} more" if len(shown) > 10 else ""
            raise DataError(
                f"{where}: target column {self.target!r} has labels {shown[:10]}{more} in {int(unknown.sum())} "
                f"row(s) that the schema does not know (known labels: {self.classes})"
            )
        return codes

    def scale_target(self, y: np.ndarray) -> np.ndarray:
        """Regression targets -> the standardised float32 values the model trains on."""
        return ((np.asarray(y, dtype=np.float64) - self.target_mean) / self.target_std).astype(np.float32)

    def unscale_target(self, y: np.ndarray) -> np.ndarray:
        """Standardised model outputs -> float64 values in the target's units."""
        return np.asarray(y, dtype=np.float64) * self.target_std + self.target_mean

    # --- persistence ---------------------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        state = {k: v for k, v in asdict(self).items() if k != "tokenizer"}
        return {"format": FORMAT, **state}

    def save(self, directory: Path) -> None:
        """Write preprocess.json (and tokenizer.json with text) into `directory`, atomically."""
        directory.mkdir(parents=True, exist_ok=True)
        if self.tokenizer is not None:
            with atomic_path(directory / TOKENIZER) as tmp:
                tmp.write_text(self.tokenizer.to_str(pretty=True))
        write_json(directory / PREPROCESS, self.to_json())

    @classmethod
    def load(cls, directory: Path) -> Preprocessor:
        path = directory / PREPROCESS
        if not path.is_file():
            raise DataError(f"{directory}: {PREPROCESS} is missing; train the model first")
        state = read_json(path)
        if state.pop("format", None) != FORMAT:
            raise DataError(f"{path}: written by an incompatible version of trainflow; train the model again")
        state["columns"] = [Column(**c) for c in state["columns"]]
        pre = cls(**state)
        if pre.text_column is not None:
            tok_path = directory / TOKENIZER
            if not tok_path.is_file():
                raise DataError(f"{directory}: {TOKENIZER} is missing; train the model again")
            pre.tokenizer = Tokenizer.from_file(str(tok_path))
        return pre


# --- images ----------------------------------------------------------------------------------------------------------


def _image_values(
    frame: pd.DataFrame, column: str, where: str, base: Path | None, first_row: int = 0
) -> tuple[list[bytes | Path], list[str]]:
    """Each row's image (bytes, or a path relative to `base`) and its name in messages: its file's path (the
    `<column>_path` column ingest writes) or its row (`first_row`: the frame's first row's number in `where`)."""
    named = column + PATH_SUFFIX
    paths = frame[named].to_numpy(dtype=object) if named in frame.columns else None
    values: list[bytes | Path] = []
    names: list[str] = []
    for i, v in enumerate(frame[column].to_numpy(dtype=object, na_value=None)):
        known = paths[i] if paths is not None and isinstance(paths[i], str) and paths[i] else None
        if isinstance(v, bytes | bytearray | memoryview):
            values.append(bytes(v))
            names.append(known or f"in {where}, row {first_row + i}")
        elif isinstance(v, str | Path) and str(v).strip():
            path = Path(str(v).strip()).expanduser()
            values.append(path if path.is_absolute() or base is None else base / path)
            names.append(str(v))
        else:
            raise DataError(
                f"{where}, row {first_row + i}: column {column!r} should hold an image (a file's path, or its "
                f"bytes) but has {v!r}; fill it in or drop the row"
            )
    return values, names


def _image_blocks(frame: Any, column: str, where: str) -> Iterator[tuple[list[bytes | Path], list[str]]]:
    """(values, names) of the frame's images a block of rows at a time: a split read from its file
    (stream.ParquetColumns: `row_blocks`) block by block, a frame in memory as one block."""
    read = getattr(frame, "row_blocks", None)
    if read is None:
        yield _image_values(frame, column, where, None)
        return
    path = column + PATH_SUFFIX
    first = 0
    for block in read([column, path] if path in frame.columns else [column]):
        yield _image_values(block, column, where, None, first)
        first += len(block)


GRAY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"})


def _open_image(value: bytes | Path, name: str, load: bool = True) -> Any:
    """An opened PIL image, decoded (`load`) or its header only; DataError naming the file when it cannot be read."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(value) if isinstance(value, bytes) else value)
        if load:
            image.load()
    except FileNotFoundError:
        looked = str(value) if isinstance(value, Path) else name
        raise DataError(f"image {name}: no such file (looked for {looked})") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise DataError(f"image {name} cannot be read ({exc}); replace the file or remove its row") from None
    return image


def _header(value: bytes | Path, name: str) -> tuple[str, tuple[int, int]]:
    image = _open_image(value, name, load=False)
    try:
        return image.mode, image.size
    finally:
        image.close()


# --- text ------------------------------------------------------------------------------------------------------------


def new_tokenizer(max_length: int) -> Tokenizer:
    """An untrained BPE tokenizer: lowercase, no accents, whitespace/punctuation split, [CLS] + at most max_length."""
    tok = Tokenizer(models.BPE(unk_token=UNK, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()  # words and runs of punctuation; never across whitespace
    tok.post_processor = processors.TemplateProcessing(single=f"{CLS} $A", special_tokens=[(CLS, CLS_ID)])
    tok.enable_truncation(max_length)  # counts the [CLS] the post-processor adds
    return tok


def train_tokenizer(texts: list[str], vocab_size: int, max_length: int) -> Tokenizer:
    """Train on `texts`; deterministic (the BPE trainer breaks ties by pair, and the whole alphabet is kept:
    limiting it, or WordPiece's continuation alphabet, depends on hash order and varies between processes)."""
    tok = new_tokenizer(max_length)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    tok.train_from_iterator(texts, trainer, length=len(texts))
    ids = [tok.token_to_id(t) for t in SPECIAL_TOKENS]
    if ids != [PAD_ID, UNK_ID, CLS_ID]:  # pragma: no cover - a contract of the trainer
        raise RuntimeError(f"special token ids {ids}, expected {[PAD_ID, UNK_ID, CLS_ID]}")
    return tok


def encode(tok: Tokenizer, texts: list[str], max_length: int) -> list[np.ndarray]:
    """Batch-encode to int32 ids ([CLS] + at most max_length - 1 tokens).

    The tokenizer reads a whole text before truncating, so a long text is first cut at a space well past the
    characters max_length tokens can need. Pre-tokens never span whitespace, so the tokens kept from the cut text are
    exactly those of the whole text; in the rare case the cut left fewer than max_length, the whole text is encoded.
    """
    limit = CHARS_PER_TOKEN * max_length
    heads, cut = list(texts), []
    for i, text in enumerate(texts):
        if len(text) > limit and (k := text.rfind(" ", limit // 2, limit)) > 0:
            heads[i] = text[:k]
            cut.append(i)
    ids = [e.ids for e in tok.encode_batch_fast(heads)]
    short = [i for i in cut if len(ids[i]) < max_length]
    for i, e in zip(short, tok.encode_batch_fast([texts[i] for i in short])):
        ids[i] = e.ids
    return [np.asarray(x, dtype=np.int32) for x in ids]


def _texts(s: pd.Series, keep_missing: bool = False) -> list[str]:
    """Strings of a text column; missing ones dropped (training) or kept as "" (encoding)."""
    missing = s.isna().to_numpy()
    values = s.to_numpy(dtype=object)
    if keep_missing:
        return ["" if m else v if isinstance(v, str) else str(v) for v, m in zip(values, missing)]
    return [v if isinstance(v, str) else str(v) for v, m in zip(values, missing) if not m]


# --- tabular ---------------------------------------------------------------------------------------------------------


def _require(frame: pd.DataFrame, columns: list[str], where: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise DataError(f"{where}: required column(s) {missing} are missing (it has {list(frame.columns)[:20]})")


def _fit_column(train: pd.DataFrame, name: str, kind: Kind, f: FeatureParams, where: str) -> Column:
    s = train[name]  # read here, not by the caller, so that `del s` below lets go of a streamed split's column
    if kind == "categorical":
        counts = _strings(s).value_counts(dropna=True)
        ranked = pd.DataFrame({"value": counts.index.astype(str), "count": counts.to_numpy()})
        ranked = ranked.sort_values(["count", "value"], ascending=[False, True], kind="mergesort")
        return Column(name, kind, categories=ranked["value"].head(f.max_categories).tolist())
    if kind == "text":
        raise DataError(f"{where}: feature {name!r} is text; only data.text_column can hold text")
    # Memory, for a column streamed from a split bigger than memory: the raw column is let go of once converted (a
    # datetime's is read again), and the median partitions its own copy of the present values in place.
    values = _raw_values(s, kind, name, where)
    if kind != "datetime":
        del s
    missing = np.isnan(values).any(axis=1)
    if kind == "boolean":
        present = values[~missing]
        fill = [1.0 if len(present) and present.mean() > 0.5 else 0.0]
        del present
    elif kind == "datetime":
        ns = _datetimes(s, name, where).to_numpy(dtype="datetime64[ns]").astype(np.int64)[~missing]
        median = pd.Series([int(np.median(ns, overwrite_input=True))] if len(ns) else [0], dtype="datetime64[ns]")
        fill = _raw_values(median, "datetime", name, where)[0].tolist()
    else:
        present = values[~missing, 0]
        fill = [float(np.median(present, overwrite_input=True))] if len(present) else [0.0]
        del present
    values[missing] = fill
    if kind == "boolean":
        center, scale = [0.0], [1.0]
    else:
        center = values.mean(axis=0).tolist()
        scale = [float(sd) if math.isfinite(sd) and sd > 1e-12 else 1.0 for sd in values.std(axis=0)]
    return Column(name, kind, fill, center, scale, indicator=f.missing_indicators and bool(missing.any()))


def _raw_values(s: pd.Series, kind: Kind, name: str, where: str) -> np.ndarray:
    """[N, k] float64 values of a numeric, boolean or datetime column before imputation; NaN marks missing."""
    if kind == "datetime":
        t = _datetimes(s, name, where)
        ns = t.to_numpy(dtype="datetime64[ns]")
        missing = np.isnat(ns)
        parts = np.empty((len(t), len(DATETIME_PARTS)), dtype=np.float64)
        index = pd.DatetimeIndex(ns)
        for i, part in enumerate(DATETIME_PARTS[:-1]):
            parts[:, i] = getattr(index, part)
        parts[:, -1] = ns.astype(np.int64) / NS_PER_DAY
        parts[missing] = np.nan
        return parts
    if kind == "boolean":
        return _booleans(s, name, where)[:, None]
    return _numbers(s, name, where)[:, None]


def _numbers(s: pd.Series, name: str, where: str) -> np.ndarray:
    if ptypes.is_numeric_dtype(s.dtype) or ptypes.is_bool_dtype(s.dtype):
        x = s.to_numpy(dtype=np.float64, na_value=np.nan, copy=True)
    else:
        converted = pd.to_numeric(s, errors="coerce")
        _reject(s, converted.isna().to_numpy(), name, where, "numbers")
        x = converted.to_numpy(dtype=np.float64, na_value=np.nan, copy=True)
    x[np.isinf(x)] = np.nan  # +-inf counts as missing
    return x


def _booleans(s: pd.Series, name: str, where: str) -> np.ndarray:
    # copy=True: a float64 column's to_numpy is a read-only view under copy-on-write, and the caller fills it in
    if ptypes.is_bool_dtype(s.dtype):
        return s.to_numpy(dtype=np.float64, na_value=np.nan, copy=True)
    if ptypes.is_numeric_dtype(s.dtype):
        x = s.to_numpy(dtype=np.float64, na_value=np.nan, copy=True)
        _reject(s, ~np.isin(x, (0.0, 1.0)), name, where, "booleans (0/1)")
        return x
    words = _strings(s).str.strip().str.lower()
    x = np.where(words.isin(TRUE_WORDS), 1.0, np.where(words.isin(FALSE_WORDS), 0.0, np.nan))
    _reject(s, np.isnan(x), name, where, "booleans (true/false, yes/no, 1/0)")
    return x


def _datetimes(s: pd.Series, name: str, where: str) -> pd.Series:
    """Naive datetime64[ns] (time-zone-aware values in UTC); strings are parsed."""
    if isinstance(s.dtype, pd.DatetimeTZDtype):
        return s.dt.tz_convert("UTC").dt.tz_localize(None).astype("datetime64[ns]")
    if ptypes.is_datetime64_dtype(s.dtype):
        return s.astype("datetime64[ns]")
    t = pd.to_datetime(s, errors="coerce", utc=True, format="mixed")
    _reject(s, t.isna().to_numpy(), name, where, "dates/times")
    return t.dt.tz_localize(None).astype("datetime64[ns]")


def _reject(s: pd.Series, failed: np.ndarray, name: str, where: str, what: str) -> None:
    """DataError if a value that is present (not NA, not blank) failed to convert."""
    present = s.notna().to_numpy()
    if ptypes.is_object_dtype(s.dtype) or ptypes.is_string_dtype(s.dtype):  # blanks and "NA", "?"... are missing
        present = present & ~_strings(s).str.strip().isin(NA_VALUES).fillna(True).to_numpy(dtype=bool)
    bad = failed & present
    if bad.any():
        examples = pd.unique(s[bad].astype(str).to_numpy())[:5].tolist()
        first = int(np.flatnonzero(bad)[0])
        detail = f"column {name!r} should hold {what} but has {examples} in {int(bad.sum())} row(s)"
        raise BadValues(f"{where}: {detail} (first at row {first})", detail, first)


class BadValues(DataError):
    """`_reject`'s error, with its parts: `detail` (which values do not convert) and `row`, the first one's position
    in the frame, which a caller that knows the frame's file names as its line (`trainflow predict`)."""

    def __init__(self, message: str, detail: str, row: int) -> None:
        super().__init__(message)
        self.detail, self.row = detail, row


def _strings(s: pd.Series) -> pd.Series:
    """Values as strings (NA kept), so 3, 3.0 and "3" match; already-string columns pass through uncopied."""
    if ptypes.is_bool_dtype(s.dtype) or ptypes.is_integer_dtype(s.dtype):
        return s.astype("string")
    if ptypes.is_float_dtype(s.dtype):
        x = s.to_numpy(dtype=np.float64, na_value=np.nan)
        finite = x[np.isfinite(x)]
        if np.array_equal(finite, np.round(finite)) and len(finite) == int((~np.isnan(x)).sum()):
            return s.astype("Int64").astype("string")
        return s.astype("string")
    if ptypes.is_string_dtype(s.dtype) and pd.api.types.infer_dtype(s, skipna=True) in ("string", "empty"):
        return s
    present = s.notna()
    return s.astype(object).where(~present, s.astype(str))
