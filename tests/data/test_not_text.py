"""A csv/tsv/jsonl source that is not text (an image, a workbook, a Parquet file renamed .csv; UTF-16 text read as
UTF-8) is named as such, with what it looks like and what to do, in memory and streamed alike, instead of a parse
error about a line; where the message says what to set, setting it reads the file."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from trainflow.core.errors import DataError
from trainflow.data import sources
from trainflow.params import DataParams

BUDGETS = pytest.mark.parametrize("budget", [None, 1e-6], ids=["in-memory", "streamed"])


def read(root: Path, name: str, budget: float | None, **kw: object) -> sources.RawTable:
    d = DataParams.model_validate({"source": name, "target": "label", "memory_budget_mb": budget, **kw})
    return sources.read_source(d, root, root / "spill")


def error(root: Path, name: str, budget: float | None, **kw: object) -> str:
    with pytest.raises(DataError) as info:
        read(root, name, budget, **kw)
    return str(info.value)


def png() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


@BUDGETS
def test_an_image_named_csv_is_not_text(tmp_path: Path, budget: float | None) -> None:
    data = png()
    (tmp_path / "x.csv").write_bytes(data)
    assert error(tmp_path, "x.csv", budget) == (
        f"data.source: x.csv is not text in utf-8 (a NUL byte at byte {data.index(0)}): it looks like a binary file; "
        "point data.source at a csv, tsv, jsonl or parquet file"
    )
    (tmp_path / "x.jsonl").write_bytes(data)
    assert error(tmp_path, "x.jsonl", budget).startswith("data.source: x.jsonl is not text in utf-8 (a NUL byte")


@BUDGETS
def test_a_workbook_named_csv_is_a_zip_archive(tmp_path: Path, budget: float | None) -> None:
    with zipfile.ZipFile(tmp_path / "x.csv", "w", zipfile.ZIP_DEFLATED) as book:  # an .xlsx is a zip of xml parts
        book.writestr("xl/worksheets/sheet1.xml", np.random.default_rng(1).bytes(20000))
    assert error(tmp_path, "x.csv", budget) == (
        "data.source: x.csv is not text in utf-8 (a NUL byte at byte 5): it looks like a zip archive (an .xlsx "
        "workbook is one); export the sheet as CSV and point data.source at it"
    )


@BUDGETS
def test_a_parquet_file_named_csv_reads_once_data_format_says_parquet(tmp_path: Path, budget: float | None) -> None:
    table = pd.DataFrame({"x": np.arange(500) * 0.5, "label": ["a", "b"] * 250})
    table.to_parquet(tmp_path / "x.csv")
    message = error(tmp_path, "x.csv", budget)
    assert message.startswith("data.source: x.csv is not text in utf-8 (a NUL byte at byte ") and message.endswith(
        ": it looks like a Parquet file; set -S data.format=parquet (or rename it .parquet, and data.source with it)"
    )
    raw = read(tmp_path, "x.csv", budget, format="parquet")  # as it says
    for name in table.columns:
        pd.testing.assert_series_equal(raw.frame[name], table[name])


@pytest.mark.parametrize(("encoding", "guess"), [("utf-16", "utf-16"), ("utf-16-le", "utf-16-le"),
                                                 ("utf-16-be", "utf-16-be"), ("utf-32", "utf-32")])  # fmt: skip
def test_utf16_text_read_as_utf8_says_which_encoding_and_setting_it_reads_it(
    tmp_path: Path, encoding: str, guess: str
) -> None:
    table = pd.DataFrame({"word": ["über", "x", "señal", "y"] * 30, "label": ["a", "b", "c", "d"] * 30})
    table.to_csv(tmp_path / "x.csv", index=False, encoding=encoding)
    assert error(tmp_path, "x.csv", None) == (
        f"data.source: x.csv is not text in utf-8 (a NUL byte at byte {(tmp_path / 'x.csv').read_bytes().index(0)}): "
        f"it looks like text in {guess}; set data.encoding: -S data.encoding={guess}"
    )
    raw = read(tmp_path, "x.csv", None, encoding=guess)  # as it says
    pd.testing.assert_frame_equal(raw.frame, pd.read_csv(tmp_path / "x.csv", encoding=encoding))


def test_a_text_file_with_a_stray_control_character_still_reads(tmp_path: Path) -> None:
    """A few NULs in text, even in a short file, are not a binary file: read as before."""
    rows = "".join(f"{i},w{i}{chr(0) if i % 100 == 3 else ''},{'ab'[i % 2]}\n" for i in range(300))
    (tmp_path / "x.csv").write_text("x,w,label\n" + rows)
    raw = read(tmp_path, "x.csv", None)
    assert raw.frame["w"].tolist()[203] == "w203\x00" and len(raw.frame) == 300
    (tmp_path / "y.csv").write_text("x,w,label\n1,\x00\x00\x00,a\n")
    assert read(tmp_path, "y.csv", None).frame["w"].tolist() == ["\x00\x00\x00"]
