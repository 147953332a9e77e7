"""Tests for the survivors of the fourth (blind) mutation sample (BENCHMARKS.md, issue 24): each pins a behaviour a
mutant changed without any test noticing, with values worked out by hand."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError
from support.projects import make_project

from trainflow.core.errors import DataError
from trainflow.core.paths import Paths
from trainflow.data.validate import infer_schema
from trainflow.params import DataParams, PipelineParams, _problems, load_params
from trainflow.stages import run_stage

# --- params: a tune.space value whose own error has ": " in it ----------------------------------------------------


def test_a_tune_space_problem_keeps_the_whole_of_its_message_after_the_path() -> None:
    """A sampled model.name "hf:" is refused with a message that itself holds ": " ("hf: needs ..."): the problem is
    split from its path at the first ": " only, so the message arrives whole."""
    with pytest.raises(ValidationError) as exc:
        PipelineParams.model_validate({"tune": {"space": {"model.name": {"type": "categorical", "choices": ["hf:"]}}}})
    assert _problems(exc.value) == [
        (
            "tune.space.model.name",
            "'hf:' is not a valid value (model.name hf: needs the model's directory or hub id after it, e.g. "
            "hf:models/tiny-bert)",
        )
    ]


# --- validate: ISO timestamps with time-zone offsets -----------------------------------------------------------------


class _Table:
    """Stand-in for RawTable (as tests/data/test_validate.py's): row r is line r + 2 of f.csv."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame, self.source, self.files, self.fmt = frame, "data/raw/f.csv", [Path("data/raw/f.csv")], "csv"

    def where(self, row: int, column: str | None = None) -> str:
        return f"f.csv, line {row + 2}" + (f", column {column!r}" if column is not None else "")


def test_iso_timestamps_with_offsets_are_read_as_the_same_instants_in_utc() -> None:
    """+02:00, Z and -05:00 are three offsets of one column: parsed together in UTC (naive UTC values), 22:00 the
    day before, noon, and 05:00. A column of mixed offsets is not readable without UTC."""
    frame = pd.DataFrame(
        {
            "when": ["2026-01-01T00:00:00+02:00", "2026-01-02T12:00:00Z", "2026-01-03T00:00:00-05:00", None],
            "y": ["a", "b", "a", "b"],
        }
    )
    schema, out = infer_schema(_Table(frame), DataParams(target="y"), None)
    assert schema.kinds["when"] == "datetime"
    expected = np.array(["2025-12-31T22:00", "2026-01-02T12:00", "2026-01-03T05:00", "NaT"], dtype="datetime64[ns]")
    np.testing.assert_array_equal(out["when"].to_numpy(), expected)


# --- streamed ingest: the header checks ---------------------------------------------------------------------------


def _ingest_error(root: Path) -> str:
    with pytest.raises(DataError) as exc:
        run_stage("ingest", load_params(Paths(root).params), Paths(root))
    return str(exc.value)


@pytest.mark.parametrize("budget", ["null", "0.000001"], ids=["in-memory", "streamed"])
def test_files_of_one_source_with_other_columns_are_refused_naming_both(tmp_path: Path, budget: str) -> None:
    root = make_project(tmp_path, {"data.source": "data/raw/parts", "data.target": "label",
                                   "data.memory_budget_mb": budget})  # fmt: skip
    (root / "data/raw/parts").mkdir(parents=True)
    pd.DataFrame({"x": [1.0, 2.0], "label": ["a", "b"]}).to_csv(root / "data/raw/parts/a.csv", index=False)
    pd.DataFrame({"z": [1.0, 2.0], "label": ["a", "b"]}).to_csv(root / "data/raw/parts/b.csv", index=False)
    assert _ingest_error(root) == (
        "data.source: data/raw/parts/b.csv has other columns than data/raw/parts/a.csv: it lacks ['x'] and has "
        "extra ['z']; files of one source must have the same columns"
    )


@pytest.mark.parametrize(
    ("text", "twice"),
    [
        ("\n\nx,x,label\n1,2,a\n3,4,b\n", "x"),
        # an unnamed first column takes the name column_1 (it is data, not an index: its values are not distinct
        # integers), which the second column already has: known only once the whole column is read
        ("\n\n,column_1,label\np,2,a\nq,4,b\n", "column_1"),
    ],
    ids=["named-twice", "unnamed-becomes-a-name-taken"],
)
@pytest.mark.parametrize("budget", ["null", "0.000001"], ids=["in-memory", "streamed"])
def test_a_header_that_names_a_column_twice_is_refused_with_its_line(
    tmp_path: Path, budget: str, text: str, twice: str
) -> None:
    root = make_project(tmp_path, {"data.source": "data/raw/t.csv", "data.target": "label",
                                   "data.memory_budget_mb": budget})  # fmt: skip
    (root / "data/raw/t.csv").write_text(text)  # the header on line 3
    assert _ingest_error(root) == (
        f"data.source: data/raw/t.csv, line 3: the header names {twice!r} more than once; column names must be unique"
        "; if the header spans several lines (names over names, as a spreadsheet exports them), set data.header_rows "
        "to their count: each column is then named by its cells on them joined by '.'"
    )


# --- verify: restoring the splits from the DVC cache -------------------------------------------------------------


def test_restore_splits_copies_each_file_of_the_dvc_directory_listing_into_dest(tmp_path: Path) -> None:
    """A DVC directory hash lists its files (relpath, md5); each cached file is copied to dest under its relpath, also
    into a dest that exists, and into a sub-folder."""
    from trainflow.registry.verify import restore_splits

    cache = tmp_path / ".dvc/cache/files/md5"
    files = {"train.parquet": b"train rows", "nested/test.parquet": b"test rows"}
    listing = []
    for name, data in files.items():
        md5 = hashlib.md5(data).hexdigest()
        (cache / md5[:2]).mkdir(parents=True, exist_ok=True)
        (cache / md5[:2] / md5[2:]).write_bytes(data)
        listing.append({"relpath": name, "md5": md5})
    text = json.dumps(listing).encode()
    dir_hash = hashlib.md5(text).hexdigest() + ".dir"
    (cache / dir_hash[:2]).mkdir(parents=True, exist_ok=True)
    (cache / dir_hash[:2] / dir_hash[2:]).write_bytes(text)
    dest = tmp_path / "restored"
    dest.mkdir()
    assert restore_splits(tmp_path, dir_hash, dest) == ["train.parquet", "nested/test.parquet"]
    assert {n: (dest / n).read_bytes() for n in files} == files


def test_an_index_column_beside_a_column_named_column_1_is_dropped_alike_streamed_and_in_memory(tmp_path: Path) -> None:
    """pandas' to_csv index (an unnamed first column of distinct integers) beside a data column that happens to be
    named column_1: the index is dropped and column_1 kept, in memory and streamed (which crashed with pyarrow's
    "Field named column_1 is not found": two columns had that name while the index was not yet known)."""
    tables = []
    for budget in ("null", "0.000001"):
        root = make_project(tmp_path / budget, {"data.source": "data/raw/t.csv", "data.target": "label",
                                                "data.memory_budget_mb": budget})  # fmt: skip
        (root / "data/raw/t.csv").write_text(",column_1,label\n0,2.5,a\n1,4.5,b\n2,1.5,a\n3,0.5,b\n")
        run_stage("ingest", load_params(Paths(root).params), Paths(root))
        tables.append(pd.read_parquet(Paths(root).table))
    pd.testing.assert_frame_equal(tables[1], tables[0], check_exact=True)
    assert [c for c in tables[0].columns if not c.startswith("__")] == ["column_1", "label"]
    assert tables[0]["column_1"].tolist() == [2.5, 4.5, 1.5, 0.5]


def test_a_share_of_one_sample_is_one_measurement_all_of_it_per_sample() -> None:
    """estimate_memory with share 1 cannot probe two sizes: it measures one sample and counts it all per sample (no
    fixed part). Linear(4, 8) -> ReLU -> Linear(8, 1), squared error, fp32: autograd keeps the input row (4 floats),
    ReLU's output (8), the output (1) and the target (1) of one sample: 56 bytes (as test_batch_size.py works out)."""
    import torch
    from torch import nn

    from trainflow.engine import batch_size as bs
    from trainflow.engine.loaders import TensorData
    from trainflow.engine.objective import Objective
    from trainflow.engine.precision import Precision
    from trainflow.params import TrainParams

    class Net(nn.Sequential):  # called as trainflow calls its models: model(x=...)
        def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            return super().forward(x)

    torch.manual_seed(0)
    model = Net(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    data = TensorData(torch.randn(8, 4), torch.randn(8))
    fp32 = Precision("fp32", "cpu")
    est = bs.estimate_memory(model, data, Objective("regression"), fp32, TrainParams(), share=1)
    assert (est.state, est.fixed, est.per_sample) == (784, 0.0, 56.0)


def test_a_binary_curve_needs_both_classes_among_the_test_labels() -> None:
    """ROC/PR curves of a binary task are drawn for the positive class only when the test rows hold both classes."""
    from trainflow.plots import curve_classes

    assert curve_classes(np.array([0, 1, 0]), 2) == [1]
    assert curve_classes(np.array([0, 0, 0]), 2) == []  # no positive row: no curve
    assert curve_classes(np.array([1, 1]), 2) == []  # no negative row: no curve
    assert curve_classes(np.array([2, 0, 2, 1]), 3) == [2, 0, 1]  # one-vs-rest, most frequent first


def test_a_parquet_date_column_is_ingested_as_datetimes_not_python_dates(tmp_path: Path) -> None:
    """A date32 column of a Parquet source arrives as datetime64 (pyarrow would give Python date objects by default)."""
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    root = make_project(tmp_path, {"data.source": "data/raw/t.parquet", "data.target": "label"})
    days = [datetime.date(2026, 1, 1), datetime.date(2026, 1, 2), datetime.date(2026, 1, 3), datetime.date(2026, 1, 4)]
    table = pa.table({"day": pa.array(days, pa.date32()), "x": [1.0, 2.0, 3.0, 4.0], "label": ["a", "b", "a", "b"]})
    pq.write_table(table, root / "data/raw/t.parquet")
    run_stage("ingest", load_params(Paths(root).params), Paths(root))
    out = pd.read_parquet(Paths(root).table)
    assert out["day"].dtype.kind == "M"
    assert out["day"].tolist() == [pd.Timestamp(d) for d in days]


class _UserModel:  # a model class of the user's (any module outside trainflow)
    pass


def test_a_user_models_source_names_its_module_and_file() -> None:
    """user_source of a model defined in this test module: its module and its file."""
    from trainflow.models import user_source

    got = user_source(_UserModel())  # type: ignore[arg-type]
    assert got is not None
    here = str(Path(__file__).resolve())
    assert (got["module"], got["file"]) == (__name__, here)


def test_object_columns_of_booleans_and_of_datetimes_are_typed_from_their_python_values() -> None:
    """A column of Python True/False/None (object dtype, as JSON gives it) is a nullable boolean; one of Python
    datetimes with time zones is datetime64 in UTC (naive): 10:00+02:00 is 08:00 UTC."""
    import datetime

    tz = datetime.timezone(datetime.timedelta(hours=2))
    frame = pd.DataFrame(
        {
            "flag": pd.Series([True, False, None, True], dtype=object),
            "when": pd.Series([datetime.datetime(2026, 1, d, 10, tzinfo=tz) for d in (1, 2, 3, 4)], dtype=object),
            "y": ["a", "b", "a", "b"],
        }
    )
    schema, out = infer_schema(_Table(frame), DataParams(target="y"), None)
    assert (schema.kinds["flag"], schema.kinds["when"]) == ("boolean", "datetime")
    assert out["flag"].tolist() == [True, False, pd.NA, True]
    expected = np.array([f"2026-01-0{d}T08:00" for d in (1, 2, 3, 4)], dtype="datetime64[ns]")
    np.testing.assert_array_equal(out["when"].to_numpy(), expected)
