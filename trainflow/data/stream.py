"""Splits larger than the data memory budget (`data.memory_budget_mb`): read from their Parquet file a column or a
block of rows at a time, never whole.

- The preprocessing is fitted column by column (`ParquetColumns`: Parquet is columnar, so one column is read without
  the others), by the same code on the same whole columns as in memory: the same statistics, bit for bit.
- The preprocessed matrix is written a block of rows at a time into .npy files (`write_matrix`), which the engine's
  MemmapData reads batches from by index. The row transform is row-wise, so each block's rows are the ones the
  in-memory transform gives.

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
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from trainflow.data.schema import PATH_SUFFIX
from trainflow.errors import DataError
from trainflow.io import parquet_options
from trainflow.paths import restore

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
# frame, the preprocessed matrix, the outputs (measured: evaluate held a 830 MiB test split in 4.7 GiB, 5.7x).
MEMORY_PER_TABLE_BYTE = 6


def choose(paths: list[Path], d: DataParams, text: bool = False) -> Choice:
    """Stream the splits when together they would take more than the budget in memory (MEMORY_PER_TABLE_BYTE times
    their data), unless the data is text."""
    size, budget = sum(table_mb(p) for p in paths), budget_mb(d)
    need = MEMORY_PER_TABLE_BYTE * size
    what = f"{' + '.join(p.stem for p in paths)}: {size:,.1f} MiB, about {need:,.0f} MiB in memory"
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
    """A Parquet file as a read-only frame whose columns are read when they are asked for, one at a time: what
    Preprocessor.fit and .labels use of a DataFrame (`columns`, `len`, `[name]`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = _open(path)
        self.columns = list(self.file.schema_arrow.names)

    def __len__(self) -> int:
        return int(self.file.metadata.num_rows)

    def __getitem__(self, name: str) -> pd.Series:
        # Read as pd.read_parquet reads the whole file (the pandas metadata restores the same dtype), one column.
        with _reading(self.path):
            column = pd.read_parquet(self.path, columns=[name])[name]
        pa.default_memory_pool().release_unused()  # the reader's buffers, before the column is worked on
        return column

    def row_blocks(self, columns: list[str]) -> Iterator[pd.DataFrame]:
        """These columns a block of about BLOCK_BYTES of the file's data at a time (a column of images is never read
        whole)."""
        return blocks(self.path, data_rows(self.path), columns)


def blocks(path: Path, rows: int, columns: list[str]) -> Iterator[pd.DataFrame]:
    """The split at `path` as frames of `rows` rows (the last one shorter), in file order, read as needed."""
    with _reading(path):
        for batch in _open(path).iter_batches(batch_size=rows, columns=columns):
            yield batch.to_pandas()


def write_parts(path: Path, part_of_row: np.ndarray, dests: list[Path], drop: list[str]) -> list[int]:
    """Write the rows of the Parquet table at `path` into `dests[part_of_row[i]]`, in table order, reading a block of
    about BLOCK_BYTES at a time; `drop`: columns left out. Each part is read back (pd.read_parquet) as the in-memory
    `frame.iloc[rows]` written with to_parquet would be: the same columns, dtypes and values. Returns the rows per
    part.

    A part's rows are gathered into row groups of a block's rows (not the part's share of each block: small row
    groups are slow to write and to read), and each part is written in a thread of its own, which encodes it while
    the next block is read (pyarrow's writer lets go of the GIL). Held: a block and, per part, a row group being
    gathered and one being written."""
    file = _open(path)
    columns = [c for c in file.schema_arrow.names if c not in drop]
    schema = pa.schema([file.schema_arrow.field(c) for c in columns], metadata=file.schema_arrow.metadata)
    rows = data_rows(path)
    counts = [0] * len(dests)
    gathered: list[list[pa.Table]] = [[] for _ in dests]
    writing: list[Future[None] | None] = [None] * len(dests)
    with contextlib.ExitStack() as stack:
        writers = [stack.enter_context(pq.ParquetWriter(d, schema, **parquet_options(schema))) for d in dests]
        pool = stack.enter_context(ThreadPoolExecutor(len(dests), thread_name_prefix="trainflow-split"))

        def flush(i: int) -> None:
            if (pending := writing[i]) is not None:
                pending.result()  # one write per part at a time, in order; its error is raised here
            group, gathered[i] = pa.concat_tables(gathered[i]), []  # one row group of its chunks, not copied again
            writing[i] = pool.submit(writers[i].write_table, group)

        lo = 0
        with _reading(path):
            for batch in file.iter_batches(batch_size=rows, columns=columns):
                parts = part_of_row[lo : lo + batch.num_rows]
                lo += batch.num_rows
                for i in range(len(dests)):
                    take = np.flatnonzero(parts == i)
                    if len(take):
                        gathered[i].append(pa.Table.from_batches([batch.take(pa.array(take))], schema=schema))
                        counts[i] += len(take)
                    if sum(t.num_rows for t in gathered[i]) >= rows:
                        flush(i)
        for i in range(len(dests)):
            if gathered[i]:
                flush(i)
            if (pending := writing[i]) is not None:
                pending.result()
    return counts


def data_rows(path: Path, multiple: int = 1) -> int:
    """Rows per block: about BLOCK_BYTES of the Parquet file's data (uncompressed), a whole number of `multiple`s."""
    n = int(_open(path).metadata.num_rows)
    rows = max(1, int(BLOCK_BYTES * n / max(1.0, table_mb(path) * 2**20))) if n else 1
    return max(multiple, rows - rows % multiple)


def block_rows(width: int, multiple: int = 1) -> int:
    """Rows per block: about BLOCK_BYTES of float32 matrix of `width` columns, a whole number of `multiple`s."""
    rows = max(1, BLOCK_BYTES // max(1, 4 * width))
    return max(multiple, rows - rows % multiple)


def input_columns(pre: Preprocessor, path: Path) -> list[str]:
    """The columns of the split at `path` that the model's inputs and targets are made from: the table's features,
    or the image column and its paths (when the file has them, for messages), and the target."""
    images = [] if pre.image_column is None else [pre.image_column, pre.image_column + PATH_SUFFIX]
    names = set(_open(path).schema_arrow.names)
    return [*pre.raw_features, *(c for c in images if c in names or c == pre.image_column), pre.target]


def head(path: Path, n: int) -> pd.DataFrame:
    """The first `n` rows of a Parquet file, reading no more than its first row group."""
    with _reading(path):
        first = next(_open(path).iter_batches(batch_size=n), None)
        return first.to_pandas() if first is not None else pd.read_parquet(path)  # no rows: the empty frame


def write_matrix(pre: Preprocessor, path: Path, dest: Path, where: str) -> tuple[np.ndarray, np.ndarray]:
    """The preprocessed features and targets of the split at `path`, as model_inputs computes them for a table,
    written a block of rows at a time to dest/x.npy and dest/y.npy; returned memory-mapped, read-only."""
    n = int(_open(path).metadata.num_rows)
    dest.mkdir(parents=True, exist_ok=True)
    y_type = np.float32 if pre.task == "regression" else np.int64
    # Written with plain writes: a memory map being written holds every page it wrote in the process's RSS.
    with _npy(dest / "x.npy", np.float32, (n, pre.width)) as x, _npy(dest / "y.npy", y_type, (n,)) as y:
        for frame in blocks(path, block_rows(pre.width), [*pre.raw_features, pre.target]):
            x.write(np.ascontiguousarray(pre.features(frame, where), dtype=np.float32).tobytes())
            labels = pre.labels(frame, where)
            y.write(np.ascontiguousarray(pre.scale_target(labels) if pre.task == "regression" else labels,
                                         dtype=y_type).tobytes())  # fmt: skip
    return np.load(dest / "x.npy", mmap_mode="r"), np.load(dest / "y.npy", mmap_mode="r")


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
