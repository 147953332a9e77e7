"""Messages whose words carry the fix, checked word for word (each kills a mutant the sampled mutation run found
surviving: benchmarks/mutation.md). The expected texts are written out here, not built by the code."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from trainflow.core.errors import DataError
from trainflow.data.preprocess import _booleans
from trainflow.data.sources import _field_count_error
from trainflow.params import DataParams


def test_a_boolean_column_holding_other_numbers_names_what_it_should_hold() -> None:
    with pytest.raises(DataError) as error:
        _booleans(pd.Series([0, 1, 2, 1]), "paid", "train")
    assert (
        str(error.value) == "train: column 'paid' should hold booleans (0/1) but has ['2'] in 1 row(s) (first at row 2)"
    )


def test_a_one_column_header_with_more_fields_below_asks_about_the_delimiter(tmp_path: Path) -> None:
    f = tmp_path / "f.csv"
    f.write_text("a;b\n1;2,3\n")
    error = _field_count_error(f, "f.csv", ",", DataParams())
    assert error is not None
    assert str(error) == (
        "data.source: f.csv, line 2: expected 1 fields (the header has 1), found 2 — is data.delimiter right (',')?"
    )


def test_a_row_with_too_few_fields_asks_whether_a_value_or_the_line_s_end_is_missing(tmp_path: Path) -> None:
    from trainflow.data.sources import read_source

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "f.csv").write_text("a,b,c\n1,2,3\n4,5\n7,8,9\n")
    with pytest.raises(DataError) as error:
        read_source(DataParams(source="data/f.csv", target="c"), tmp_path)
    assert str(error.value) == (
        "data.source: data/f.csv, line 3: expected 3 fields (the header has 3), found 2 — a value missing with its "
        "delimiter, or a line cut short?"
    )


def test_a_one_row_missing_value_message_says_row(tmp_path: Path) -> None:
    from trainflow.data.sources import read_source
    from trainflow.data.validate import infer_schema

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "f.csv").write_text("x,z,y\n1,2,a\n2,,b\n3,4,a\n4,5,b\n")
    d = DataParams(source="data/f.csv", target="y", missing="error")
    with pytest.raises(DataError) as error:
        infer_schema(read_source(d, tmp_path), d)
    assert str(error.value) == (
        "data.source: data/f.csv, line 3, column 'z': the value is missing (1 row has missing values; data.missing: "
        "error); fill it in, or set data.missing: impute or drop"
    )
