"""Ingest of a source bigger than the data memory budget: a table on disk, read and written a column at a time.

Ingest's checks decide each column's kind from the whole column (a share of numbers, the distinct values, a row order),
so a stream of row batches would need every check rewritten over summaries, and two versions of each to agree. Instead
the big source is parsed into a spill of typed Arrow IPC chunks (`sources._spill_csv`, `_spill_jsonl`; a Parquet source
is read where it is), and the same checks run on one whole column at a time (`SpilledFrame`): each column is typed by
the same code on the same values, so the processed table is the one the in-memory path writes, value for value and dtype
for dtype. A typed column goes to an Arrow IPC file of record batches (`ColumnSpill`) until the table is written
(`write_table`), a batch of rows of every column at a time; a numeric column whose typed values are its raw values as
float64 is not written again but read back from the raw spill then (`ColumnSpill.link`). The raw row keys are hashed
a chunk of rows at a time (`SpilledFrame.row_blocks`) in a thread while the table is written (`ahead`), never held
whole.

Peak memory: a few copies of one column (the raw values, the typed values or codes, a check's temporaries) and a few
numbers per row (the rows kept, the target's codes): not the table, but still growing with the rows
(bench/out_of_core.py).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Generator, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.feather as feather
import pyarrow.parquet as pq
from pandas.api.types import infer_dtype, is_object_dtype
from pandas.core.util.hashing import combine_hash_arrays

from trainflow.core.errors import DataError
from trainflow.data.schema import ROW_KEY, parquet_options

BATCH_ROWS = 1 << 17  # rows per record batch of a spilled column, and per row group of the written table


@contextlib.contextmanager
def arrow_memory() -> Iterator[None]:
    """Arrow's buffers from its jemalloc allocator while ingest runs, where this pyarrow build has one (Linux wheels
    do); the pool before it again afterwards. The spilled ingest gives Arrow's freed memory back after each column
    (`release_unused`): with mimalloc the next column then gets fresh pages, which is slow, and the peak RSS is
    higher. Ingest only: streamed train peaked higher with jemalloc than with mimalloc.

    jemalloc's decay is set to 0 first (its arenas are made with it): freed pages go back to the OS at once, not over
    the next second, which lowers ingest's peak RSS (benchmarks/history/2026-11-27-out-of-core-b58515e.md)."""
    before = pa.default_memory_pool()
    with contextlib.suppress(NotImplementedError):  # a build without it (not Linux): Arrow's default stays
        pa.jemalloc_set_decay_ms(0)
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(before)


def read_column(path: Path, name: str) -> pa.ChunkedArray:
    """One column of a spilled chunk (Arrow IPC, whose types are kept exactly: Parquet has no seconds timestamps) or
    of a Parquet source file."""
    if path.suffix == ".arrow":
        return feather.read_table(path, columns=[name], memory_map=False).column(0)
    return pq.read_table(path, columns=[name]).column(0)


def to_pandas(table: pa.Table) -> pd.DataFrame:
    """A raw Arrow table as the reader converts it (sources._to_pandas does the same for a whole table)."""
    frame = table.to_pandas(split_blocks=True, self_destruct=True, date_as_object=False)
    frame.columns = [str(c) for c in frame.columns]
    return frame


class SpilledFrame:
    """A raw table held in files on disk (Arrow IPC chunks, or Parquet source files), read one column at a time: what
    validate reads of a frame
    (`columns`, `shape`, `len`, `[name]`). `parts[f]` are file f's chunk files in row order; `replaced[(f, name)]` a
    single-column file that holds that file's column instead (typed over the whole file); `types[name]` the type the
    column has over every file (a file's chunks are cast to it, as the in-memory reader casts whole files);
    `shown[f]`: file f as messages name it; `folder`: the spill, where ingest writes the typed columns too."""

    def __init__(
        self,
        folder: Path,
        parts: list[list[Path]],
        columns: list[str],
        types: dict[str, pa.DataType],
        replaced: dict[tuple[int, str], Path],
        rows: int,
        shown: list[str],
    ) -> None:
        self.folder, self.parts, self.columns, self.types = folder, parts, columns, types
        self.replaced, self.shown = replaced, shown
        self.shape = (rows, len(columns))
        self.batch_rows = BATCH_ROWS  # rows per record batch of the typed columns (fewer for images: their bytes)
        self.nulls: dict[str, int] = {}  # a column's nulls, known once it was read whole (`arrow`)

    def __len__(self) -> int:
        return self.shape[0]

    def arrow(self, name: str) -> pa.ChunkedArray:
        """The column over every file, as Arrow."""
        chunks: list[pa.Array] = []
        for f, files in enumerate(self.parts):
            for path in [self.replaced[(f, name)]] if (f, name) in self.replaced else files:
                column = read_column(path, name)
                if column.type != self.types[name]:
                    try:
                        column = column.cast(self.types[name])
                    except (pa.ArrowException, ValueError) as exc:
                        raise DataError(
                            f"data.source: column {name!r} of {self.shown[f]} is {column.type}, which cannot be "
                            f"combined with the other files' {self.types[name]} ({exc})"
                        ) from None
                chunks.extend(column.chunks)
        whole = pa.chunked_array(chunks, type=self.types[name])
        self.nulls[name] = whole.null_count
        return whole

    def linkable(self, name: str) -> bool:
        """Whether `pieces` gives the column: read from its files a piece at a time (not typed again over a whole file,
        `replaced`), of a type whose float64 values are exact conversions (integers, float32, float64)."""
        kind = self.types[name]
        numeric = pa.types.is_integer(kind) or kind in (pa.float32(), pa.float64())
        return numeric and not any(n == name for _, n in self.replaced)

    def pieces(self, name: str) -> Iterator[pa.Array]:
        """The column (one that is `linkable`) in row order, a chunk file (Arrow IPC) or a record batch (Parquet) at
        a time: never the whole column."""
        for files in self.parts:
            for path in files:
                if path.suffix == ".arrow":
                    arrays: Iterable[pa.Array] = read_column(path, name).chunks
                else:
                    file = pq.ParquetFile(path, pre_buffer=False)
                    arrays = (b.column(0) for b in file.iter_batches(batch_size=BATCH_ROWS, columns=[name]))
                for array in arrays:
                    yield array if array.type == self.types[name] else array.cast(self.types[name])

    def __getitem__(self, name: str) -> pd.Series:
        column = self.arrow(name)
        pa.default_memory_pool().release_unused()  # the files' read buffers, before the next column's
        return to_pandas(pa.table({name: column}))[name]

    def whole_dtypes(self, columns: list[str] | None = None) -> dict[str, Any]:
        """Each column's pandas dtype in the whole frame. A block's can differ: Arrow integers and booleans become
        float64 and object in pandas where the column holds a null, so a block without one would be int64 or bool
        (and hash differently) while the whole column is not."""
        dtypes = {}
        for name in self.columns if columns is None else columns:
            kind = self.types[name]
            nulls = (pa.types.is_integer(kind) or pa.types.is_boolean(kind)) and self.arrow(name).null_count > 0
            dtypes[name] = to_pandas(pa.table({name: pa.array([None] if nulls else [], kind)}))[name].dtype
        return dtypes

    def row_blocks(self, columns: list[str] | None = None) -> Iterator[pd.DataFrame]:
        """These columns (default: every one), a block of rows at a time (a chunk of a csv file or folder of images, a
        batch of a Parquet file), in row order; each column of the dtype it has in the whole frame."""
        names = self.columns if columns is None else columns
        dtypes = self.whole_dtypes(names)
        for f, files in enumerate(self.parts):
            replaced = {n: read_column(p, n) for (g, n), p in self.replaced.items() if g == f and n in names}
            lo = 0
            for path in files:
                if path.suffix == ".arrow":
                    read = [n for n in names if n not in replaced] or names[:1]  # one column at least: the rows
                    batches: Iterable[pa.RecordBatch | pa.Table] = [
                        feather.read_table(path, columns=read, memory_map=False)
                    ]
                else:
                    file = pq.ParquetFile(path, pre_buffer=False)
                    batches = file.iter_batches(batch_size=BATCH_ROWS, columns=names)
                for batch in batches:
                    n = batch.num_rows
                    arrays = {
                        name: (replaced[name].slice(lo, n) if name in replaced else batch.column(name))
                        for name in names
                    }
                    lo += n
                    table = pa.table({k: v.cast(self.types[k]) for k, v in arrays.items()})
                    block = to_pandas(table)
                    del table, arrays, batch
                    pa.default_memory_pool().release_unused()
                    yield block.astype({k: t for k, t in dtypes.items() if block[k].dtype != t})


def row_hashes(hashes: Iterable[np.ndarray], count: int) -> np.ndarray:
    """pd.util.hash_pandas_object(frame, index=False) of a frame of `count` columns from each column's own hashes
    (hash_pandas_object of the column), given one at a time: pandas' own combination, fed lazily."""
    return np.asarray(combine_hash_arrays(iter(hashes), count), dtype=np.uint64)


class ColumnSpill:
    """Typed columns written to Arrow IPC files in `folder`, each as pandas' to_parquet would convert it, then read
    back whole (`series`) or a batch of rows of every column at a time (`write_table`). A numeric column that is a raw
    column of `raw` as float64 is not written at all (`link`): it is read from the raw spill again, converted.

    Linking: without it a large ingest spends a good share of its time converting and writing its numeric columns,
    the same values the raw spill holds, and more deleting the spill (benchmarks/out-of-core.md)."""

    def __init__(self, folder: Path, batch_rows: int | None = None, raw: SpilledFrame | None = None) -> None:
        self.folder, self.raw = folder, raw
        self.batch_rows = batch_rows or BATCH_ROWS  # rows per record batch, the same in every column
        folder.mkdir(parents=True, exist_ok=True)
        self.names: list[str] = []
        self.linked: dict[str, tuple[str, bool]] = {}  # column -> its raw column in `raw`, whether it holds NaNs

    def _path(self, name: str) -> Path:
        return self.folder / f"{self.names.index(name)}.arrow"

    def linkable(self, raw_name: str) -> bool:
        """Whether a column that is `raw`'s column raw_name as float64 can be linked to it, not written."""
        return self.raw is not None and self.raw.linkable(raw_name)

    def link(self, name: str, raw_name: str, values: np.ndarray) -> None:
        """Store column `name`, whose `values` are the float64 values of `raw`'s column raw_name (`linkable`), as
        `put` stores them (a NaN becomes a null, as pyarrow converts pandas' floats), without writing them. Only where
        the raw column holds NaN values besides its nulls (a Parquet or JSON source can) is each batch searched for
        them."""
        assert self.raw is not None
        if name not in self.names:
            self.names.append(name)
        self._path(name).unlink(missing_ok=True)  # a rerun's spill: this column's earlier file
        nulls = self.raw.nulls.get(raw_name)
        self.linked[name] = (raw_name, nulls is None or int(np.count_nonzero(np.isnan(values))) != nulls)

    def _schema(self, name: str) -> pa.Schema:
        if name in self.linked:
            return pa.Schema.from_pandas(pd.DataFrame({name: np.zeros(0)}), preserve_index=False)
        with pa.OSFile(str(self._path(name)), "rb") as source:
            return pa.ipc.open_file(source).schema

    def _batches(self, name: str) -> Generator[pa.Table, None, None]:
        """The column as tables of `batch_rows` rows (the last one fewer), with its pandas metadata."""
        if name not in self.linked:
            with pa.OSFile(str(self._path(name)), "rb") as source:
                reader = pa.ipc.open_file(source)
                for i in range(reader.num_record_batches):
                    yield pa.Table.from_batches([reader.get_batch(i)])
            return
        assert self.raw is not None
        schema, (raw_name, nans) = self._schema(name), self.linked[name]
        for pieces in _rebatch(self.raw.pieces(raw_name), self.batch_rows):
            values = pa.chunked_array(pieces)
            if values.type != pa.float64():
                values = values.cast(pa.float64(), safe=False)  # as numpy converts integers: to the nearest float64
            if nans:
                nan = pc.is_nan(values)
                if pc.any(nan).as_py():
                    values = pc.if_else(nan, pa.scalar(None, pa.float64()), values)
            yield pa.Table.from_arrays([values], schema=schema)

    def put(self, name: str, values: Any) -> None:
        """Store a whole column, converted to Arrow a batch of rows at a time where its Arrow type is certain: its
        dtype's, or, for Python objects, strings' or bytes' when every value is one (the whole column's Arrow copy
        would be as big as it, on top of ingest's peak). Objects of other or mixed types (ints and floats from JSON)
        are converted whole, as pyarrow infers their type from all of them: converting a batch to the type of another
        batch's values can change them (2.5 cast to an int64 is 2, silently)."""
        series = values if isinstance(values, pd.Series) else pd.Series(values, copy=False)
        objects = is_object_dtype(series.dtype)
        if objects and infer_dtype(series, skipna=True) not in ("string", "bytes"):
            self.put_chunks(name, [series])
            return
        first = int(series.notna().to_numpy().argmax()) if objects else 0  # a value, not a missing one: its type
        schema = pa.Table.from_pandas(series.iloc[first : first + 1].to_frame(name), preserve_index=False).schema
        batches = (series.iloc[lo : lo + self.batch_rows] for lo in range(0, max(1, len(series)), self.batch_rows))
        self.put_chunks(name, batches, schema)

    def put_coded(self, name: str, codes: np.ndarray, categories: list[str]) -> None:
        """Store the column whose row i is categories[codes[i]] (None where the code is -1) as `put` stores those
        values, made by Arrow a batch at a time from the codes: no Python object per row, where the values would take
        8 bytes a row and their conversion a Python string each (ingest's categorical columns and labels)."""
        if not categories or not (codes >= 0).any():  # no value: `put` types the column from its values
            self.put(name, pd.Series(np.full(len(codes), None, dtype=object)))
            return
        schema = pa.Schema.from_pandas(pd.Series(categories[:1], dtype=object).to_frame(name), preserve_index=False)
        dictionary = pa.array(categories, pa.string())
        batches = (
            pa.table({name: dictionary.take(pa.array(part, mask=part < 0))}, schema=schema)
            for part in (codes[lo : lo + self.batch_rows] for lo in range(0, len(codes), self.batch_rows))
        )
        self.put_chunks(name, batches, schema)

    def put_chunks(self, name: str, chunks: Iterable[pd.Series | pa.Table], schema: pa.Schema | None = None) -> None:
        """The column given as consecutive pieces (a column of images a spilled chunk at a time; Arrow tables of it,
        from `put_coded`): stored as `put` stores the whole column, converted to `schema`, by default the first
        piece's (pieces are cast to its types)."""
        if name not in self.names:
            self.names.append(name)
        with contextlib.ExitStack() as files:
            writer: pa.ipc.RecordBatchFileWriter | None = None
            pending: list[pa.Table] = []
            for series in chunks:
                if isinstance(series, pa.Table):
                    table = series
                else:
                    table = pa.Table.from_pandas(series.to_frame(name), schema=schema, preserve_index=False)
                if writer is None or schema is None:
                    schema = table.schema
                    sink = files.enter_context(pa.OSFile(str(self._path(name)), "wb"))
                    writer = files.enter_context(pa.ipc.new_file(sink, schema))
                pending.append(table.cast(schema))
                del table
                while sum(t.num_rows for t in pending) >= self.batch_rows:  # one batch per batch_rows rows
                    joined = pa.concat_tables(pending)
                    writer.write_table(joined.slice(0, self.batch_rows).combine_chunks())
                    pending = [joined.slice(self.batch_rows)]
                    del joined
                    pa.default_memory_pool().release_unused()
            if writer is None:
                raise ValueError(f"column {name!r}: no values given")
            rest = pa.concat_tables(pending)
            if rest.num_rows:
                writer.write_table(rest.combine_chunks())
            del pending, rest
        pa.default_memory_pool().release_unused()  # Arrow's allocator keeps freed memory until asked to give it back

    def series(self, name: str) -> pd.Series:
        """The column as it was put (dtype and values, through its pandas metadata)."""
        tables = list(self._batches(name))
        table = pa.concat_tables(tables) if tables else self._schema(name).empty_table()
        del tables
        column = table.to_pandas()[name]
        del table
        pa.default_memory_pool().release_unused()
        return column

    def batches(self, name: str) -> Iterator[pd.Series]:
        """The column a record batch (`batch_rows` rows) at a time, each converted as `series` converts the whole
        column: the values were put from pandas, so their Arrow types and pandas metadata fix the dtype of every
        batch alike."""
        for table in self._batches(name):
            yield table.to_pandas()[name]

    def hashes(self, name: str) -> np.ndarray:
        """pd.util.hash_pandas_object(series(name), index=False), a batch at a time (a value's hash is its own)."""
        parts = [pd.util.hash_pandas_object(s, index=False).to_numpy(dtype=np.uint64) for s in self.batches(name)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)

    def take(self, rows: np.ndarray, names: list[str]) -> pd.DataFrame:
        """These rows of these columns, as a frame (index 0..len-1); read a batch at a time, so a column of images is
        never held whole."""
        order = np.argsort(rows, kind="stable")
        ordered = np.asarray(rows)[order]
        columns = {}
        for n in names:
            parts, lo = [], 0
            for s in self.batches(n):
                hit = ordered[(ordered >= lo) & (ordered < lo + len(s))]
                if len(hit):
                    parts.append(s.iloc[hit - lo])
                lo += len(s)
            joined = pd.concat(parts) if parts else self._empty(n)
            column = joined.iloc[np.argsort(order, kind="stable")] if len(joined) else joined  # back to `rows` order
            columns[n] = column.reset_index(drop=True)
        return pd.DataFrame(columns)

    def _empty(self, name: str) -> pd.Series:
        return self._schema(name).empty_table().to_pandas()[name]

    def write_table(
        self, dest: Path, names: list[str], keep: np.ndarray | None, row_keys: Iterator[np.ndarray] | None = None
    ) -> int:
        """Write columns `names` as one Parquet file, the rows where `keep` (all when None), a batch at a time; read
        back by pd.read_parquet as the in-memory frame of these columns written with to_parquet(index=False).
        `row_keys`: a last column, ROW_KEY, given as consecutive blocks of uint64 of any size (made as the table is
        written, never held whole). Returns the rows written."""
        columns = [self._batches(n) for n in names]
        schemas = [self._schema(n) for n in names]
        try:
            return _write_batches(dest, schemas, columns, keep, None if row_keys is None else _Rows(row_keys))
        finally:
            for column in columns:
                column.close()  # its file, where an error stopped the write early


class _Rows:
    """Values given as consecutive blocks of any size, taken `n` at a time."""

    def __init__(self, blocks: Iterator[np.ndarray]) -> None:
        self.blocks, self.rest = blocks, np.zeros(0, dtype=np.uint64)

    def take(self, n: int) -> np.ndarray:
        parts, have = [self.rest], len(self.rest)
        while have < n:
            block = next(self.blocks, None)
            if block is None:
                raise RuntimeError(f"{have} row keys for {n} rows")  # not the table's rows: a bug, not the data
            parts.append(block)
            have += len(block)
        joined = np.concatenate(parts) if len(parts) > 1 else parts[0]
        self.rest = joined[n:]
        return joined[:n]

    def done(self) -> None:
        if len(self.rest) or next(self.blocks, None) is not None:
            raise RuntimeError("more row keys than rows")


def _write_batches(
    dest: Path,
    schemas: list[pa.Schema],
    columns: Sequence[Iterator[pa.Table]],
    keep: np.ndarray | None,
    row_keys: _Rows | None,
) -> int:
    if row_keys is not None:  # as pandas converts the in-memory frame's column
        schemas = [
            *schemas,
            pa.Schema.from_pandas(pd.DataFrame({ROW_KEY: np.zeros(0, np.uint64)}), preserve_index=False),
        ]
    meta = [json.loads(s.metadata[b"pandas"]) for s in schemas]
    pandas_meta = dict(meta[0], columns=[m["columns"][0] for m in meta])
    schema = pa.schema([s.field(0) for s in schemas], metadata={b"pandas": json.dumps(pandas_meta).encode()})
    written = 0
    with pq.ParquetWriter(dest, schema, **parquet_options(schema)) as writer:
        lo = 0
        for batches in zip(*columns, strict=True):
            n = batches[0].num_rows
            arrays = [b.column(0) for b in batches]  # a linked column's may be in pieces
            if row_keys is not None:
                arrays.append(pa.array(row_keys.take(n), pa.uint64()))
            table = pa.Table.from_arrays(arrays, schema=schema)
            if keep is not None:
                table = table.filter(pa.array(keep[lo : lo + n]))
            lo += n
            if table.num_rows:
                writer.write_table(table)
                written += table.num_rows
    if row_keys is not None:
        row_keys.done()
    return written


def _rebatch(arrays: Iterable[pa.Array], rows: int) -> Iterator[list[pa.Array]]:
    """The values of `arrays`, in order, as lists of slices of them that hold `rows` values each (the last one fewer;
    none for no values): never copied."""
    pending: list[pa.Array] = []
    have = 0
    for array in arrays:
        while len(array):
            take = min(rows - have, len(array))
            pending.append(array.slice(0, take))
            have, array = have + take, array.slice(take)
            if have == rows:
                yield pending
                pending, have = [], 0
    if have:
        yield pending


T = TypeVar("T")


def ahead(items: Iterator[T]) -> Generator[T, None, None]:
    """`items`, the next one made in a thread while the caller works on this one. An error making one is raised
    here, in its place. Close it (contextlib.closing) where the caller may stop early: an error's traceback would
    keep it, and its thread, alive."""
    done = object()
    with ThreadPoolExecutor(1, thread_name_prefix="trainflow-ahead") as pool:
        coming = pool.submit(next, items, done)
        while (item := coming.result()) is not done:
            coming = pool.submit(next, items, done)
            yield item  # type: ignore[misc]
