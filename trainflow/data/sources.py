"""Raw data sources: table files (CSV, TSV, Parquet, JSONL), folders of images, or a dataset that ships inside
scikit-learn.

`read_source(data_params, root)` returns a `RawTable`: the typed pandas frame plus, per row, which file it came from
and its record number in that file, so that any later check can name the file and line of a bad value
(`RawTable.where`). Locating a line re-scans that one file with the csv module, so it happens only when an error is
reported; reading itself is pyarrow's multithreaded reader and numpy, with no per-row Python work.

Images (see `read_images` below) become a column of the files' bytes, as read: the processed table is then
self-contained, and DVC's hash of it changes when an image does (a column of paths would let images change unseen).

Every problem is a DataError whose one-line message names the file, the line (and the column where it applies) and
what to change.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import dataclasses
import functools
import glob
import hashlib
import io
import json
import re
import sys
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pv
import pyarrow.feather as feather
import pyarrow.json as pj
import pyarrow.parquet as pq

from trainflow.core.errors import DataError
from trainflow.core.io import failpoint
from trainflow.core.progress import progress
from trainflow.data.schema import NA_VALUES, PATH_SUFFIX
from trainflow.data.spill import SpilledFrame, ahead, read_column
from trainflow.params import BUILTIN_DATASETS, GLOB_CHARS, DataParams

FORMAT_BY_SUFFIX = {
    ".csv": "csv",
    ".txt": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
}
TEXT_FORMATS = ("csv", "tsv", "jsonl")
# Bytes per block of pyarrow's readers: blocks are parsed in parallel; larger blocks cost less per block.
BLOCK_SIZE = 4 << 20
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
DEFAULT_IMAGE_COLUMN = "image"  # the image column of a folder of class folders when data.image_column is null
_NA_SET = frozenset(NA_VALUES)


@dataclass
class RawTable:
    """The raw table and where each of its rows came from."""

    frame: pd.DataFrame  # every column, named by str, typed by the reader; NA spellings are missing values
    source: str  # data.source as given
    files: list[Path]  # files read, in order ([] for builtin)
    rows: list[int]  # rows per file, in order (builtin: one entry): `position`, `file_index` and `record` follow
    fmt: str  # csv | tsv | parquet | jsonl | builtin | images (a folder of class folders: one file per row)
    root: Path | None = None  # files are shown relative to it
    delimiter: str = ","
    encoding: str = "utf-8"
    header: bool = True
    image_column: str | None = None  # the column of encoded image bytes (the files' paths in <it>_path)
    # what reading did that the user should know (a column dropped), for the caller to print as its own
    notes: list[str] = field(default_factory=list)
    # the sha256 of files read whole, in order, as they were read (a streamed csv): sources.json needs no second read
    digests: dict[Path, str] = field(default_factory=dict)
    header_rows: int = 1  # lines of a csv/tsv header (data.header_rows), where `header`
    # file index -> the line on which each of its first records starts (filled by where_many as it scans)
    _lines: dict[int, array[int]] = field(default_factory=dict, init=False, repr=False, compare=False)

    @functools.cached_property
    def _starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.rows, dtype=np.int64)])

    def position(self, row: int) -> tuple[int, int]:
        """(file index, 0-based data record within that file) of frame row `row` (header and blank lines not
        counted), from the rows per file: nothing is held per row."""
        f = int(np.searchsorted(self._starts, row, side="right")) - 1
        return f, int(row - self._starts[f])

    @functools.cached_property
    def file_index(self) -> np.ndarray:
        """int32 per row: index into `files` (0 for builtin) of the row's file."""
        return np.repeat(np.arange(len(self.rows), dtype=np.int32), self.rows)

    @functools.cached_property
    def record(self) -> np.ndarray:
        """int64 per row: the row's 0-based data record within its file."""
        return np.arange(sum(self.rows), dtype=np.int64) - np.repeat(self._starts[:-1], self.rows)

    @property
    def headers(self) -> int:
        """The lines of header before a csv/tsv file's records."""
        return self.header_rows if self.header else 0

    def shown(self, file: int) -> str:
        """File number `file` as messages show it: relative to the project root when it is inside it."""
        return _shown(self.files[file], self.root)

    def where(self, row: int, column: str | None = None) -> str:
        """Where frame row `row` (positional) is, for a message: "data/raw/x.csv, line 57, column 'age'".

        csv/tsv: the line on which the row's record starts (quoted newlines and blank lines accounted for); jsonl:
        the row's line; parquet: "file, row N" and builtin: "builtin:iris, row N" (N counted from 1). Re-scans the
        file, so call it when reporting an error, not per row (`where_many` scans each file once for many rows).
        """
        return self.where_many([row], column)[0]

    def where_many(self, rows: Sequence[int], column: str | None = None) -> list[str]:
        """`where` for several rows. Each file is scanned at most once up to the furthest record asked for; the line
        numbers found are kept, so later calls for earlier records cost nothing."""
        rows = [int(r) for r in rows]
        suffix = "" if column is None else f", column {column!r}"
        positions = [self.position(r) for r in rows]
        if self.fmt == "builtin":
            return [f"{self.source}, row {rec + 1}{suffix}" for _, rec in positions]
        if self.fmt == "images":
            return [f"{self.shown(f)}{suffix}" for f, _ in positions]
        if self.fmt in ("csv", "tsv", "jsonl"):
            furthest: dict[int, int] = {}
            for f, rec in positions:
                furthest[f] = max(furthest.get(f, -1), rec)
            for f, rec in furthest.items():
                if len(self._lines.get(f, ())) <= rec:
                    self._lines[f] = (
                        _jsonl_start_lines(self.files[f], self.encoding, rec)
                        if self.fmt == "jsonl"
                        else _csv_start_lines(self.files[f], self.delimiter, self.encoding, self.headers, rec)
                    )
        out = []
        for f, rec in positions:
            lines = self._lines.get(f, ())
            if rec < len(lines):
                out.append(f"{self.shown(f)}, line {lines[rec]}{suffix}")
            else:  # parquet, or a text file that changed since it was read
                out.append(f"{self.shown(f)}, row {rec + 1}{suffix}")
        return out


def read_source(d: DataParams, root: Path, spill: Path | None = None) -> RawTable:
    """The raw table named by `d.source`: builtin:<name>, or a file, glob or directory relative to `root`.

    `spill`: a folder for a table too big for data.memory_budget_mb (csv, tsv, jsonl, parquet), which is then read into
    files there and returned as a `SpilledFrame` read a column at a time (the choice is printed)."""
    if d.source.startswith("builtin:"):
        return _read_builtin(d.source)
    folder = _image_folder(d.source, root)
    if folder is not None:
        return read_image_folder(folder, d, root, spill)
    files = resolve_files(d.source, root)
    fmt = _format(files, d, root)
    delimiter = d.delimiter or ("\t" if fmt == "tsv" else ",")
    if fmt not in ("csv", "tsv") and (
        d.header_rows != 1 or (fmt == "parquet" and (not d.header or d.columns is not None))
    ):
        raise DataError(
            f"data.header/data.columns/data.header_rows apply to csv and tsv files, but {_shown(files[0], root)} is "
            f"{fmt}; remove them (its column names come from the file)"
        )
    if fmt in TEXT_FORMATS:
        try:
            codecs.lookup(d.encoding)
        except LookupError:
            raise DataError(
                f"data.encoding: unknown encoding {d.encoding!r}; use a Python codec name such as utf-8, latin-1 "
                "or cp1252"
            ) from None
        for path in files:
            _check_text(path, _shown(path, root), d.encoding)
    notes: list[str] = []
    if spill is not None:
        streamed, why = _stream_choice(files, fmt, d)
        print(f"ingest: {why}", file=sys.stderr)  # now: a streamed read takes a while
        if streamed:
            return _spill_source(d, root, files, fmt, delimiter, spill, notes)
    tables: list[pa.Table] = []
    for path in files:
        shown = _shown(path, root)
        if fmt in ("csv", "tsv"):
            table, index = _read_csv(path, shown, fmt, delimiter, d)
            if index:
                notes.append(
                    f"{shown}: dropped its first column: it has no header and holds a different integer in every "
                    "row, the index pandas' to_csv writes by default (row labels, not data)"
                )
        elif fmt == "jsonl":
            table = _read_jsonl(path, shown, d.encoding)
        else:
            table = _read_parquet(path, shown)
        if table.num_rows == 0:
            what = "a header line but no rows" if fmt in ("csv", "tsv") and d.header else "no rows"
            raise DataError(f"data.source: {shown} has {what}; fill it, or remove it from data.source")
        tables.append(table)
    counts = [t.num_rows for t in tables]
    table = _concat(tables, files, root)
    tables.clear()  # only `table` holds the buffers now, so to_pandas(self_destruct) can free them as it goes
    if d.image_column is not None and spill is not None:
        raw = _raw_table(None, d, files, counts, fmt, root, delimiter, notes)  # rows' places, for messages
        spilled = _spill_table_images(table, raw, d, spill)
        if spilled is not None:
            return spilled
    pa.default_memory_pool().release_unused()  # the csv reader's scratch memory: give it back before converting
    frame = _to_pandas(table)
    del table
    pa.default_memory_pool().release_unused()  # the Arrow buffers to_pandas freed: for numpy/pandas to reuse
    raw = _raw_table(frame, d, files, counts, fmt, root, delimiter, notes)
    if d.image_column is not None:
        read_images(raw, d.image_column)
    return raw


def _raw_table(
    frame: Any, d: DataParams, files: list[Path], counts: list[int], fmt: str, root: Path, delimiter: str,
    notes: list[str],
) -> RawTable:  # fmt: skip
    return RawTable(
        frame, d.source, files, list(counts), fmt, root, delimiter, d.encoding, d.header, notes=notes,
        header_rows=d.header_rows,
    )  # fmt: skip


def _stream_choice(files: list[Path], fmt: str, d: DataParams) -> tuple[bool, str]:
    """Whether ingest reads the source in chunks: when about MEMORY_PER_BYTE times its size (Parquet: its data
    uncompressed) is over data.memory_budget_mb."""
    from trainflow.data.stream import budget_mb

    if fmt == "parquet":
        size = 0
        for path in files:
            with contextlib.suppress(pa.ArrowException, OSError, ValueError):  # an unreadable one is reported later
                meta = pq.ParquetFile(path).metadata
                size += sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    else:
        size = sum(p.stat().st_size for p in files)
    need, budget = MEMORY_PER_BYTE * size / 2**20, budget_mb(d)
    count = f"{len(files)} file{'s' if len(files) != 1 else ''}"
    what = f"{count} of {size / 2**20:,.1f} MiB, about {need:,.0f} MiB in memory"
    if need <= budget:
        return False, f"read into memory ({what}; data.memory_budget_mb {budget:,.0f})"
    held = f"read into memory although over data.memory_budget_mb {budget:,.0f} ({what})"
    if d.image_column is not None:
        return False, f"{held}: a table of images (data.image_column) is read whole, then its images spilled"
    if fmt in TEXT_FORMATS and not _own_bytes(d.encoding, "\n"):
        return False, f"{held}: {fmt} in {d.encoding} is not streamed (its line breaks are not the byte \\n)"
    delimiter = d.delimiter or ("\t" if fmt == "tsv" else ",")
    if fmt in ("csv", "tsv") and not _own_bytes(d.encoding, delimiter + ('"' if _quoted(fmt, d) else "")):
        return False, (
            f"{held}: {fmt} in {d.encoding} is not streamed (other characters hold the byte of its delimiter "
            f"{delimiter!r}{' or quote' if _quoted(fmt, d) else ''})"
        )
    return True, f"read a column at a time from a spill on disk ({what}, over data.memory_budget_mb {budget:,.0f})"


def _spill_source(
    d: DataParams, root: Path, files: list[Path], fmt: str, delimiter: str, folder: Path, notes: list[str]
) -> RawTable:
    folder.mkdir(parents=True, exist_ok=True)
    spilled: list[_SpilledFile] = []
    for f, path in enumerate(files):
        shown = _shown(path, root)
        if fmt == "parquet":
            one = _parquet_parts(path, shown)
        elif fmt == "jsonl":
            one = _spill_jsonl(path, shown, d.encoding, folder, f, notes)
        else:
            one = _spill_csv(path, shown, fmt, delimiter, d, folder, f)
            if one.index:
                notes.append(
                    f"{shown}: dropped its first column: it has no header and holds a different integer in every "
                    "row, the index pandas' to_csv writes by default (row labels, not data)"
                )
        if one.rows == 0:
            what = "a header line but no rows" if fmt in ("csv", "tsv") and d.header else "no rows"
            raise DataError(f"data.source: {shown} has {what}; fill it, or remove it from data.source")
        if spilled and one.columns != spilled[0].columns:
            _check_same_columns(spilled[0].columns, one.columns, files, f, root)
        spilled.append(one)
    names = spilled[0].columns
    types = {n: _common_type(n, [one.types[n] for one in spilled]) for n in names}
    replaced = {(f, n): p for f, one in enumerate(spilled) for n, p in one.replaced.items()}
    shown_files = [_shown(p, root) for p in files]
    rows = sum(one.rows for one in spilled)
    frame = SpilledFrame(folder, [one.parts for one in spilled], names, types, replaced, rows, shown_files)
    table = _raw_table(frame, d, files, [one.rows for one in spilled], fmt, root, delimiter, notes)
    table.digests = {path: one.sha256 for path, one in zip(files, spilled, strict=True) if one.sha256 is not None}
    return table


# --- a text file that is not text --------------------------------------------------------------------------------

TEXT_PROBE = 8 << 10  # bytes at a text file's start decoded to tell it from a binary file named .csv
CONTROLS_SEEN = 8  # control characters in those bytes below which a file is taken for text, whatever its length
# (magic bytes, what a file starting with them is, what to do) for binary files that users name .csv
_BINARY_KINDS = (
    (b"PAR1", "a Parquet file", "set -S data.format=parquet (or rename it .parquet, and data.source with it)"),
    (b"PK\x03\x04", "a zip archive (an .xlsx workbook is one)", "export the sheet as CSV and point data.source at it"),
    (b"\xd0\xcf\x11\xe0", "an .xls workbook", "export the sheet as CSV and point data.source at it"),
    (b"\x1f\x8b", "gzip-compressed", "decompress it (gunzip) and point data.source at the result"),
)
# byte order marks, longest first (utf-32-le's starts with utf-16-le's)
_UTF_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF16_LE, "utf-16"),
             (codecs.BOM_UTF16_BE, "utf-16"))  # fmt: skip


def _check_text(path: Path, shown: str, encoding: str) -> None:
    """A DataError for a csv/tsv/jsonl file that is not text in `encoding` (`_mostly_controls`: the NUL bytes of most
    binary files, and of UTF-16 text read as a one-byte encoding, are control characters), naming what the file
    looks like (by its first bytes) and what to do, where that is known. Costs a read of TEXT_PROBE bytes per file;
    a stray control character in a text file is left to the reader, as before."""
    try:
        with path.open("rb") as f:
            head = f.read(TEXT_PROBE)
    except OSError:
        return  # the reader says why it cannot read it
    if not _mostly_controls(head, encoding):
        return
    what, fix = next(
        ((what, fix) for magic, what, fix in _BINARY_KINDS if head.startswith(magic)),
        ("a binary file", "point data.source at a csv, tsv, jsonl or parquet file"),
    )
    guess = _utf_guess(head)
    if guess is not None and guess != codecs.lookup(encoding).name:
        what, fix = f"text in {guess}", f"set data.encoding: -S data.encoding={guess}"
    nul = head.find(b"\x00")
    at = f" (a NUL byte at byte {nul})" if nul >= 0 else ""
    raise DataError(f"data.source: {shown} is not text in {encoding}{at}: it looks like {what}; {fix}")


def _mostly_controls(head: bytes, encoding: str) -> bool:
    """Whether at least CONTROLS_SEEN, and more than 1 in 100, of the characters of `head` (a file's first bytes)
    are control characters other than tab, line breaks, form feeds and the DOS end-of-file mark. A text file may
    hold a stray one; a binary file holds them throughout."""
    text = head.decode(encoding, errors="replace")
    controls = sum(text.count(chr(c)) for c in range(32) if chr(c) not in "\t\n\r\f\v\x1a")
    return controls >= CONTROLS_SEEN and controls * 100 > len(text)


def _utf_guess(head: bytes) -> str | None:
    """The UTF-16/32 encoding a file's first bytes are text in, by its byte order mark, or by text of mostly
    ASCII characters whose every other byte is 0 (UTF-16 without one); None if neither."""
    for bom, name in _UTF_BOMS:
        if head.startswith(bom):
            return name
    even, odd = head[0:2000:2], head[1:2000:2]
    if len(head) >= 4 and even.count(0) * 10 >= len(even) * 9 and odd.count(0) * 10 < len(odd):
        return "utf-16-be"
    if len(head) >= 4 and odd.count(0) * 10 >= len(odd) * 9 and even.count(0) * 10 < len(even):
        return "utf-16-le"
    return None


# --- where the data is ------------------------------------------------------------------------------------------


def _shown(path: Path, root: Path | None) -> str:
    if root is not None:
        try:
            return path.relative_to(root).as_posix()
        except ValueError:
            pass
    return str(path)


def resolve_files(source: str, root: Path) -> list[Path]:
    """The files `source` names, in order: a file, the sorted matches of a glob, or a directory's visible files.
    DVC's `.dvc` files (what `dvc add data/raw/<folder>/<file>` leaves beside a file) are metadata, never data."""
    path = Path(source).expanduser()
    full = path if path.is_absolute() else root / path
    if full.is_file():
        return [full]
    if full.is_dir():
        files = sorted(p for p in full.iterdir() if p.is_file() and not p.name.startswith(".") and not _dvc_file(p))
        if not files:
            raise DataError(f"data.source: directory {source} holds no files; put the data there or fix data.source")
        return files
    if GLOB_CHARS.search(source):
        matches = glob.glob(str(full), recursive=True)
        files = sorted(Path(p) for p in matches if Path(p).is_file() and not _dvc_file(Path(p)))
        if not files:
            raise DataError(f"data.source: no file matches {source} (under {root}); put the data there or fix it")
        return files
    if full.exists():
        raise DataError(f"data.source: {source} is not a regular file or directory")
    raise DataError(f"data.source: {source} does not exist (looked for {full}); put the data there or fix data.source")


def _dvc_file(path: Path) -> bool:
    return path.suffix == ".dvc"


def _format(files: list[Path], d: DataParams, root: Path) -> str:
    if d.format != "auto":
        return d.format
    groups: dict[str, list[str]] = {}
    for path in files:
        fmt = FORMAT_BY_SUFFIX.get(path.suffix.lower())
        key = fmt or f"unknown extension {path.suffix or '(none)'}"
        groups.setdefault(key, []).append(_shown(path, root))
    if len(groups) == 1:
        fmt = FORMAT_BY_SUFFIX.get(files[0].suffix.lower())
        if fmt is None:
            _unknown_extension(files[0], root)
        return fmt
    listing = "; ".join(
        f"{k}: {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}" for k, names in groups.items()
    )
    raise DataError(
        f"data.source: {d.source} holds files of {len(groups)} formats ({listing}); keep one format there or "
        "select one with a glob such as data/raw/*.csv"
    )


def _unknown_extension(path: Path, root: Path) -> NoReturn:
    raise DataError(
        f"data.source: cannot tell the format of {_shown(path, root)} from its extension "
        f"{path.suffix or '(none)'!r} (data.format: auto); set data.format to csv, tsv, parquet or jsonl, or "
        "rename the file (.csv, .tsv, .parquet, .jsonl)"
    )


# --- readers ----------------------------------------------------------------------------------------------------


def _read_builtin(source: str) -> RawTable:
    from sklearn import datasets

    name = source.removeprefix("builtin:")
    if name not in BUILTIN_DATASETS:
        raise DataError(
            f"data.source: unknown built-in dataset {name!r}; choose one of "
            f"builtin:{', builtin:'.join(BUILTIN_DATASETS)}"
        )
    if name == "digits_images":
        return _digits_images(source)
    # load_* read files inside scikit-learn's package: nothing is downloaded.
    frame: pd.DataFrame = getattr(datasets, f"load_{name}")(as_frame=True).frame
    frame = frame.reset_index(drop=True)
    frame.columns = [str(c) for c in frame.columns]
    n = len(frame)
    return RawTable(frame, source, [], [n], "builtin")


@dataclass
class _CsvOptions:
    """How a csv/tsv file is parsed (the same for a whole file and for each chunk of a streamed one)."""

    read: pv.ReadOptions
    parse: pv.ParseOptions
    convert: pv.ConvertOptions
    quoted: bool
    start: int = 0  # the byte where the records start: after a header of data.header_rows lines, read here


def _csv_options(path: Path, fmt: str, delimiter: str, d: DataParams, shown: str | None = None) -> _CsvOptions:
    """`shown`: the file as messages name it (default: its path)."""
    names = list(d.columns) if d.columns is not None else None
    if names is not None:
        _check_unique(names, "data.columns names")  # "data.columns names 'a' more than once"
    quoted = _quoted(fmt, d)
    parse_options = pv.ParseOptions(
        delimiter=delimiter, quote_char='"' if quoted else False, newlines_in_values=quoted, ignore_empty_lines=True
    )
    start = 0
    if d.header and d.header_rows > 1:  # the names, joined: the records are read without a header after them
        names, start = _joined_header(path, shown or str(path), fmt, delimiter, d, parse_options)
    read_options = pv.ReadOptions(
        use_threads=True,
        block_size=BLOCK_SIZE,
        encoding=d.encoding,
        column_names=names,
        autogenerate_column_names=not d.header and names is None,
    )
    if not quoted:
        _UNQUOTED.add(path)  # the csv-module scans that locate lines for error messages must agree
    convert_options = pv.ConvertOptions(
        null_values=NA_VALUES, strings_can_be_null=True, quoted_strings_can_be_null=True
    )
    return _CsvOptions(read_options, parse_options, convert_options, quoted, start)


HEADER_JOIN = "."  # between the cells of a column's header lines, in its name (data.header_rows)
HEADER_PROBE = 1 << 20  # bytes first read for a header of several lines (more when its lines are longer)


def _joined_header(
    path: Path, shown: str, fmt: str, delimiter: str, d: DataParams, parse: pv.ParseOptions
) -> tuple[list[str], int]:
    """The column names of a header of d.header_rows lines (each column's non-empty cells joined by HEADER_JOIN) and
    the byte where the records after it start. The lines are found as pyarrow's parser finds records (a quoted cell
    may hold a line break; blank lines are skipped) and parsed by pyarrow, every cell as text."""
    if not _own_bytes(d.encoding, "\n" + delimiter + ('"' if parse.quote_char else "")):
        raise DataError(
            f"data.header_rows: a header of several lines is found as bytes, and {shown} is in {d.encoding}, where "
            f"they are not; convert it to UTF-8 (iconv -f {d.encoding} -t utf-8 < old > new) and set data.encoding: "
            "utf-8, or join the header's lines into one"
        )
    rows, end, head = _header_lines(path, d.header_rows, parse, _skips_bom(d.encoding))
    if not rows:
        raise DataError(f"data.source: {shown} is empty: no rows")
    strings: dict[str, pa.DataType] = {}
    for _ in range(2):  # once to count the columns, once with every one of them read as text
        try:
            table = pv.read_csv(
                pa.BufferReader(head[:end]),
                read_options=pv.ReadOptions(encoding=d.encoding, autogenerate_column_names=True),
                parse_options=parse,
                convert_options=pv.ConvertOptions(column_types=strings, strings_can_be_null=False),
            )
        except (pa.ArrowException, ValueError) as exc:
            raise _csv_error(path, shown, fmt, delimiter, d, exc) from None
        strings = dict.fromkeys(table.column_names, pa.string())
    cells = [[str(v) for v in column.to_pylist()] for column in table.columns]
    return [HEADER_JOIN.join(c for c in column if c) for column in cells], end


def _header_lines(path: Path, count: int, parse: pv.ParseOptions, bom: bool) -> tuple[int, int, bytes]:
    """(records found, up to `count`; the byte after the last of them; the bytes read) for the first `count` records
    of the file that are not blank lines, ended where pyarrow's parser ends them (`_outside_quotes`)."""
    size = HEADER_PROBE
    while True:
        with path.open("rb") as f:
            head = f.read(size)
        first = len(UTF8_BOM) if bom and head.startswith(UTF8_BOM) else 0
        found, start = 0, first
        for match in re.finditer(rb"\r\n?|\n", head):
            if match.start() < first or not _outside_quotes(head, match.start(), parse, first):
                continue
            found += head[start : match.start()] != b""  # a blank line is no record
            start = match.end()
            if found == count:
                return found, start, head
        if len(head) < size:  # the whole file: the header is all of it
            return found + (head[start:] != b""), len(head), head
        size *= 4


def _quoted(fmt: str, d: DataParams) -> bool:
    """Whether a quote character guards values (delimiters and line breaks inside them)."""
    return d.quoting == "double" or (d.quoting == "auto" and fmt == "csv")


def _parse_csv(
    source: Any, options: _CsvOptions, path: Path, shown: str, fmt: str, delimiter: str, d: DataParams
) -> pa.Table:
    """pyarrow's read of `source` (the file, or a chunk of it), with its problems as DataErrors naming the file."""
    try:
        table = pv.read_csv(
            source, read_options=options.read, parse_options=options.parse, convert_options=options.convert
        )
        table.schema.names  # noqa: B018 -- a header that is not UTF-8 fails here, when names are decoded
    except (pa.ArrowException, ValueError) as exc:  # ArrowInvalid (a ValueError), UnicodeDecodeError
        raise _csv_error(path, shown, fmt, delimiter, d, exc) from None
    except OSError as exc:
        raise DataError(f"data.source: cannot read {shown}: {exc}") from None
    if any(pa.types.is_binary(t) or pa.types.is_large_binary(t) for t in table.schema.types):
        # pyarrow reads values that are not valid UTF-8 as bytes instead of failing: the file is in another encoding.
        raise _decode_error(path, shown, delimiter, d) or DataError(
            f"data.source: {shown} has values that are not valid {d.encoding}; set data.encoding to the file's encoding"
        )
    return table


def _read_csv(path: Path, shown: str, fmt: str, delimiter: str, d: DataParams) -> tuple[pa.Table, bool]:
    """The file's table, and whether its first column was a pandas index (dropped)."""
    options = _csv_options(path, fmt, delimiter, d, shown)
    if options.start:  # after a header of several lines: the records alone, named by it
        with pa.OSFile(str(path)) as records:
            records.seek(options.start)
            table = _parse_csv(records, options, path, shown, fmt, delimiter, d)
    else:
        table = _parse_csv(path, options, path, shown, fmt, delimiter, d)
    names = list(d.columns) if d.columns is not None else None
    index = False
    if not d.header and names is None:
        table = table.rename_columns([f"column_{i + 1}" for i in range(table.num_columns)])
    elif d.header:
        index = _pandas_index(table)
        fixed = [n if n != "" else f"column_{i + 1}" for i, n in enumerate(table.column_names)]
        if fixed != table.column_names:
            table = table.rename_columns(fixed)
        if index:  # after naming the others, so that they keep the names of their positions in the file
            table, fixed = table.remove_column(0), fixed[1:]
        _check_header_unique(fixed, path, shown, delimiter, d)
    _check_closed_quotes(table, path, shown, delimiter, d)
    return table, index


def _pandas_index(table: pa.Table) -> bool:
    """Whether the first column is the index pandas' `to_csv` writes by default (Parquet keeps it in metadata, see
    `_read_parquet`): an empty header over a different integer in every row (0..n-1, in any order after a shuffle, or
    fewer after a filter). Such row labels would become a feature, and one that follows the row order."""
    if table.num_columns < 2 or table.column_names[0] != "":
        return False
    return _all_distinct_integers(table.column(0))


def _all_distinct_integers(column: pa.ChunkedArray) -> bool:
    return (
        pa.types.is_integer(column.type) and column.null_count == 0 and pc.count_distinct(column).as_py() == len(column)
    )


# --- a file bigger than the data memory budget: read in chunks into a spill (see trainflow.data.spill) ----------

CHUNK_BYTES = 64 << 20  # a streamed csv/tsv file is parsed this many bytes (whole records) at a time
MEMORY_PER_BYTE = 3  # a table in memory takes about this many times its csv bytes at the peak of ingest


def _record_chunks(
    path: Path, parse: pv.ParseOptions | None, chunk_bytes: int, digest: Any = None, start: int = 0, bom: bool = False
) -> Iterator[tuple[int, memoryview]]:
    """(offset, bytes): the file from byte `start` (a record's start) in order, read once, in pieces of about
    `chunk_bytes` that each end with a record: after a line break that pyarrow's csv parser, with options `parse`,
    reads as a record's end (`_record_end`); None: after any line break (jsonl). A record longer than a piece makes the
    piece longer. `bom`: the file starts with a UTF-8 byte order mark, which the parser skips. `digest` (a hashlib
    object) is updated with the whole file's bytes, here: run in a thread (`spill.ahead`), the reading, the search for
    a record's end and the hash are done while the caller parses the piece before.

    Each read starts at the previous piece's end (the partial record after it is read again, not copied onto the
    next read: concatenating the pieces copied the whole file once more; benchmarks/out-of-core.md)."""
    with path.open("rb") as f:
        if start and digest is not None:  # a header before the records (data.header_rows): hashed, not yielded
            digest.update(f.read(start))
        while True:
            f.seek(start)
            data = f.read(chunk_bytes)
            end = len(data) - 1
            if len(data) == chunk_bytes:  # more may follow: end after the last whole record
                first = len(UTF8_BOM) if bom and start == 0 and data.startswith(UTF8_BOM) else 0
                end = _record_end(data, data.rfind(b"\n"), parse, first)
                if end < 0:  # no record ends in it: read on
                    chunk_bytes *= 2
                    continue
            if end < 0:  # the file's end
                return
            piece = memoryview(data)[: end + 1]
            if digest is not None:
                digest.update(piece)
            yield start, piece
            start += end + 1


UTF8_BOM = codecs.BOM_UTF8  # pyarrow's csv reader skips it at a UTF-8 file's start
_WINDOW = 1 << 16  # bytes before a line break searched first for the quotes that decide whether it ends a record


def _record_end(data: bytes, end: int, parse: pv.ParseOptions | None, first: int = 0) -> int:
    """The last line break at or before `end` (the index of a b"\\n" in `data`, or -1) that ends a record as pyarrow's
    csv parser reads `data` from a record's start (`first`: where its first field starts, after a byte order mark);
    -1 if none does. `parse`: the parser's options (None: every line break ends one, as in jsonl).

    A line break ends a record unless it is inside a quoted value, and a quote opens a value only at the start of a
    field (right after the delimiter, a line break or the record's start): elsewhere it is a character, as in
    `12" pipe`. So counting the quotes before a line break is not enough; the parser's state there is found from the
    runs of quotes before it (`_opening_quote`), a window of bytes at a time, scanned with numpy."""
    while end >= 0 and parse is not None and (opened := _opening(data, end, parse, first)) >= 0:
        end = data.rfind(b"\n", 0, opened)  # the value opened at `opened`: its record starts before it
    return end


def _outside_quotes(data: bytes, at: int, parse: pv.ParseOptions, first: int = 0) -> bool:
    """Whether pyarrow's csv parser, reading `data` from a record's start (`first`), is outside quoted values at byte
    `at`: a line break there ends a record."""
    return _opening(data, at, parse, first) < 0


def _opening(data: bytes, at: int, parse: pv.ParseOptions, first: int) -> int:
    """`_opening_quote` under the parser's options: -1 where no quoted value can hold a line break."""
    if not parse.newlines_in_values or parse.quote_char is False:
        return -1
    # trainflow never sets an escape character (`_csv_options`); one would change what a quote after it means
    assert parse.escape_char is False, "record ends with an escape character are not modelled"
    return _opening_quote(data, at, first, ord(parse.quote_char), ord(parse.delimiter), parse.double_quote)


def _opening_quote(data: bytes, end: int, first: int, quote: int, delimiter: int, double_quote: bool) -> int:
    """Where the quoted value that holds data[end] opened, or -1 where data[end] is outside quoted values (data[first:]
    read from a record's start).

    The parser's state changes only at runs of quote characters. With double_quote (`""` is a quote inside a quoted
    value), a run of odd length at a field's start opens a value if outside one and closes it if inside; a run of odd
    length elsewhere closes a value or, outside one, is text: outside either way; a run of even length changes nothing
    (an empty value `""`, escaped quotes). Without double_quote a single quote at a field's start toggles, and any
    other run leaves the parser outside. So the state at `end` is set by the last run before it that leaves the parser
    outside, and the runs that toggle after it: the bytes before `end` are searched back a window at a time until one
    such run is found, or the record's start."""
    width = _WINDOW
    a = np.frombuffer(data, np.uint8, count=end)
    while True:
        lo = max(first, end - width)
        quotes = np.flatnonzero(a[lo:end] == quote) + lo
        if len(quotes) or lo == first:
            heads = np.flatnonzero(np.diff(quotes, prepend=-2) != 1)  # each run's first quote, by index into quotes
            starts = quotes[heads]
            lengths = np.diff(heads, append=len(quotes))
            before = a[np.maximum(starts - 1, 0)]
            field_start = (starts == first) | (before == delimiter) | (before == 10) | (before == 13)
            toggles = field_start & ((lengths % 2 == 1) if double_quote else (lengths == 1))
            outside = (lengths % 2 == 1) & ~field_start if double_quote else ~toggles
            whole = starts > lo if lo > first else np.ones(len(starts), bool)  # a run cut by the window is unknown
            resets = np.flatnonzero(outside & whole)
            if len(resets) or lo == first:
                after = resets[-1] + 1 if len(resets) else 0
                opened = np.flatnonzero(toggles[after:] & whole[after:])
                return int(starts[after + opened[-1]]) if len(opened) % 2 else -1
        width *= 4


def _read_range(path: Path, start: int, end: int) -> pa.BufferReader:
    with path.open("rb") as f:
        f.seek(start)
        return pa.BufferReader(f.read(end - start))


@dataclass
class _SpilledFile:
    parts: list[Path]
    columns: list[str]  # as the frame names them (an index column left out)
    types: dict[str, pa.DataType]
    replaced: dict[str, Path]  # column -> a file of it typed over the whole file (its chunks disagreed)
    rows: int
    index: bool = False
    sha256: str | None = None  # of the file's bytes, where they were all read in order


def _spill_csv(path: Path, shown: str, fmt: str, delimiter: str, d: DataParams, folder: Path, f: int) -> _SpilledFile:
    """The file parsed CHUNK_BYTES at a time into Parquet files of its rows, typed as one pyarrow read of the whole
    file types them: where the chunks' inferred types disagree, that column is typed again over the whole file."""
    options = _csv_options(path, fmt, delimiter, d, shown)
    ranges: list[tuple[int, int]] = []
    parts: list[Path] = []
    types: list[dict[str, pa.DataType]] = []
    rows, raw = 0, list[str]()
    fixed: list[str] = []
    table = pa.table({})
    bar = progress(max(1, path.stat().st_size >> 20), desc=f"ingest: {shown}", unit="MiB")
    digest = hashlib.sha256()  # sources.json's hash of the file, from this read: no second one
    pieces = _record_chunks(path, options.parse, CHUNK_BYTES, digest, options.start, _skips_bom(d.encoding))
    with contextlib.closing(ahead(pieces)) as chunks:
        for k, (start, data) in enumerate(chunks):
            ranges.append((start, start + len(data)))
            bar.update(((start + len(data)) >> 20) - bar.n)
            opts = options
            if k:  # later chunks have no header: the first chunk's names
                opts = dataclasses.replace(options, read=_later_chunk(options.read, raw))
            table = _parse_csv(pa.BufferReader(pa.py_buffer(data)), opts, path, shown, fmt, delimiter, d)
            del data
            if k == 0:
                raw = table.column_names
                fixed = _fixed_names(raw, d, path, shown, delimiter)
            table = table.rename_columns(fixed)
            parts.append(folder / f"{f}-{k}.arrow")
            feather.write_feather(table, parts[-1], compression="lz4")
            failpoint("spill-chunk")
            pa.default_memory_pool().release_unused()  # the chunk's parse: Arrow's allocator keeps it until asked
            types.append(dict(zip(fixed, table.schema.types)))
            rows += table.num_rows
    bar.close()
    _check_closed_quotes(table, path, shown, delimiter, d, rows - table.num_rows)
    out = _SpilledFile(parts, list(fixed), {}, {}, rows)
    for j, name in enumerate(fixed):
        seen = {t[name] for t in types} - {pa.null()}  # null chunks (all values missing) take any type exactly
        if len(seen) > 1:
            out.replaced[name] = folder / f"{f}-column-{j}.arrow"
            whole = _typed_whole(path, ranges, options, raw, j, name)
            feather.write_feather(whole, out.replaced[name], compression="lz4")
            seen = {whole.schema.field(0).type}
        out.types[name] = seen.pop() if seen else pa.null()
    if d.header and len(fixed) > 1 and raw[0] == "":
        where = [out.replaced[fixed[0]]] if fixed[0] in out.replaced else parts
        first = pa.chunked_array(
            [c for p in where for c in read_column(p, fixed[0]).cast(out.types[fixed[0]]).chunks],
            type=out.types[fixed[0]],
        )
        out.index = _all_distinct_integers(first)
        if out.index:
            out.columns.remove(fixed[0])
    if not out.index and fixed and fixed[0] == UNNAMED_FIRST:  # data, named as `_read_csv` names it
        _check_header_unique(["column_1", *fixed[1:]], path, shown, delimiter, d)
    out.sha256 = digest.hexdigest()
    return out


def _later_chunk(read: pv.ReadOptions, names: list[str]) -> pv.ReadOptions:
    return pv.ReadOptions(
        use_threads=read.use_threads, block_size=read.block_size, encoding=read.encoding, column_names=names
    )


UNNAMED_FIRST = "\x00unnamed first column"  # while an unnamed first column's name, column_1, is another's


def _fixed_names(raw: list[str], d: DataParams, path: Path, shown: str, delimiter: str) -> list[str]:
    """The names a streamed file's columns get, as `_read_csv` names them (its index column still among them)."""
    if not d.header and d.columns is None:
        return [f"column_{i + 1}" for i in range(len(raw))]
    if not d.header:
        return list(raw)
    fixed = [n if n != "" else f"column_{i + 1}" for i, n in enumerate(raw)]
    # An unnamed first column may be an index (known once the file is read; then its name is not checked).
    maybe_index = bool(raw) and raw[0] == "" and len(raw) > 1
    named = fixed[1:] if maybe_index else fixed
    _check_header_unique(named, path, shown, delimiter, d)
    if maybe_index and fixed[0] in named:  # its name is taken: columns are read by name until the index is known
        fixed[0] = UNNAMED_FIRST
    return fixed


def _typed_whole(
    path: Path, ranges: list[tuple[int, int]], options: _CsvOptions, raw: list[str], j: int, name: str
) -> pa.Table:
    """Column j of the file typed as pyarrow types it over the whole file: its text, read from every chunk, parsed
    again as one csv column by pyarrow's own inference (values quoted, beside a constant column so that no line is
    empty, with the same null spellings)."""
    text: list[pa.Array] = []
    for k, (start, end) in enumerate(ranges):
        read = options.read if k == 0 else _later_chunk(options.read, raw)
        convert = pv.ConvertOptions(
            null_values=NA_VALUES,
            strings_can_be_null=True,
            quoted_strings_can_be_null=True,
            column_types={raw[j]: pa.string()},
            include_columns=[raw[j]] if raw[j] else None,
        )
        chunk = pv.read_csv(_read_range(path, start, end), read_options=read, parse_options=options.parse,
                            convert_options=convert)  # fmt: skip
        text.extend(chunk.column(j if not raw[j] else 0).chunks)
    values = pa.chunked_array(text, type=pa.string())
    sink = io.BytesIO()
    pv.write_csv(pa.table({"k": pa.array(np.zeros(len(values), dtype=np.int8)), "v": values}), sink)
    again = pv.read_csv(
        pa.BufferReader(sink.getvalue()),
        parse_options=pv.ParseOptions(newlines_in_values=True),
        convert_options=pv.ConvertOptions(null_values=NA_VALUES, strings_can_be_null=True,
                                          quoted_strings_can_be_null=True, include_columns=["v"]),
    )  # fmt: skip
    return pa.table({name: again.column(0)})


def _check_closed_quotes(
    table: pa.Table, path: Path, shown: str, delimiter: str, d: DataParams, first_record: int = 0
) -> None:
    """pyarrow accepts a quote left open at the end of a file: its value swallows every line after it. Such a value
    can only be the last one of the file and holds a line break, while the file does not end with a closing quote.
    `table`: the file's last rows, the first of them its record number `first_record`."""
    if table.num_rows == 0 or table.num_columns == 0:
        return
    last = table.column(table.num_columns - 1)
    if not (pa.types.is_string(last.type) or pa.types.is_large_string(last.type)):
        return
    value = last[table.num_rows - 1].as_py()
    if value is None or ("\n" not in value and "\r" not in value):
        return
    with path.open("rb") as f:  # the file's last byte that is not blank: it may end in any number of blank lines
        end, tail = f.seek(0, 2), b""
        while end > 0 and not tail:
            start = max(end - 4096, 0)
            f.seek(start)
            tail = f.read(end - start).rstrip(b"\r\n\x00 \t")
            end = start
    if tail.endswith(b'"'):
        return
    record = first_record + table.num_rows - 1
    line = _csv_record_lines(path, delimiter, d.encoding, d.header_rows if d.header else 0, {record}).get(record)
    at = f", line {line}" if line is not None else ""
    raise DataError(
        f"data.source: {shown}{at}: a quoted value is never closed and runs to the end of the file; add the "
        'missing closing quote (")'
    )


def _repeated(names: list[str]) -> list[str]:
    seen: set[str] = set()
    twice: list[str] = []
    for n in names:
        if n in seen and n not in twice:
            twice.append(n)
        seen.add(n)
    return twice


def _check_unique(names: list[str], what: str, hint: str = "") -> None:
    twice = _repeated(names)
    if twice:
        raise DataError(f"{what} {', '.join(repr(n) for n in twice)} more than once; column names must be unique{hint}")


# What the error naming a header's repeated names adds while data.header_rows is 1
HEADER_ROWS_HINT = (
    "; if the header spans several lines (names over names, as a spreadsheet exports them), set data.header_rows to "
    "their count: each column is then named by its cells on them joined by '.'"
)


def _check_header_unique(names: list[str], path: Path, shown: str, delimiter: str, d: DataParams) -> None:
    """The header's names, each once: else a DataError naming its (first) line, and data.header_rows where it is 1."""
    if _repeated(names):
        line = _header_line(path, delimiter, d.encoding, d.header_rows)
        hint = HEADER_ROWS_HINT if d.header_rows == 1 else ""
        _check_unique(names, f"data.source: {shown}, line {line}: the header names", hint)


def _read_jsonl(path: Path, shown: str, encoding: str) -> pa.Table:
    utf8 = codecs.lookup(encoding).name == "utf-8"
    source: Any = path
    if not utf8:  # pyarrow.json reads UTF-8 only: transcode in memory
        try:
            source = pa.BufferReader(path.read_bytes().decode(encoding).encode("utf-8"))
        except UnicodeDecodeError:
            raise _undecodable(path, shown, encoding) from None
    try:
        table = pj.read_json(
            source,
            read_options=pj.ReadOptions(use_threads=True, block_size=BLOCK_SIZE),
            parse_options=pj.ParseOptions(newlines_in_values=False),
        )
    except (pa.ArrowException, ValueError) as exc:
        if "Empty JSON" in str(exc):
            raise DataError(f"data.source: {shown} is empty: no rows") from None
        # Locate an invalid line; if every line is valid JSON, pyarrow failed on a column whose type changes between
        # rows: build the table from the parsed records, as strings where values of a column disagree.
        return _jsonl_fallback(path, shown, encoding)
    if utf8:
        try:  # pyarrow.json does not check that strings are UTF-8
            table.validate(full=True)
            table.schema.names  # noqa: B018 -- decoding the names checks them
        except (pa.ArrowInvalid, UnicodeDecodeError):
            raise _undecodable(path, shown, encoding) from None
    return _na_to_null(table)


def _na_to_null(table: pa.Table) -> pa.Table:
    """String columns of a JSON table: NA spellings become nulls, as in csv files."""
    na = pa.array(NA_VALUES, pa.string())
    for i, f in enumerate(table.schema):
        if pa.types.is_string(f.type) or pa.types.is_large_string(f.type):
            column = table.column(i)
            mask = pc.is_in(column, value_set=na)
            if pc.any(mask).as_py():
                table = table.set_column(i, f, pc.if_else(mask, pa.scalar(None, f.type), column))
    return table


def _jsonl_fallback(path: Path, shown: str, encoding: str) -> pa.Table:
    records: list[dict[str, Any]] = []
    try:
        with path.open(encoding=encoding) as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line.rstrip("\r\n"))  # an error at the line's end is in it, not the next
                except json.JSONDecodeError as exc:
                    raise DataError(
                        f"data.source: {shown}, line {line_no}: not valid JSON ({exc.msg} at character {exc.colno}); "
                        "each line must hold one JSON object"
                    ) from None
                if not isinstance(value, dict):
                    raise DataError(
                        f"data.source: {shown}, line {line_no}: expected one JSON object per line, found a "
                        f"{type(value).__name__}"
                    )
                records.append(value)
    except UnicodeDecodeError:
        raise _undecodable(path, shown, encoding) from None
    if not records:
        raise DataError(f"data.source: {shown} is empty: no rows")
    names: dict[str, None] = {}
    for r in records:
        names.update(dict.fromkeys(r))
    columns: dict[str, pa.Array] = {}
    for name in names:
        values = [r.get(name) for r in records]
        values = [None if isinstance(v, str) and v in _NA_SET else v for v in values]
        try:
            columns[name] = pa.array(values)
        except (pa.ArrowException, ValueError, TypeError, OverflowError):
            columns[name] = pa.array(
                [v if v is None or isinstance(v, str) else json.dumps(v) for v in values], pa.string()
            )
    return pa.table(columns)


def _skips_bom(encoding: str) -> bool:
    """Whether pyarrow's csv reader skips a UTF-8 byte order mark at the start of a file in `encoding`."""
    return codecs.lookup(encoding).name in ("utf-8", "utf-8-sig")


@functools.cache
def _own_bytes(encoding: str, chars: str) -> bool:
    """Whether each of `chars` (ASCII: the line break, and a csv's delimiter and quote) is written in `encoding` as its
    own ASCII byte, and no other character's bytes hold one of those bytes: then a file can be cut into records as
    bytes. So it is in utf-8, latin-1, cp1252 and the like; not in utf-16 or utf-32 (a line break is 2 or 4 bytes),
    utf-7 (other characters are base64 runs), nor where a double-byte character ends in one of them (shift_jis with a
    '|' delimiter). The cost: an encode of the Basic Multilingual Plane, once per encoding."""
    try:
        encoder = codecs.getincrementalencoder(encoding)()
        encoder.encode("a")  # a byte order mark, where the encoding writes one, comes before the first character
        if codecs.lookup(encoding).name == "utf-7" or any(encoder.encode(c) != c.encode("ascii") for c in chars):
            return False
    except (LookupError, UnicodeError):
        return False
    others = "".join(chr(p) for p in range(0x10000) if not 0xD800 <= p < 0xE000 and chr(p) not in chars)
    written = others.encode(encoding, errors="ignore")  # the characters it has
    return not any(c.encode("ascii") in written for c in chars)


def _spill_jsonl(path: Path, shown: str, encoding: str, folder: Path, f: int, notes: list[str]) -> _SpilledFile:
    """The file parsed CHUNK_BYTES of whole lines at a time into Arrow chunks, each as `_read_jsonl` parses the whole
    file: the same error for the same first bad line, and the types pyarrow's whole-file read gives (a column that
    is null in some chunks takes the others' type, integers and floats make floats, a chunk without a field gets
    nulls there). Where pyarrow's read of the whole file would fail and `_read_jsonl` falls back to Python's parser
    (a column whose values change type), the file is read as it reads it, whole, and a note says so."""
    utf8 = codecs.lookup(encoding).name == "utf-8"
    parts: list[Path] = []
    types: list[dict[str, pa.DataType]] = []
    counts: list[int] = []
    names: dict[str, None] = {}
    rows, line = 0, 1
    bar = progress(max(1, path.stat().st_size >> 20), desc=f"ingest: {shown}", unit="MiB")
    for k, (start, data) in enumerate(_record_chunks(path, None, CHUNK_BYTES)):
        bar.update(((start + len(data)) >> 20) - bar.n)
        lines = int(np.count_nonzero(np.frombuffer(data, np.uint8) == 10))
        try:
            raw = pa.py_buffer(data if utf8 else bytes(data).decode(encoding).encode("utf-8"))
        except UnicodeDecodeError:
            raise _undecodable(path, shown, encoding) from None
        del data
        try:
            table = pj.read_json(
                pa.BufferReader(raw),
                read_options=pj.ReadOptions(use_threads=True, block_size=BLOCK_SIZE),
                parse_options=pj.ParseOptions(newlines_in_values=False),
            )
        except (pa.ArrowException, ValueError) as exc:
            if "Empty JSON" in str(exc):  # blank lines only
                line += lines
                continue
            try:
                _check_json_lines(raw, shown, line)  # the first invalid line, numbered in the whole file
            except UnicodeDecodeError:  # pyarrow.json met a byte that is not UTF-8
                raise _undecodable(path, shown, encoding) from None
            return _whole_jsonl(path, shown, encoding, folder, f, notes, "a column's values change type")
        if utf8:
            try:
                table.validate(full=True)
                table.schema.names  # noqa: B018 -- decoding the names checks them
            except (pa.ArrowInvalid, UnicodeDecodeError):
                raise _undecodable(path, shown, encoding) from None
        table = _na_to_null(table)
        parts.append(folder / f"{f}-{k}.arrow")
        feather.write_feather(table, parts[-1], compression="lz4")
        failpoint("spill-chunk")
        pa.default_memory_pool().release_unused()  # the chunk's parse: Arrow's allocator keeps it until asked
        types.append(dict(zip(table.column_names, table.schema.types)))
        counts.append(table.num_rows)
        names.update(dict.fromkeys(table.column_names))
        rows, line = rows + table.num_rows, line + lines
    bar.close()
    if not path.stat().st_size:
        raise DataError(f"data.source: {shown} is empty: no rows")  # as pyarrow's "Empty JSON" in memory
    out = _SpilledFile(parts, list(names), {}, {}, rows)
    numbers = {pa.int64(), pa.float64()}
    for name in names:
        seen = {t[name] for t in types if name in t} - {pa.null()}
        if len(seen) > 1 and seen != numbers:  # pyarrow's whole-file read fails on it
            return _whole_jsonl(path, shown, encoding, folder, f, notes, f"column {name!r} changes type")
        out.types[name] = (pa.float64() if seen == numbers else seen.pop()) if seen else pa.null()
    for part, have, n in zip(parts, types, counts):  # a field a chunk lacks: null there, as the whole read has it
        if missing := [name for name in names if name not in have]:
            table = feather.read_table(part, memory_map=False)
            for name in missing:
                table = table.append_column(name, pa.nulls(n))
            feather.write_feather(table, part, compression="lz4")
    return out


def _check_json_lines(raw: pa.Buffer, shown: str, first: int) -> None:
    """`_jsonl_fallback`'s line checks over one chunk of a file (UTF-8), whose first line is line `first`."""
    for i, text in enumerate(raw.to_pybytes().decode("utf-8").split("\n")):
        if not text.strip():
            continue
        try:
            value = json.loads(text.rstrip("\r"))
        except json.JSONDecodeError as exc:
            raise DataError(
                f"data.source: {shown}, line {first + i}: not valid JSON ({exc.msg} at character {exc.colno}); "
                "each line must hold one JSON object"
            ) from None
        if not isinstance(value, dict):
            raise DataError(
                f"data.source: {shown}, line {first + i}: expected one JSON object per line, found a "
                f"{type(value).__name__}"
            )


def _whole_jsonl(
    path: Path, shown: str, encoding: str, folder: Path, f: int, notes: list[str], why: str
) -> _SpilledFile:
    """The file read whole by `_read_jsonl` (its fallback parser) into one spilled chunk."""
    notes.append(f"{shown}: read whole into memory although over data.memory_budget_mb: {why} (a streamed read keeps "
                 "one type per column), so Python's parser reads it as a read in memory does")  # fmt: skip
    table = _read_jsonl(path, shown, encoding)
    for stale in folder.glob(f"{f}-*.arrow"):
        stale.unlink()
    part = folder / f"{f}-0.arrow"
    feather.write_feather(table, part, compression="lz4")
    return _SpilledFile([part], table.column_names, dict(zip(table.column_names, table.schema.types)), {},
                        table.num_rows)  # fmt: skip


def _read_parquet(path: Path, shown: str) -> pa.Table:
    try:
        table = pq.read_table(path, use_threads=True)
    except (pa.ArrowException, OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"data.source: {shown} is not a readable Parquet file ({first})") from None
    if unnamed := unnamed_index(table.schema):  # a pandas index without a name: row labels, not data
        table = table.drop_columns(unnamed)
    return table.replace_schema_metadata(None)


def _parquet_parts(path: Path, shown: str) -> _SpilledFile:
    """A Parquet source file read where it is, a column at a time (as `_read_parquet` reads it whole)."""
    try:
        file = pq.ParquetFile(path)
        schema = file.schema_arrow
    except (pa.ArrowException, OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"data.source: {shown} is not a readable Parquet file ({first})") from None
    unnamed = unnamed_index(schema)
    columns = [n for n in schema.names if n not in unnamed]
    return _SpilledFile([path], columns, {n: schema.field(n).type for n in columns}, {}, file.metadata.num_rows)


def unnamed_index(schema: pa.Schema) -> list[str]:
    """The columns of a Parquet file that hold a pandas index without a name (a named index stays as a column)."""
    meta = schema.pandas_metadata or {}
    return [c for c in meta.get("index_columns", []) if isinstance(c, str) and re.fullmatch(r"__index_level_\d+__", c)]


# --- images -----------------------------------------------------------------------------------------------------


def _image_folder(source: str, root: Path) -> Path | None:
    """The directory `source` names when it is a folder of class folders (subfolders, and no table files beside
    them); None for anything else (a file, a glob, a directory of tables)."""
    if GLOB_CHARS.search(source):
        return None
    path = Path(source).expanduser()
    full = path if path.is_absolute() else root / path
    if not full.is_dir():
        return None
    children = [p for p in full.iterdir() if not p.name.startswith(".")]
    if not any(p.is_dir() for p in children):
        return None
    if any(p.is_file() and p.suffix.lower() in FORMAT_BY_SUFFIX for p in children):
        return None  # tables (their subfolders are not read)
    return full


def image_folder_files(folder: Path, root: Path) -> tuple[list[Path], list[str]]:
    """The image files of a folder of class folders, sorted by class then path, and each one's class (its class
    folder's name); DataErrors for a stray file, an empty class folder, a file that is not an image by its name."""
    stray = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    if stray:
        raise DataError(
            f"data.source: {_shown(stray[0], root)} is not inside a class folder; a folder of images holds one "
            "folder per class (<dir>/<class>/<image>): move it into one, or remove it"
        )
    files: list[Path] = []
    labels: list[str] = []
    for class_dir in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        found = sorted(
            p
            for p in class_dir.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(class_dir).parts)
        )
        if not found:
            raise DataError(f"data.source: class folder {_shown(class_dir, root)} holds no images; fill or remove it")
        for p in found:
            if p.suffix.lower() not in IMAGE_SUFFIXES:
                raise DataError(
                    f"data.source: {_shown(p, root)} is not an image by its extension ({p.suffix or '(none)'}); "
                    f"a folder of images holds {', '.join(sorted(IMAGE_SUFFIXES))} files: remove or rename it"
                )
        files += found
        labels += [class_dir.name] * len(found)
    return files, labels


def read_image_folder(folder: Path, d: DataParams, root: Path, spill: Path | None = None) -> RawTable:
    """<folder>/<class>/<file>: one row per image file, sorted by class then path; the target is the class folder's
    name. Columns: the image's bytes (data.image_column, default `image`), its path (`image_path`, relative to the
    project root), the target (data.target).

    `spill`: a folder where images that together would take more than data.memory_budget_mb are written, a chunk of
    about IMAGE_CHUNK_BYTES at a time, as they are read and checked (`_spill_images`); the choice is printed."""
    column = d.image_column or DEFAULT_IMAGE_COLUMN
    files, labels = image_folder_files(folder, root)
    if spill is not None:
        size = sum(p.stat().st_size for p in files)
        streamed, why = _image_stream_choice(len(files), size, d)
        print(f"ingest: {why}", file=sys.stderr)
        if streamed:
            frame = _spill_images(files, labels, column, d.target, root, spill, size)
            return RawTable(frame, d.source, files, [1] * len(files), "images", root, image_column=column)
    images = [_read_image_file(p, _shown(p, root)) for p in files]
    frame = pd.DataFrame(
        {
            column: _objects(images),
            column + PATH_SUFFIX: [_shown(p, root) for p in files],
            d.target: labels,
        }
    )
    return RawTable(frame, d.source, files, [1] * len(files), "images", root, image_column=column)


IMAGE_CHUNK_BYTES = 32 << 20  # a streamed folder of images is spilled, and later written, about this much at a time


def _image_stream_choice(count: int, size: int, d: DataParams) -> tuple[bool, str]:
    """Whether a folder of images is spilled as it is read: when about MEMORY_PER_BYTE times its files' bytes is over
    data.memory_budget_mb (as for a table's files)."""
    from trainflow.data.stream import budget_mb

    need, budget = MEMORY_PER_BYTE * size / 2**20, budget_mb(d)
    what = f"{count:,} image{'s' if count != 1 else ''} of {size / 2**20:,.1f} MiB, about {need:,.0f} MiB in memory"
    if need <= budget:
        return False, f"read into memory ({what}; data.memory_budget_mb {budget:,.0f})"
    return True, (
        f"read into chunks of about {IMAGE_CHUNK_BYTES >> 20} MiB on disk as they are checked ({what}, over "
        f"data.memory_budget_mb {budget:,.0f})"
    )


def _spill_images(
    files: list[Path], labels: list[str], column: str, target: str, root: Path, folder: Path, size: int
) -> SpilledFrame:
    """The images read and checked one at a time (as in memory), written to Arrow IPC chunks of `rows` rows: the
    columns the in-memory frame has, so the same typed table, row keys and split come out. `rows` is the chunks'
    row count and the spilled columns' record batch (`SpilledFrame.batch_rows`): about IMAGE_CHUNK_BYTES of images,
    so every later step over the table (row keys, the typed columns, the Parquet row groups) holds that much."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = max(1, int(IMAGE_CHUNK_BYTES * len(files) / max(size, 1)))
    path_column = column + PATH_SUFFIX
    parts: list[Path] = []
    bar = progress(len(files), desc="ingest: images", unit="image")
    for lo in range(0, len(files), rows):
        chunk = files[lo : lo + rows]
        shown = [_shown(p, root) for p in chunk]
        images = [_read_image_file(p, name) for p, name in zip(chunk, shown)]
        table = pa.table(
            {
                column: pa.array(images, pa.binary()),
                path_column: pa.array(shown, pa.string()),
                target: pa.array(labels[lo : lo + rows], pa.string()),
            }
        )
        parts.append(folder / f"images-{len(parts)}.arrow")
        feather.write_feather(table, parts[-1], compression="uncompressed")  # encoded images do not compress
        del table, images
        pa.default_memory_pool().release_unused()
        bar.update(len(chunk))
    bar.close()
    types = {column: pa.binary(), path_column: pa.string(), target: pa.string()}
    shown_files = [_shown(p, root) for p in files]
    frame = SpilledFrame(folder, [parts], list(types), types, {}, len(files), shown_files)
    frame.batch_rows = rows
    return frame


def read_images(raw: RawTable, column: str) -> None:
    """Replace the table's column of image paths by the images' bytes (a column of bytes, from Parquet, is checked
    and kept); the paths move to `<column>_path`. A relative path is relative to the folder of the table file it is
    in (builtin: the project root)."""
    frame = raw.frame
    if column not in frame.columns:
        raise DataError(
            f"data.image_column {column!r} is not a column of {raw.source} (for this data: -S data.image_column=null)"
            f"; the columns are: {', '.join(repr(str(c)) for c in frame.columns[:30])}"
        )
    if column + PATH_SUFFIX in frame.columns:
        raise DataError(
            f"data.source: {raw.source} has a column {column + PATH_SUFFIX!r}, the name ingest gives the paths of the "
            f"images of data.image_column {column!r}; rename it"
        )
    values = frame[column].to_numpy(dtype=object, na_value=None)
    missing = [i for i, v in enumerate(values) if v is None or (isinstance(v, str) and not v.strip())]
    if missing:
        raise _missing_images(raw, missing[0], len(missing), column)
    images: list[bytes] = []
    paths: list[str] = []
    for i, v in enumerate(values):
        data, shown = _image_of(raw, i, v, column)
        images.append(data)
        paths.append(shown)
    position = list(frame.columns).index(column)
    frame[column] = _objects(images)
    frame.insert(position + 1, column + PATH_SUFFIX, paths)
    raw.image_column = column


def _missing_images(raw: RawTable, first: int, count: int, column: str) -> DataError:
    return DataError(
        f"data.source: {raw.where(first, column)}: the image path is missing ({count} row(s) without one); fill it "
        "in or drop the row"
    )


def _image_path(raw: RawTable, i: int, v: Any) -> Path:
    """Row i's image path `v`, relative to the folder of the table file the row is in (builtin: the project root)."""
    path = Path(str(v).strip()).expanduser()
    if not path.is_absolute():
        base = raw.files[raw.position(i)[0]].parent if raw.files else (raw.root or Path.cwd())
        path = base / path
    return path


def _image_of(raw: RawTable, i: int, v: Any, column: str) -> tuple[bytes, str]:
    """Row i's image, checked: (its bytes, its file's path as shown; "" for bytes held in the table)."""
    if isinstance(v, bytes | bytearray | memoryview):
        data = bytes(v)
        _check_image(data, raw.where(i, column))
        return data, ""
    path = _image_path(raw, i, v)
    if not path.is_file():
        raise DataError(
            f"data.source: {raw.where(i, column)}: image {str(v)!r} does not exist (looked for {path}); paths "
            "are relative to the table file's folder"
        )
    return _read_image_file(path, f"{_shown(path, raw.root)} ({raw.where(i, column)})"), _shown(path, raw.root)


def _spill_table_images(table: pa.Table, raw: RawTable, d: DataParams, folder: Path) -> RawTable | None:
    """A table of image paths (or bytes) whose images would take more than data.memory_budget_mb in memory: the
    table's rows with each image's bytes and path (`read_images`' columns), read and checked in row order into Arrow
    IPC chunks of about IMAGE_CHUNK_BYTES of images, as a SpilledFrame of the same columns and types the in-memory
    frame has; the same errors first. None (read into memory as before) when the images fit, or when the column is
    not one of text or bytes (read_images then says what is wrong). `raw`: where the rows are, for messages."""
    column = str(d.image_column)
    names = table.column_names
    if column not in names or column + PATH_SUFFIX in names:
        return None
    values = table.column(column)
    kind = values.type
    binary = pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
    if not (binary or pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        return None
    n = table.num_rows
    blank = (
        pc.is_null(values)
        if binary
        else pc.or_kleene(pc.is_null(values), pc.equal(pc.utf8_trim_whitespace(values), ""))
    )
    missing = np.flatnonzero(blank.to_numpy(zero_copy_only=False).astype(bool, copy=False))
    if len(missing):
        raise _missing_images(raw, int(missing[0]), len(missing), column)
    sizes = np.zeros(n, dtype=np.int64)  # each image's bytes (0: a file that is not there, reported in order below)
    for lo in range(0, n, 1 << 16):
        for j, v in enumerate(values.slice(lo, 1 << 16).to_pylist(), lo):
            if binary:
                sizes[j] = len(v)
            elif (path := _image_path(raw, j, v)).is_file():
                sizes[j] = path.stat().st_size
    size = int(sizes.sum())
    streamed, why = _image_stream_choice(n, size, d)
    if not streamed:
        return None
    print(f"ingest: images of {column!r}: {why}", file=sys.stderr)
    folder.mkdir(parents=True, exist_ok=True)
    rows = max(1, int(IMAGE_CHUNK_BYTES * n / max(size, 1)))
    position = names.index(column)
    parts: list[list[Path]] = []
    bar = progress(n, desc="ingest: images", unit="image")
    start = 0
    for count in raw.rows:  # a file's rows at a time, so no chunk holds two files' rows
        parts.append([])
        for lo in range(start, start + count, rows):
            chunk = table.slice(lo, min(rows, start + count - lo))
            read = [_image_of(raw, j, v, column) for j, v in enumerate(chunk.column(column).to_pylist(), lo)]
            part = chunk.set_column(position, column, pa.array([r[0] for r in read], pa.binary()))
            part = part.add_column(position + 1, column + PATH_SUFFIX, pa.array([r[1] for r in read], pa.string()))
            parts[-1].append(folder / f"images-{len(parts)}-{len(parts[-1])}.arrow")
            feather.write_feather(part, parts[-1][-1], compression="uncompressed")  # encoded images do not compress
            del part, read
            pa.default_memory_pool().release_unused()
            bar.update(chunk.num_rows)
        start += count
    bar.close()
    first = feather.read_table(parts[0][0], memory_map=False).schema
    types = dict(zip(first.names, first.types))
    shown = [_shown(p, raw.root) for p in raw.files]
    frame = SpilledFrame(folder, parts, list(types), types, {}, n, shown)
    frame.batch_rows = rows
    raw.frame, raw.image_column = frame, column
    return raw


def _read_image_file(path: Path, shown: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"data.source: cannot read image {shown}: {exc.strerror or exc}") from None
    _check_image(data, shown)
    return data


def _check_image(data: bytes, shown: str) -> None:
    """Decode `data` fully (a truncated file fails only when its pixels are read): DataError naming `shown`.
    The cost is one decode per image at ingest, so that training never meets a broken file."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise DataError(
            f"data.source: image {shown} cannot be read ({exc}); replace the file or remove its row"
        ) from None


def _objects(values: list[bytes]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _digits_images(source: str) -> RawTable:
    """scikit-learn's digits as 8x8 grayscale PNGs, the pixel values (0..16) kept as they are."""
    from PIL import Image
    from sklearn import datasets

    digits = datasets.load_digits()
    images = []
    for pixels in digits.images.astype(np.uint8):
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG")  # uint8 [8, 8]: mode L
        images.append(buffer.getvalue())
    frame = pd.DataFrame({DEFAULT_IMAGE_COLUMN: _objects(images), "target": digits.target.astype(np.int64)})
    return RawTable(frame, source, [], [len(frame)], "builtin", image_column=DEFAULT_IMAGE_COLUMN)


# --- combining files --------------------------------------------------------------------------------------------


def _concat(tables: list[pa.Table], files: list[Path], root: Path) -> pa.Table:
    """One table from the files' tables: same column names required (order may differ), types unified."""
    if len(tables) == 1:
        return tables[0]
    names = tables[0].column_names
    for i in range(1, len(tables)):
        if tables[i].column_names != names:
            _check_same_columns(names, tables[i].column_names, files, i, root)
            tables[i] = tables[i].select(names)
    for j, name in enumerate(names):
        types = [t.schema.field(j).type for t in tables]
        if all(t == types[0] for t in types):
            continue
        target = _common_type(name, types)
        for i, t in enumerate(tables):
            if t.schema.field(j).type != target:
                try:
                    tables[i] = t.set_column(j, pa.field(name, target), t.column(j).cast(target))
                except (pa.ArrowException, ValueError) as exc:
                    raise DataError(
                        f"data.source: column {name!r} of {_shown(files[i], root)} is {t.schema.field(j).type}, "
                        f"which cannot be combined with the other files' {target} ({exc})"
                    ) from None
    return pa.concat_tables(tables, promote_options="default")


def _check_same_columns(names: list[str], other: list[str], files: list[Path], i: int, root: Path) -> None:
    """File i's columns are file 0's (in any order)."""
    missing = [n for n in names if n not in other]
    extra = [n for n in other if n not in names]
    if missing or extra or len(other) != len(names):
        parts = [f"lacks {missing}" if missing else "", f"has extra {extra}" if extra else ""]
        detail = " and ".join(p for p in parts if p) or "repeats a column name"
        raise DataError(
            f"data.source: {_shown(files[i], root)} has other columns than {_shown(files[0], root)}: it "
            f"{detail}; files of one source must have the same columns"
        )


def _common_type(name: str, types: list[pa.DataType]) -> pa.DataType:
    """The type a column takes when files disagree: a numeric promotion when there is one, else string."""
    known = [t for t in types if not pa.types.is_null(t)]
    if not known:
        return pa.null()
    if all(t == known[0] for t in known):
        return known[0]
    try:
        schemas = [pa.schema([pa.field(name, t)]) for t in known]
        return pa.unify_schemas(schemas, promote_options="permissive").field(0).type
    except (pa.ArrowException, ValueError, TypeError):
        return pa.string()


def _to_pandas(table: pa.Table) -> pd.DataFrame:
    frame = table.to_pandas(split_blocks=True, self_destruct=True, date_as_object=False)
    frame.columns = [str(c) for c in frame.columns]
    return frame


# --- locating problems in text files (only when reporting one) --------------------------------------------------


def _open_text(path: Path, encoding: str) -> Any:
    name = codecs.lookup(encoding).name
    return path.open(encoding="utf-8-sig" if name == "utf-8" else encoding, errors="replace", newline="")


# Files read with data.quoting resolved to none (tsv by default): a quote there is a character, not a delimiter guard.
_UNQUOTED: set[Path] = set()


def _csv_records(path: Path, delimiter: str, encoding: str) -> Iterator[tuple[int, int, list[str]]]:
    """(first line, last line, fields) of each non-blank record, as pyarrow reads them (blank lines skipped)."""
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    with _open_text(path, encoding) as f:
        reader = csv.reader(f, delimiter=delimiter, quoting=csv.QUOTE_NONE if path in _UNQUOTED else csv.QUOTE_MINIMAL)
        last = 0
        for row in reader:
            first, last = last + 1, reader.line_num
            if row:
                yield first, last, row


def _csv_record_lines(path: Path, delimiter: str, encoding: str, header: int, records: set[int]) -> dict[int, int]:
    """Record number (0-based, after the `header` records of a header; -1 = its last, -header its first) -> the line
    where it starts."""
    out: dict[int, int] = {}
    if not records:
        return out
    try:
        for k, (first, _, _) in enumerate(_csv_records(path, delimiter, encoding), -int(header)):
            if k in records:
                out[k] = first
                if len(out) == len(records):
                    break
    except (OSError, csv.Error):
        pass
    return out


def _csv_start_lines(path: Path, delimiter: str, encoding: str, header: int, upto: int) -> array[int]:
    """The line on which each data record 0..upto starts, after `header` records of a header (fewer if the file has
    fewer records)."""
    out: array[int] = array("q")
    try:
        records = _csv_records(path, delimiter, encoding)
        for _ in range(header):
            next(records, None)
        for first, _, _ in records:
            out.append(first)
            if len(out) > upto:
                break
    except (OSError, csv.Error):
        pass
    return out


def _jsonl_start_lines(path: Path, encoding: str, upto: int) -> array[int]:
    """The line of each record 0..upto of a jsonl file (blank lines are not records)."""
    out: array[int] = array("q")
    try:
        with path.open(encoding=encoding, errors="replace") as f:
            for line_no, line in enumerate(f, 1):
                if line.strip():
                    out.append(line_no)
                    if len(out) > upto:
                        break
    except OSError:
        pass
    return out


def _header_line(path: Path, delimiter: str, encoding: str, rows: int = 1) -> int:
    """The line on which a header of `rows` records starts."""
    return _csv_record_lines(path, delimiter, encoding, rows, {-rows}).get(-rows, 1)


def _csv_error(path: Path, shown: str, fmt: str, delimiter: str, d: DataParams, exc: Exception) -> DataError:
    """The DataError for a csv/tsv file pyarrow could not read: its file and line, what is wrong, what to do."""
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "Empty CSV" in message:
        return DataError(f"data.source: {shown} is empty: no rows")
    decoding = isinstance(exc, UnicodeDecodeError) or "UTF8" in message or "decode" in message
    checks = [_decode_error, _field_count_error] if decoding else [_field_count_error, _decode_error]
    for check in checks:
        error = check(path, shown, delimiter, d)
        if error is not None:
            return error
    return DataError(f"data.source: cannot read {shown} as {fmt} (delimiter {delimiter!r}): {message}")


def _field_count_error(path: Path, shown: str, delimiter: str, d: DataParams | None, *_: Any) -> DataError | None:
    """The first record whose field count differs from the header's (or data.columns', or the first line's)."""
    assert d is not None
    expected: int | None = len(d.columns) if d.columns is not None else None
    basis = "data.columns names" if d.columns is not None else "the header has" if d.header else "the first line has"
    try:
        for first, last, row in _csv_records(path, delimiter, d.encoding):
            if expected is None:
                expected = len(row)
                if d.header:
                    continue
            if len(row) == expected:
                continue
            found = len(row)
            if last > first:
                hint = f"the record runs from line {first} to {last}: an unbalanced quote?"
            elif d.columns is not None:
                hint = "fix data.columns or the line"
            elif expected == 1 and d.header:
                hint = f"is data.delimiter right ({delimiter!r})?"
            elif found > expected:
                hint = "a delimiter inside an unquoted value? Quote it, or fix the line"
            else:
                hint = "a value missing with its delimiter, or a line cut short?"
            return DataError(
                f"data.source: {shown}, line {first}: expected {expected} fields ({basis} {expected}), found {found}"
                f" — {hint}"
            )
    except (OSError, csv.Error):
        return None
    return None


def _undecodable(path: Path, shown: str, encoding: str) -> DataError:
    """A text file that is not valid in its encoding: the first bad byte with its line, or the file named."""
    return _decode_error(path, shown, None, None, encoding) or DataError(
        f"data.source: {shown} is not valid {encoding}; set data.encoding to the file's encoding"
    )


def _decode_error(
    path: Path, shown: str, delimiter: str | None, d: DataParams | None, encoding: str | None = None
) -> DataError | None:
    """The first byte that is not valid in the file's encoding, with its line (and column for csv/tsv)."""
    encoding = encoding or (d.encoding if d is not None else "utf-8")
    decoder = codecs.getincrementaldecoder(encoding)("strict")
    line = 1
    try:
        with path.open("rb") as f:
            for raw in f:
                try:
                    text = decoder.decode(raw)
                except UnicodeDecodeError as exc:
                    bad = exc.object[exc.start : exc.end]
                    column = _column_of(raw[: max(exc.start, 0)], path, delimiter, d, encoding)
                    hint = (
                        "set data.encoding to the file's encoding (latin-1 or cp1252 for most Western exports)"
                        if codecs.lookup(encoding).name == "utf-8"
                        else "set data.encoding to the file's encoding"
                    )
                    return DataError(
                        f"data.source: {shown}, line {line}{column}: byte 0x{bad[:1].hex()} is not valid "
                        f"{encoding} (data.encoding: {encoding}); {hint}"
                    )
                line += text.count("\n")
            decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return DataError(
            f"data.source: {shown}, line {line}: the file ends inside a character of {encoding}; set data.encoding"
        )
    except OSError:
        return None
    return None


def _column_of(prefix: bytes, path: Path, delimiter: str | None, d: DataParams | None, encoding: str) -> str:
    """The ", column 'name'" suffix for the field a bad byte sits in, when the line is one simple csv/tsv record."""
    if delimiter is None or d is None:
        return ""
    try:
        fields = next(csv.reader([prefix.decode(encoding, errors="replace")], delimiter=delimiter), [""])
    except csv.Error:
        return ""
    index = max(len(fields) - 1, 0)
    if d.columns is not None:
        names = list(d.columns)
    elif d.header:
        header = next((row for _, _, row in _csv_records(path, delimiter, encoding)), [])
        names = header
    else:
        names = [f"column_{i + 1}" for i in range(index + 1)]
    if index >= len(names) or "\ufffd" in names[index]:  # the bad byte is in the header itself
        return ""
    return f", column {names[index]!r}"
