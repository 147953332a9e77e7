"""`trainflow predict` and the batch_predict flow: read a table file, score it with a model, write the rows plus the
predictions atomically."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from trainflow.errors import UserError
from trainflow.predict import BATCH_SIZE, load

OUTPUT_FORMATS = (".csv", ".tsv", ".parquet", ".jsonl")


def read_table(path: Path) -> pd.DataFrame:
    """An input table read as ingest reads data (csv, tsv, parquet or jsonl by extension; the same NA spellings)."""
    from trainflow.data.sources import read_source
    from trainflow.params import DataParams

    return read_source(DataParams.model_validate({"source": str(path.resolve())}), Path.cwd()).frame


def read_image_folder(folder: Path, column: str, target: str) -> pd.DataFrame:
    """A folder of class folders as ingest reads it: the image (bytes), its path, the class as `target`."""
    from trainflow.data.sources import read_image_folder as read
    from trainflow.params import DataParams

    d = DataParams.model_validate({"source": str(folder.resolve()), "image_column": column, "target": target})
    return read(folder.resolve(), d, Path.cwd()).frame


def output_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in OUTPUT_FORMATS:
        raise UserError(f"--output {path}: unknown extension {path.suffix!r}; use one of {', '.join(OUTPUT_FORMATS)}")
    return suffix


def write_table(frame: pd.DataFrame, path: Path) -> None:
    """`frame` to `path` by its extension, atomically: a failed write leaves any earlier file as it was."""
    from trainflow.io import atomic_path

    suffix = output_format(path)
    with atomic_path(path) as tmp:
        if suffix == ".parquet":
            frame.to_parquet(tmp, index=False)
        elif suffix == ".jsonl":
            _write_jsonl(frame, tmp)
        else:
            frame.to_csv(tmp, index=False, sep="\t" if suffix == ".tsv" else ",")


def _write_jsonl(frame: pd.DataFrame, path: Path, chunk: int = 65536) -> None:
    """One JSON object per row; floats written in full (pandas' to_json keeps 10 digits), missing values as null."""
    import json

    with open(path, "w", encoding="utf-8") as f:
        for start in range(0, len(frame), chunk):
            part = frame.iloc[start : start + chunk]
            part = part.astype(object).where(part.notna(), None)
            for row in part.to_dict(orient="records"):
                f.write(json.dumps(row, default=str, ensure_ascii=False, allow_nan=False) + "\n")


def predict_file(model: str, input: Path, output: Path, batch_size: int = BATCH_SIZE) -> dict[str, object]:
    """Score every row of `input` with `model`; write the rows plus the prediction columns to `output`.

    Image models: `input` is a table whose image column holds paths (relative to the table's folder), or a folder of
    class folders of images (each row then also holds its folder's name as the target, and the image's path)."""
    if not (input.is_file() or input.is_dir()):
        raise UserError(f"--input {input}: no such file")
    output_format(output)  # before the work, not after it
    exported = load(model)
    column = exported.pre.image_column
    if input.is_dir():
        if column is None:
            raise UserError(f"--input {input}: a folder; this model scores tables (csv, tsv, parquet, jsonl): give one")
        frame = read_image_folder(input, column, exported.pre.target)
    else:
        frame = read_table(input)
    taken = [c for c in frame.columns if c == "prediction" or str(c).startswith("proba_")]
    if taken:
        raise UserError(f"--input {input}: already has prediction column(s) {taken}; drop or rename them first")
    scored = exported.predict_frame(frame, batch_size, where=str(input), base=input.resolve().parent)
    if input.is_dir() and column is not None:
        scored = scored.drop(columns=[column])  # the images' bytes; their paths stay
    write_table(scored, output)
    return {"model": model, "input": str(input), "output": str(output), "rows": len(scored), "task": exported.pre.task}
