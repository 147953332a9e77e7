"""`trainflow predict` and the batch_predict flow: read a table file, score it with a model, write the rows plus the
predictions atomically."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd

from trainflow.artifacts.predict import BATCH_SIZE, ExportedModel, load
from trainflow.core.errors import DataError, UserError

if TYPE_CHECKING:
    from trainflow.data.sources import RawTable

OUTPUT_FORMATS = (".csv", ".tsv", ".parquet", ".jsonl")


def read_table(path: Path) -> RawTable:
    """An input table read as ingest reads data (csv, tsv, parquet or jsonl by extension; the same NA spellings), with
    where each row came from (its line of the file), for messages."""
    from trainflow.data.sources import read_source
    from trainflow.params import DataParams

    with _as_input():
        table = read_source(DataParams.model_validate({"source": str(path.resolve())}), Path.cwd())
    for note in table.notes:
        print(f"predict: {note}", file=sys.stderr)
    return table


class Rows(Protocol):
    """Where a row of the frame being scored came from: `trainflow.data.sources.RawTable`, or a block of a streamed
    Parquet file (`Block`)."""

    @property
    def frame(self) -> pd.DataFrame: ...

    @property
    def source(self) -> str: ...

    def where(self, row: int, column: str | None = None) -> str: ...


@dataclass
class Block:
    """Rows of an input without lines, from row `first` on: a block of a streamed Parquet file, or the images of a
    folder; a row is named as ingest names a Parquet row (counted from 1)."""

    frame: pd.DataFrame
    source: str
    first: int

    def where(self, row: int, column: str | None = None) -> str:
        return f"{self.source}, row {self.first + row + 1}" + ("" if column is None else f", column {column!r}")


def scored_rows(
    exported: ExportedModel, rows: Rows, batch_size: int, where: str, base: Path | None = None
) -> pd.DataFrame:
    """`rows.frame` scored (`ExportedModel.predict_frame`) once it passed ingest's rules for the values a model is
    trained on (an infinity in a numeric feature is refused, as ingest refuses it: preprocessing would score it as a
    missing value); a value that does not convert is named, like those, by its line of the file."""
    from trainflow.data.preprocess import BadValues
    from trainflow.data.validate import not_finite

    for c in exported.pre.columns:
        if c.kind == "numeric" and c.name in rows.frame.columns:
            values = pd.to_numeric(rows.frame[c.name], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
            problem = not_finite(rows, c.name, values, "or drop the row: ingest refuses one too, so the model was "
                                 "never trained on one")  # fmt: skip
            if problem is not None:
                raise _on_input(problem)
    try:
        return exported.predict_frame(rows.frame, batch_size, where=where, base=base)
    except BadValues as exc:
        raise DataError(f"--input: {rows.where(exc.row)}: {exc.detail}, the first there; fix or drop them") from None


def read_image_folder(folder: Path, column: str, target: str) -> pd.DataFrame:
    """A folder of class folders, listed as ingest lists it: `read_images`' columns (the images are read when they
    are decoded, a batch at a time once they are many: the folder may be bigger than memory) and the class as
    `target`."""
    from trainflow.data.sources import image_folder_files

    with _as_input():
        files, labels = image_folder_files(folder.resolve(), Path.cwd())
    return read_images(files, column).assign(**{target: labels})


def read_images(files: list[Path], column: str) -> pd.DataFrame:
    """Image files, one row each: `column` holds the file's absolute path (for the model to read) and
    `<column>_path` the path as the user sees it, relative to the working directory when inside it."""
    from trainflow.data.sources import PATH_SUFFIX

    here = Path.cwd()
    full = [p.resolve() for p in files]
    shown = [p.relative_to(here).as_posix() if p.is_relative_to(here) else str(p) for p in full]
    return pd.DataFrame({column: [str(p) for p in full], column + PATH_SUFFIX: shown})


@contextmanager
def _as_input() -> Iterator[None]:
    """The data readers' errors name data.source, ingest's param; for predict they are about --input."""
    try:
        yield
    except DataError as exc:
        raise _on_input(exc) from None


def _on_input(exc: DataError) -> DataError:
    message = str(exc)
    message = "--input" + message.removeprefix("data.source") if message.startswith("data.source:") else message
    return DataError(message.replace("data.source", "--input"))


def image_input(input: Path, column: str | None) -> list[Path] | None:
    """The image files `input` names when it is one image file or a flat folder of them (no subfolders); None for a
    table file or a folder of class folders. Errors name --input and what to change."""
    from trainflow.data.sources import IMAGE_SUFFIXES

    kinds = f"images ({', '.join(sorted(IMAGE_SUFFIXES))})"
    if input.is_file():
        if input.suffix.lower() not in IMAGE_SUFFIXES:
            return None
        if column is None:
            raise UserError(f"--input {input}: an image; this model scores tables (csv, tsv, parquet, jsonl): give one")
        return [input]
    entries = sorted(p for p in input.iterdir() if not p.name.startswith("."))
    if column is None:
        raise UserError(f"--input {input}: a folder; this model scores tables (csv, tsv, parquet, jsonl): give one")
    if any(p.is_dir() for p in entries):
        return None  # a folder of class folders
    if not entries:
        raise UserError(f"--input {input}: the folder is empty; put the {kinds} to score in it")
    other = [p for p in entries if p.suffix.lower() not in IMAGE_SUFFIXES]
    if other:
        raise UserError(
            f"--input {input}: {other[0]} is not an image by its extension ({other[0].suffix or 'none'}); a folder "
            f"to score holds {kinds} only, or one folder of them per class: move it out of the folder"
        )
    return entries


def image_column(frame: pd.DataFrame, column: str, input: Path) -> str:
    """The column of `frame` holding the images: as the model was trained (`column`), `image`, or the `<...>_path`
    column of either (what ingest and predict write beside the images)."""
    from trainflow.data.sources import DEFAULT_IMAGE_COLUMN, PATH_SUFFIX

    accepted = list(
        dict.fromkeys([column, DEFAULT_IMAGE_COLUMN, column + PATH_SUFFIX, DEFAULT_IMAGE_COLUMN + PATH_SUFFIX])
    )
    found = next((c for c in accepted if c in frame.columns), None)
    if found is None:
        raise DataError(
            f"--input {input}: no column of images; the model reads each row's image (its file's path, relative to "
            f"the table's folder) from a column named {' or '.join(repr(c) for c in accepted)}, but the columns are "
            f"{', '.join(repr(str(c)) for c in frame.columns[:20])}: rename the one of image paths to {column!r}"
        )
    return found


def output_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in OUTPUT_FORMATS:
        raise UserError(f"--output {path}: unknown extension {path.suffix!r}; use one of {', '.join(OUTPUT_FORMATS)}")
    return suffix


def write_table(frame: pd.DataFrame, path: Path) -> None:
    """`frame` to `path` by its extension, atomically: a failed write leaves any earlier file as it was."""
    from trainflow.core.io import atomic_path

    suffix = output_format(path)
    with atomic_path(path) as tmp:
        if suffix == ".parquet":
            frame.to_parquet(tmp, index=False)
        elif suffix == ".jsonl":
            _write_jsonl(frame, tmp)
        else:
            frame.to_csv(tmp, index=False, sep="\t" if suffix == ".tsv" else ",")


def _write_jsonl(frame: pd.DataFrame, path: Path) -> None:
    with open(path, "wb") as f:
        _write_jsonl_to(frame, f)


def _write_jsonl_to(frame: pd.DataFrame, f: Any, chunk: int = 65536) -> None:
    """One JSON object per row; floats written in full (pandas' to_json keeps 10 digits), missing values as null."""
    import json

    for start in range(0, len(frame), chunk):
        part = frame.iloc[start : start + chunk]
        part = part.astype(object).where(part.notna(), None)
        for row in part.to_dict(orient="records"):
            f.write((json.dumps(row, default=str, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8"))


def predict_file(
    model: str,
    input: Path,
    output: Path,
    batch_size: int = BATCH_SIZE,
    memory_budget_mb: float | None = None,
    runtime: str = "torch",
) -> dict[str, object]:
    """Score every row of `input` with `model`; write the rows plus the prediction columns to `output`.

    A Parquet table bigger than `memory_budget_mb` (default: a quarter of this machine's memory, as
    data.memory_budget_mb) is streamed: read a block of whole batches at a time, scored and appended to `output`, so
    the outputs are the in-memory path's, bit for bit, at the memory of one block.

    Image models: `input` is a table whose image column holds paths (relative to the table's folder), a folder of
    class folders of images (each row then also holds its folder's name as the target, and the image's path), a flat
    folder of images or one image file (a row per image, with its path).

    `runtime` "onnx" scores with the model.onnx exported beside the weights, in ONNX Runtime."""
    if not (input.is_file() or input.is_dir()):
        raise UserError(f"--input {input}: no such file")
    output_format(output)  # before the work, not after it
    exported = load(model)
    if runtime == "onnx":
        exported = exported.on_onnx(model)
    column = exported.pre.image_column
    images = image_input(input, column)
    renamed: dict[str, str] = {}  # the model's image column -> the input's name for it
    rows: Rows
    if images is not None:
        assert column is not None
        rows = Block(read_images(images, column), str(input), 0)
    elif input.is_dir():
        assert column is not None
        rows = Block(read_image_folder(input, column, exported.pre.target), str(input), 0)
    elif column is None and input.suffix.lower() == ".parquet" and _bigger_than_budget(input, memory_budget_mb):
        count = _predict_streamed(exported, input, output, batch_size)
        return {"model": model, "input": str(input), "output": str(output), "rows": count, "task": exported.pre.task}
    else:
        rows = table = read_table(input)
        if column is not None and (found := image_column(table.frame, column, input)) != column:
            table.frame, renamed = table.frame.rename(columns={found: column}), {column: found}
    _check_free(rows.frame, input)
    scored = scored_rows(exported, rows, batch_size, str(input), base=input.resolve().parent)
    if (images is not None or input.is_dir()) and column is not None:
        scored = scored.drop(columns=[column])  # the images' absolute paths; the paths as shown stay
    write_table(scored.rename(columns=renamed), output)
    return {"model": model, "input": str(input), "output": str(output), "rows": len(scored), "task": exported.pre.task}


def _check_free(frame: pd.DataFrame, input: Path) -> None:
    taken = [c for c in frame.columns if c == "prediction" or str(c).startswith("proba_")]
    if taken:
        raise UserError(f"--input {input}: already has prediction column(s) {taken}; drop or rename them first")


def _bigger_than_budget(input: Path, memory_budget_mb: float | None) -> bool:
    from trainflow.data import stream
    from trainflow.params import DataParams

    budget = stream.budget_mb(DataParams.model_validate({"memory_budget_mb": memory_budget_mb}))
    with _as_input():
        size = stream.table_mb(input)
    if size > budget:
        print(f"predict: {input} is {size:,.1f} MiB once read, over the {budget:,.0f} MiB budget: streamed a block "
              "at a time", file=sys.stderr)  # fmt: skip
    return size > budget


def _predict_streamed(exported: ExportedModel, input: Path, output: Path, batch_size: int) -> int:
    """Score `input` (Parquet) a block of whole batches at a time, appending each block's rows to `output`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainflow.core.io import atomic_path
    from trainflow.data import stream
    from trainflow.data.sources import _to_pandas, unnamed_index

    try:
        source = pq.ParquetFile(input)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DataError(f"--input {input} is not a readable Parquet file ({exc})") from None
    unnamed = unnamed_index(source.schema_arrow)
    suffix = output_format(output)
    rows = 0
    with atomic_path(output) as tmp, open(tmp, "wb") as f:
        writer: pq.ParquetWriter | None = None
        for batch in source.iter_batches(batch_size=stream.block_rows(exported.pre.width, batch_size)):
            table = pa.Table.from_batches([batch]).drop_columns(unnamed).replace_schema_metadata(None)
            frame = _to_pandas(table)
            if rows == 0:
                _check_free(frame, input)
            scored = scored_rows(exported, Block(frame, str(input), rows), batch_size, str(input))
            if suffix == ".parquet":
                block = pa.Table.from_pandas(scored, preserve_index=False)
                writer = writer or pq.ParquetWriter(f, block.schema)
                writer.write_table(block)
            elif suffix == ".jsonl":
                _write_jsonl_to(scored, f)
            else:
                text = scored.to_csv(index=False, header=rows == 0, sep="\t" if suffix == ".tsv" else ",")
                f.write(text.encode("utf-8"))
            rows += len(scored)
        if writer is not None:
            writer.close()
    if rows == 0:
        output.unlink(missing_ok=True)
        raise DataError(f"--input {input} has no rows; fill it")
    return rows
