"""Splits larger than the data memory budget (`data.memory_budget_mb`): read a column or a block of rows at a time,
never whole. A split is a Parquet file of its own or, streamed, its rows of the processed table (`Split`).

- The preprocessing is fitted column by column (`ParquetColumns`: Parquet is columnar, so one column is read without
  the others), by the same code on the same whole columns as in memory: the same statistics, bit for bit.
- The preprocessed matrix is written a block of rows at a time into .npy files (`write_matrices`: train and val from
  one read of the table), which the engine's MemmapData reads batches from by index. The transform is row-wise, so
  each block's rows are the ones the in-memory transform gives.

Peak memory: one column (fit) or one block of rows (transform); the files' pages stay in the OS's page cache, never
mapped into the process.
- Images are copied a block of rows at a time from the split's Parquet file into one file of their encoded bytes
  back to back, with each one's offset (the train stage's `streamed_images`): a batch reads its images by offset
  (`RecordFile`) and decodes them in the background, as in memory when they are too many to hold decoded. The fit
  reads the images a block at a time too (`ParquetColumns.row_blocks`).

The evaluate stage (and register's re-score) score a big test split a block of whole batches at a time: the same
batches, so the same outputs. Text is held in memory (the stages say so).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from trainflow.core.errors import DataError
from trainflow.core.paths import SPLITS, restore
from trainflow.data.schema import PATH_SUFFIX, ROW_KEY

if TYPE_CHECKING:
    from trainflow.data.preprocess import Preprocessor
    from trainflow.params import DataParams

# Rows per block of the transform: about this much of preprocessed matrix (the block's frame and the transform's
# temporaries take a few times it).
BLOCK_BYTES = 16 << 20


def _repair(path: Path) -> str:
    """How to restore a file read here: the processed table (the split stage reads it) or a split."""
    return restore("data/processed", "ingest") if path.parent.name == "processed" else restore("data/splits", "split")


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[None]:
    """A missing or damaged file is a DataError naming it and how to restore it (as io.read_parquet says)."""
    try:
        yield
    except FileNotFoundError:
        raise DataError(f"{path} is missing; {_repair(path)}") from None
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DataError(f"{path} cannot be read, it is corrupt or truncated ({exc}); {_repair(path)}") from None


def _open(path: Path) -> pq.ParquetFile:
    with _reading(path):
        return pq.ParquetFile(path, pre_buffer=False)  # pre-buffering holds many row groups: memory grows with the file


def budget_mb(d: DataParams) -> float:
    """data.memory_budget_mb, or a quarter of this machine's memory when it is null."""
    if d.memory_budget_mb is not None:
        return d.memory_budget_mb
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 4 / 2**20


def table_mb(path: Path) -> float:
    """The split's size once read (Parquet's uncompressed column data), from the file's footer alone."""
    meta = _open(path).metadata
    return sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)) / 2**20


@dataclass
class Choice:
    """Whether a split is streamed, and why (printed by the train stage)."""

    streamed: bool
    why: str


# A split held in memory takes about this many times its Parquet data (uncompressed) at the peak of a stage: the
# frame, the preprocessed matrix, the outputs (measured on evaluate: benchmarks/history/2026-11-26-out-of-core.md).
MEMORY_PER_TABLE_BYTE = 6


def choose(sources: list[Split | Path], d: DataParams, text: bool = False) -> Choice:
    """Stream the splits when together they would take more than the budget in memory (MEMORY_PER_TABLE_BYTE times
    their data), unless the data is text."""
    splits = [as_split(s) for s in sources]
    size, budget = sum(s.mb() for s in splits), budget_mb(d)
    need = MEMORY_PER_TABLE_BYTE * size
    what = f"{' + '.join(s.name for s in splits)}: {size:,.1f} MiB, about {need:,.0f} MiB in memory"
    if need <= budget:
        return Choice(False, f"held in memory ({what}; data.memory_budget_mb {budget:,.0f})")
    if text:
        return Choice(
            False,
            f"held in memory although over data.memory_budget_mb {budget:,.0f} ({what}): text is not streamed "
            "so far, tables and images are",
        )
    return Choice(True, f"streamed from disk ({what}, over data.memory_budget_mb {budget:,.0f})")


class ParquetColumns:
    """A split (or a Parquet file) as a read-only frame whose columns are read when they are asked for, one at a
    time: what Preprocessor.fit and .labels use of a DataFrame (`columns`, `len`, `[name]`)."""

    def __init__(self, source: Split | Path) -> None:
        self.split = as_split(source)
        self.file = _open(self.split.path)
        self.columns = self.split.columns

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, name: str) -> pd.Series:
        column = self.split.column(name)
        pa.default_memory_pool().release_unused()  # the reader's buffers, before the column is worked on
        return column

    def row_blocks(self, columns: list[str]) -> Iterator[pd.DataFrame]:
        """These columns a block of about BLOCK_BYTES of the file's data at a time (a column of images is never read
        whole)."""
        return blocks(self.split, data_rows(self.split), columns)


def blocks(source: Split | Path, rows: int, columns: list[str]) -> Iterator[pd.DataFrame]:
    """The split (or file) as frames of `rows` rows (the last one shorter), in table order, read as needed."""
    return as_split(source).batches(rows, columns)


def data_rows(source: Split | Path, multiple: int = 1) -> int:
    """Rows per block: about BLOCK_BYTES of the Parquet file's data (uncompressed), a whole number of `multiple`s."""
    path = as_split(source).path
    n = int(_open(path).metadata.num_rows)
    rows = max(1, int(BLOCK_BYTES * n / max(1.0, table_mb(path) * 2**20))) if n else 1
    return max(multiple, rows - rows % multiple)


def block_rows(width: int, multiple: int = 1) -> int:
    """Rows per block: about BLOCK_BYTES of float32 matrix of `width` columns, a whole number of `multiple`s."""
    rows = max(1, BLOCK_BYTES // max(1, 4 * width))
    return max(multiple, rows - rows % multiple)


def input_columns(pre: Preprocessor, source: Split | Path) -> list[str]:
    """The columns of the split at `path` that the model's inputs and targets are made from: the table's features,
    or the image column and its paths (when the file has them, for messages), and the target."""
    images = [] if pre.image_column is None else [pre.image_column, pre.image_column + PATH_SUFFIX]
    names = set(as_split(source).columns)
    return [*pre.raw_features, *(c for c in images if c in names or c == pre.image_column), pre.target]


def head(source: Split | Path, n: int) -> pd.DataFrame:
    """The first `n` rows of a split (or file), reading no further than the row groups that hold them."""
    split = as_split(source)
    first = next(split.batches(n, split.columns), None)
    return first if first is not None else split.read()  # no rows: the empty frame


def write_matrix(pre: Preprocessor, source: Split | Path, dest: Path, where: str) -> tuple[np.ndarray, np.ndarray]:
    """The preprocessed features and targets of the split, as model_inputs computes them for a table, written a
    block of rows at a time to dest/x.npy and dest/y.npy; returned memory-mapped, read-only."""
    return write_matrices(pre, [as_split(source)], [dest], [where])[0]


def write_matrices(
    pre: Preprocessor, splits: list[Split], dests: list[Path], wheres: list[str]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """write_matrix of each split, reading each file once: the splits that are rows of one table (a streamed split's
    train and val) take their rows from the same blocks of it. The transform is row-wise, so a block's rows give the
    rows the whole split's transform gives, however the blocks are cut."""
    columns = [*pre.raw_features, pre.target]
    y_type = np.float32 if pre.task == "regression" else np.int64
    for path in dict.fromkeys(s.path for s in splits):
        mine = [i for i, s in enumerate(splits) if s.path == path]
        masks = [splits[i].mask() for i in mine]
        schema = splits[mine[0]]._schema(columns)
        with contextlib.ExitStack() as stack:
            outputs = []
            for i in mine:
                dests[i].mkdir(parents=True, exist_ok=True)
                n = len(splits[i])
                # Written with plain writes: a memory map being written holds every page it wrote in the process's RSS.
                outputs.append((stack.enter_context(_npy(dests[i] / "x.npy", np.float32, (n, pre.width))),
                                stack.enter_context(_npy(dests[i] / "y.npy", y_type, (n,)))))  # fmt: skip
            lo = 0
            with _reading(path):
                for batch in _open(path).iter_batches(batch_size=block_rows(pre.width), columns=columns):
                    for i, mask, (x, y) in zip(mine, masks, outputs, strict=True):
                        part = batch if mask is None else batch.filter(pa.array(mask[lo : lo + batch.num_rows]))
                        if not part.num_rows:
                            continue
                        frame = pa.Table.from_batches([part], schema).to_pandas()
                        x.write(np.ascontiguousarray(pre.features(frame, wheres[i]), dtype=np.float32).tobytes())
                        labels = pre.labels(frame, wheres[i])
                        values = pre.scale_target(labels) if pre.task == "regression" else labels
                        y.write(np.ascontiguousarray(values, dtype=y_type).tobytes())
                    lo += batch.num_rows
    return [(np.load(d / "x.npy", mmap_mode="r"), np.load(d / "y.npy", mmap_mode="r")) for d in dests]


@contextlib.contextmanager
def _npy(path: Path, dtype: type, shape: tuple[int, ...]) -> Iterator[BinaryIO]:
    """A .npy file of `shape` whose data the caller writes in order, row-major; checked whole when closed."""
    with path.open("wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape}
        )
        start = f.tell()
        yield f
        written, expected = f.tell() - start, int(np.prod(shape)) * np.dtype(dtype).itemsize
        if written != expected:
            raise AssertionError(f"{path}: wrote {written} bytes of data, its header says {expected}")


# --- a split as the split stage stores it --------------------------------------------------------------------------

LINKED = "table.parquet"  # data/splits/table.parquet: a streamed split's rows (a link to the processed table)
ROWS = "rows.npy"  # data/splits/rows.npy: the split of each of its rows (int8, paths.SPLITS' index)


class Split:
    """A split as stored: a Parquet file of its own (a split held in memory writes data/splits/<name>.parquet, handy
    to open), or the rows of data/splits/table.parquet that data/splits/rows.npy marks with `part` (a streamed split:
    a link to the processed table and a byte a row, not a copy of a table bigger than memory). Read as one frame, a
    column at a time or a block of rows at a time, the same either way: the rows in table order, the table's columns
    but the row key, the dtypes pd.read_parquet gives."""

    def __init__(self, path: Path, part: int | None = None) -> None:
        self.path, self.part = path, part
        self._mask: np.ndarray | None = None

    @classmethod
    def stored(cls, splits: Path, name: str) -> Split:
        """Split `name` of the folder `splits`: its own file where there is one (or neither form is: its name for
        the message), else its rows of the linked table."""
        own = splits / f"{name}.parquet"
        if own.is_file() or not (splits / ROWS).is_file():
            return cls(own)
        return cls(splits / LINKED, SPLITS.index(name))

    @property
    def name(self) -> str:
        return self.path.stem if self.part is None else SPLITS[self.part]

    def __str__(self) -> str:
        if self.part is None:
            return str(self.path)
        return f"{self.path.parent / self.name} (the rows of {self.path.name} that {ROWS} marks {self.part})"

    def exists(self) -> bool:
        return self.path.is_file() and (self.part is None or (self.path.parent / ROWS).is_file())

    def files(self) -> list[Path]:
        """The files that hold it (what its hash is made of)."""
        return [self.path] if self.part is None else [self.path, self.path.parent / ROWS]

    def mask(self) -> np.ndarray | None:
        """Whether each row of the file is in the split (None: every row is)."""
        if self.part is not None and self._mask is None:
            rows_file = self.path.parent / ROWS
            with _reading(rows_file):
                rows = np.load(rows_file, mmap_mode="r")
            n = int(_open(self.path).metadata.num_rows)
            if rows.shape != (n,):
                raise DataError(f"{rows_file} holds {rows.shape} split numbers for the {n} rows of {self.path}; "
                                f"{_repair(rows_file)}")  # fmt: skip
            self._mask = np.asarray(rows == self.part)
        return self._mask

    def __len__(self) -> int:
        mask = self.mask()
        return int(_open(self.path).metadata.num_rows) if mask is None else int(np.count_nonzero(mask))

    @property
    def columns(self) -> list[str]:
        names = list(_open(self.path).schema_arrow.names)
        return names if self.part is None else [c for c in names if c != ROW_KEY]

    def mb(self) -> float:
        """Its size once read (Parquet's uncompressed column data): its share of the file's."""
        whole = int(_open(self.path).metadata.num_rows)
        return table_mb(self.path) * (len(self) / whole if whole else 0.0)

    def read(self) -> pd.DataFrame:
        """The whole split as a DataFrame."""
        if self.part is None:
            from trainflow.core.io import read_parquet

            return read_parquet(self.path, _repair(self.path))
        return self.read_columns(self.columns)

    def column(self, name: str) -> pd.Series:
        if self.part is None:  # as pd.read_parquet reads the whole file (the pandas metadata restores the dtype)
            with _reading(self.path):
                return pd.read_parquet(self.path, columns=[name])[name]
        return self.read_columns([name])[name]

    def read_columns(self, columns: list[str]) -> pd.DataFrame:
        """These columns of every row, read a block of rows at a time (never the file's whole column)."""
        return pa.Table.from_batches(
            list(self._selected(data_rows(self.path), columns)), self._schema(columns)
        ).to_pandas()

    def batches(self, rows: int, columns: list[str]) -> Iterator[pd.DataFrame]:
        """These columns as frames of `rows` rows (the last one shorter), in table order, read as needed."""
        schema = self._schema(columns)
        held: list[pa.RecordBatch] = []
        count = 0
        for batch in self._selected(rows, columns):
            held.append(batch)
            count += batch.num_rows
            while count >= rows:  # cut to exactly `rows`: evaluate's blocks are whole batches
                table = pa.Table.from_batches(held, schema)
                yield table.slice(0, rows).to_pandas()
                rest = table.slice(rows)
                held, count = rest.to_batches(), rest.num_rows
        if count:
            yield pa.Table.from_batches(held, schema).to_pandas()

    def _schema(self, columns: list[str]) -> pa.Schema:
        whole = _open(self.path).schema_arrow
        return pa.schema([whole.field(c) for c in columns], metadata=whole.metadata)

    def _selected(self, rows: int, columns: list[str]) -> Iterator[pa.RecordBatch]:
        """The file's batches of `rows` rows, cut down to the split's rows."""
        mask, lo = self.mask(), 0
        with _reading(self.path):
            for batch in _open(self.path).iter_batches(batch_size=rows, columns=columns):
                if mask is None:
                    yield batch
                    continue
                keep = mask[lo : lo + batch.num_rows]
                lo += batch.num_rows
                if keep.all():
                    yield batch
                elif keep.any():
                    yield batch.filter(pa.array(keep))


def as_split(source: Split | Path) -> Split:
    """A path is a file read whole (the processed table, a split file, a predict input)."""
    return source if isinstance(source, Split) else Split(source)
