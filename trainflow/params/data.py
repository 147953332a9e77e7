"""data: the raw source and how to read it (the ingest stage), and where a source may live."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from trainflow.params.base import Section

# digits_images: the digits as 8x8 grayscale images (pixel values 0..16), for the cnn.
BUILTIN_DATASETS = ("digits", "iris", "wine", "breast_cancer", "diabetes", "digits_images")


class DataParams(Section):
    source: str = Field(
        "builtin:digits",
        description="Where the raw data comes from: a file, a glob (data/raw/*.csv) or a directory of files of one "
        "format, relative to the project root; a directory of class folders of images (<dir>/<class>/<file>.png, "
        ".jpg): an image column and the target = the folder's name; or builtin:<name> for a dataset that ships inside "
        "scikit-learn (digits, iris, wine, breast_cancer, diabetes; digits_images = digits as 8x8 images).",
    )
    format: Literal["auto", "csv", "tsv", "parquet", "jsonl"] = Field(
        "auto", description="File format; auto = from the extension (.csv, .tsv/.tab, .parquet/.pq, .jsonl/.ndjson)."
    )
    delimiter: str | None = Field(
        None,
        min_length=1,
        max_length=1,
        description="Field delimiter of csv/tsv files; null = ',' for csv, tab for tsv.",
    )
    header: bool = Field(True, description="Whether csv/tsv files start with a header line of column names.")
    header_rows: int = Field(
        1,
        ge=1,
        description="Lines the header of csv/tsv files spans (with data.header: true). Over 1, a column's name is its "
        "cells on those lines joined by '.', empty cells left out: 'network.node.hemi' for a column headed network, "
        "node and hemi on three lines.",
    )
    quoting: Literal["auto", "double", "none"] = Field(
        "auto",
        description='Quoted fields: double ("a, b" is one value; quoted values may hold delimiters and line '
        "breaks) or none (a quote is an ordinary character); auto = double for csv, none for tsv.",
    )
    columns: list[str] | None = Field(
        None, description="Column names for files without a header (data.header: false), in file order."
    )
    encoding: str = Field("utf-8", description="Text encoding of csv/tsv/jsonl files.")
    target: str = Field("target", min_length=1, description="Name of the column to predict.")
    task: Literal["auto", "classification", "regression"] = Field(
        "auto",
        description="auto: regression for a numeric target with non-integer values, or integers too many to be "
        "classes (more than 20 distinct, or fewer than 10 rows each; integer codes 0..K-1 or 1..K up to K=100 stay "
        "classes); classification for text, booleans and few integers. The choice and its reason are printed; a "
        "changed target or task is inferred afresh.",
    )
    features: list[str] | None = Field(
        None, description="Columns to use as features; null means every column except the target and `exclude`."
    )
    exclude: list[str] = Field(default_factory=list, description="Columns never used as features (ids, leaks).")
    text_column: str | None = Field(
        None,
        description="A free-text column to model with the text transformer (tokenized by a subword tokenizer "
        "trained on the train split); null = no text. With a text column the other features are not used.",
    )
    image_column: str | None = Field(
        None,
        description="A column of image file paths (PNG, JPEG, ...; relative to the table file's folder, or absolute) "
        "to model with the cnn; ingest stores each image's bytes in the table. With a folder of class folders it "
        "names the image column (null = image). With an image column the other features are not used.",
    )
    missing: Literal["impute", "drop", "error"] = Field(
        "impute",
        description="Missing feature values: impute (train median/mean plus a missing indicator, or an unknown "
        "category), drop the row, or error naming file, line and column.",
    )
    duplicates: Literal["keep", "drop", "error"] = Field(
        "keep", description="Rows that are exact duplicates of an earlier row: keep, drop, or error."
    )
    missing_target: Literal["error", "drop"] = Field(
        "error",
        description="Rows whose target value is missing: error naming file, line and column, or drop them (with a "
        "count on stderr).",
    )
    unseen_labels: Literal["error", "drop"] = Field(
        "error",
        description="When data is ingested again, target labels the saved schema has not seen: error, or drop "
        "those rows (with a count on stderr).",
    )
    memory_budget_mb: float | None = Field(
        None,
        gt=0,
        description="Memory (MiB) the data of a stage may take; null = a quarter of this machine's memory. Data "
        "that would take more than it in memory (about 3 times a source file's bytes, 6 times a split's Parquet "
        "data) is streamed, tables and images (not text yet): ingest parses a csv/tsv/jsonl/parquet source in "
        "chunks into a spill and types it a column at a time (images, of a folder or a table of paths: spilled in "
        "chunks as they are read), split assigns and writes rows a block at a time, train fits the preprocessing "
        "column by column (images: a block at a time) and reads the preprocessed rows (images: their encoded bytes) "
        "from a file on disk by row (models/.streamed/), and evaluate scores the test split a block of whole batches "
        "at a time, with the same table, statistics, sample order, weights and metrics as in memory. It changes "
        "where data is held, never the model. "
        "train.memory_budget_mb bounds the model's memory (batch_size auto), not the data's.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> DataParams:
        if self.features is not None and self.target in self.features:
            raise ValueError(f"data.features lists the target column {self.target!r}; remove it from the list")
        if self.target in self.exclude:
            raise ValueError(f"data.exclude lists the target column {self.target!r}; the target is never a feature")
        if self.columns is not None and self.header:
            raise ValueError("data.columns names the columns of header-less files: set data.header: false too")
        if self.header_rows > 1 and not self.header:
            raise ValueError("data.header_rows counts the lines of a header: set data.header: true, or header_rows: 1")
        if self.text_column is not None and self.text_column == self.target:
            raise ValueError("data.text_column is the target column; name the text feature")
        if self.image_column is not None and self.image_column in (self.target, self.text_column):
            raise ValueError("data.image_column is the target or the text column; name the column of image paths")
        if self.source.startswith("builtin:") and self.source.removeprefix("builtin:") not in BUILTIN_DATASETS:
            raise ValueError(
                f"data.source: unknown built-in dataset; choose one of builtin:{', builtin:'.join(BUILTIN_DATASETS)}"
            )
        return self


GLOB_CHARS = re.compile(r"[*?\[]")


RAW = "data/raw"  # what the ingest stage depends on in dvc.yaml: the only data DVC watches for it


def source_outside(source: str, root: Path) -> str | None:
    """Why data.source cannot be used from the project at `root`, or None: it names files outside data/raw/.

    The ingest stage's DVC dependency is data/raw/, so a file anywhere else (outside the project, or in it but not
    under data/raw/) can change (rows appended) while `dvc status` stays clean and the model goes stale. Outside =
    outside both as written (`..` collapsed) and with symlinks resolved: a project reached through a symlink, or
    data/raw/x.csv linking elsewhere, is inside it as written."""
    if source.startswith("builtin:"):
        return None
    given = Path(os.path.expanduser(source))
    full = Path(os.path.normpath(given if given.is_absolute() else root / given))
    raw = root / RAW
    if full.is_relative_to(os.path.normpath(raw)) or full.resolve().is_relative_to(raw.resolve()):
        return None
    where = "the project" if not full.resolve().is_relative_to(root.resolve()) else f"{RAW}/"
    return (
        f"{source} is outside {where} ({root / RAW if where != 'the project' else root}): DVC watches only {RAW}/ "
        f"for the ingest stage, so rows added to it later would leave `dvc status` clean and the model stale. Copy "
        f"it into {RAW}/ and track it: {_copy_in(full)}"
    )


def _copy_in(full: Path) -> str:
    """The shell commands that copy `full` (a file, a folder or a glob) under data/raw/ and track it with DVC, as the
    README's "Your data" does, then the data.source that names the copy."""
    from shlex import quote

    raw = RAW
    if GLOB_CHARS.search(full.as_posix()):  # the files of a glob go to a folder named as theirs; the glob moves along
        folder = next(p for p in full.parents if not GLOB_CHARS.search(p.as_posix()))
        inside = full.relative_to(folder).as_posix()
        copy = f"{raw}/{folder.name or 'data'}"
        if "/" in inside:  # a pattern over subfolders: copy them all, so it matches there as here
            command = f"cp -r {quote(str(folder))} {quote(copy)}"
        else:
            command = f"mkdir -p {quote(copy)} && cp {quote(str(folder))}/{inside} {quote(copy + '/')}"
        command += f" && dvc add {quote(copy)}"
        source = f"{copy}/{inside}"
    else:
        copy = f"{raw}/{full.name}"
        command = f"cp {'-r ' if full.is_dir() else ''}{quote(str(full))} {raw}/ && dvc add {quote(copy)}"
        source = copy
    return f"`{command}`, then rerun with `-S {quote('data.source=' + source)}`"


def default_model_name(source: str, target: str, task: str | None = None) -> str:
    """register.model_name auto: trainflow-<name> for builtin:<name> (its target is fixed), else the file's or
    folder's name (a glob's folder) and the target, and the task when data.task says it (a target modelled as
    the other task is another kind of model), as MLflow takes a name."""
    if source.startswith("builtin:"):
        return f"trainflow-{source.removeprefix('builtin:')}" + (f"-{task}" if task else "")
    path = Path(source.rstrip("/"))
    while GLOB_CHARS.search(path.as_posix()) and path != path.parent:
        path = path.parent
    name = f"{path.stem or 'data'}-{target}" + (f"-{task}" if task else "")
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.")
