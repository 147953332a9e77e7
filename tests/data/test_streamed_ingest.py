"""Ingest over data.memory_budget_mb (issue 26): the source is parsed a chunk of records at a time into a spill and
typed a column at a time, and what comes out is the in-memory ingest's: the same processed table (values, dtypes,
Parquet schema and pandas metadata), the same schema.json, the same split after it; the same errors, naming file and
line, with nothing half-written.

The chunks here are a few KiB (sources.CHUNK_BYTES) and the typed columns' batches a few hundred rows
(spill.BATCH_ROWS), so that columns change their inferred type between chunks, quoted line breaks straddle chunk
ends, and the rows dropped fall on batch boundaries."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pv
import pyarrow.parquet as pq
import pytest
from conftest import make_project

from trainflow.data import sources, spill
from trainflow.errors import DataError
from trainflow.params import load_params, write_overrides
from trainflow.paths import SPLITS, Paths
from trainflow.stages import run_stage


def awkward(n: int, seed: int = 0) -> pd.DataFrame:
    """Columns whose type a reader of the first rows gets wrong, values that straddle chunk ends, missing values,
    duplicates, an id, and a pandas index (to_csv's default)."""
    rng = np.random.default_rng(seed)
    late_float = rng.integers(0, 100, n).astype(object)
    late_float[n - 37] = 1.5  # integers until the last chunks: the column is float64 over the whole file
    late_text = rng.integers(0, 5, n).astype(object)
    late_text[n // 2 :] = [f"k{v}" for v in late_text[n // 2 :]]  # integers, then text: a categorical column
    flags = np.where(rng.random(n) < 0.5, "true", "false").astype(object)
    flags[-3] = "1"  # still booleans for pyarrow (1 is a true value)
    days = pd.date_range("2024-01-01", periods=n, freq="h").strftime("%Y-%m-%d").to_numpy(dtype=object)
    days[-1] = "2024-03-01 10:00:00"  # dates, then one timestamp: timestamp[s] over the whole file
    late_values = np.full(n, "", dtype=object)  # missing until the middle: a null type in the first chunks
    late_values[n // 2 :] = rng.choice(["p", "q"], n - n // 2)
    notes = np.array([f'said "hi"\nthen {i}' if i % 7 == 0 else f"n{i}" for i in range(n)], dtype=object)
    notes[n // 3] = "a long value " * 600  # longer than a chunk: the chunk grows to hold it
    x = np.where(rng.random(n) < 0.05, np.nan, rng.normal(0, 1, n))
    frame = pd.DataFrame(
        {
            "x": x,
            "late_float": late_float,
            "late_text": late_text,
            "flag": flags,
            "day": days,
            "late_values": late_values,
            "notes": notes,
            "label": rng.choice(["spam", "ham"], n),
        }
    )
    frame.loc[n - 10 : n - 5, ["x", "late_float", "late_text", "flag", "day", "late_values", "notes"]] = frame.loc[
        10:15, ["x", "late_float", "late_text", "flag", "day", "late_values", "notes"]
    ].to_numpy()  # duplicates of earlier rows (the label may differ)
    frame.loc[n - 4 : n - 1, "label"] = frame.loc[10:13, "label"].to_numpy()
    return frame


def ingest_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write: object, source: str,
                overrides: list[str]) -> tuple[Paths, Paths]:  # fmt: skip
    """The same source ingested in memory and streamed (in chunks of 4 KiB, typed columns in batches of 300 rows)."""
    made = []
    for name, budget in (("memory", "null"), ("streamed", "0.000001")):
        root = make_project(tmp_path / name, {"data.source": source, "data.target": "label",
                                               "data.memory_budget_mb": budget})  # fmt: skip
        write(root)  # type: ignore[operator]
        paths = Paths(root)
        write_overrides(paths.params, overrides)
        made.append(paths)
    memory, streamed = made
    run_stage("ingest", load_params(memory.params), memory)
    with monkeypatch.context() as m:
        m.setattr(sources, "CHUNK_BYTES", 4096)
        m.setattr(spill, "BATCH_ROWS", 300)
        m.setattr(sources, "_read_csv", lambda *a: pytest.fail("the streamed ingest read a whole csv file"))
        m.setattr(sources, "_read_parquet", lambda *a: pytest.fail("the streamed ingest read a whole parquet file"))
        run_stage("ingest", load_params(streamed.params), streamed)
    return memory, streamed


def assert_same_ingest(memory: Paths, streamed: Paths) -> None:
    a, b = pd.read_parquet(memory.table), pd.read_parquet(streamed.table)
    assert list(a.columns) == list(b.columns)
    assert a.dtypes.equals(b.dtypes), (a.dtypes, b.dtypes)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert pq.read_schema(memory.table).equals(pq.read_schema(streamed.table), check_metadata=True)
    assert json.loads(memory.schema.read_text()) == json.loads(streamed.schema.read_text())
    assert sorted(p.name for p in streamed.processed.iterdir()) == sorted(p.name for p in memory.processed.iterdir())


@pytest.mark.parametrize(
    "overrides",
    [[], ["data.duplicates=drop", "data.missing=drop", "data.exclude=[late_values]"], ["data.missing=impute"]],
    ids=["defaults", "drop-duplicates-and-missing", "impute"],
)
def test_a_streamed_csv_ingests_to_the_in_memory_table_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], overrides: list[str]
) -> None:
    frame = awkward(2500)
    memory, streamed = ingest_both(
        tmp_path, monkeypatch, lambda root: frame.to_csv(root / "data/raw/t.csv"), "data/raw/t.csv", overrides
    )
    err = capfd.readouterr().err
    assert "ingest: read into memory" in err and "ingest: read a column at a time from a spill on disk" in err
    assert err.count("dropped its first column") == 2  # the pandas index, found over the whole file in both
    assert_same_ingest(memory, streamed)
    kinds = json.loads(streamed.schema.read_text())["kinds"]
    assert kinds["late_float"] == "numeric" and kinds["late_text"] == "categorical" and kinds["day"] == "datetime"
    if "data.duplicates=drop" in overrides:
        dropped = json.loads(streamed.schema.read_text())["dropped"]
        assert dropped.get("duplicates", 0) + dropped.get("missing", 0) > 0  # rows were dropped across batches
    for paths in (memory, streamed):
        run_stage("split", load_params(paths.params), paths)
    for name in SPLITS:
        pd.testing.assert_frame_equal(
            pd.read_parquet(memory.split_file(name)), pd.read_parquet(streamed.split_file(name))
        )


def test_the_chunks_are_typed_as_pyarrow_types_the_whole_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference is pyarrow's own read of the whole file: each chunk's inferred type (int64, then double; int64,
    then string; date32, then timestamp; null, then string) gives way to the whole file's, and the values are its."""
    path = tmp_path / "t.csv"
    awkward(2500).to_csv(path, index=False)
    whole = pv.read_csv(path, convert_options=pv.ConvertOptions(null_values=list(sources.NA_VALUES),
                                                                strings_can_be_null=True,
                                                                quoted_strings_can_be_null=True))  # fmt: skip
    monkeypatch.setattr(sources, "CHUNK_BYTES", 4096)
    from trainflow.params import DataParams

    d = DataParams.model_validate({"source": "t.csv", "target": "label", "memory_budget_mb": 0.000001})
    raw = sources.read_source(d, tmp_path, spill=tmp_path / "spill")
    assert isinstance(raw.frame, spill.SpilledFrame)
    parts = raw.frame.parts[0]
    assert len(parts) > 20
    for name in whole.column_names:
        assert raw.frame.arrow(name).type == whole.schema.field(name).type, name
        assert raw.frame.arrow(name).equals(whole.column(name)), name
    firsts = pa.ipc.open_file(parts[0]).schema
    assert firsts.field("late_float").type == pa.int64() and whole.schema.field("late_float").type == pa.float64()
    assert firsts.field("late_values").type == pa.null() and whole.schema.field("late_values").type == pa.string()
    assert firsts.field("day").type == pa.date32() and whole.schema.field("day").type == pa.timestamp("s")


def test_tsv_several_files_and_parquet_sources_stream_to_the_same_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    frame = awkward(1200, seed=3).drop(columns=["notes"])

    def tsv_files(root: Path) -> None:
        (root / "data/raw/t").mkdir()
        frame.iloc[:500].to_csv(root / "data/raw/t/a.tsv", sep="\t", index=False)
        frame.iloc[500:].to_csv(root / "data/raw/t/b.tsv", sep="\t", index=False)

    assert_same_ingest(*ingest_both(tmp_path / "tsv", monkeypatch, tsv_files, "data/raw/t", []))

    def parquet(root: Path) -> None:
        frame.astype({"late_float": float, "late_text": str}).to_parquet(root / "data/raw/t.parquet")

    assert_same_ingest(*ingest_both(tmp_path / "pq", monkeypatch, parquet, "data/raw/t.parquet", []))


def test_a_malformed_row_mid_file_names_its_line_leaves_the_last_ingest_and_the_fix_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_project(tmp_path / "p", {"data.source": "data/raw/t.csv", "data.target": "label",
                                         "data.memory_budget_mb": "0.000001"})  # fmt: skip
    paths = Paths(root)
    csv = root / "data/raw/t.csv"
    awkward(2000).drop(columns=["notes"]).to_csv(csv, index=False)
    monkeypatch.setattr(sources, "CHUNK_BYTES", 4096)
    run_stage("ingest", load_params(paths.params), paths)
    before = {p.name: p.read_bytes() for p in paths.processed.iterdir()}
    lines = csv.read_text().splitlines(keepends=True)
    bad = 1500  # 1-based line number, in a chunk well after the first
    lines[bad - 1] = lines[bad - 1].rstrip("\n") + ",extra\n"
    csv.write_text("".join(lines))
    with pytest.raises(DataError) as error:
        run_stage("ingest", load_params(paths.params), paths)
    assert f"data/raw/t.csv, line {bad}" in str(error.value), error.value
    assert "8 fields" in str(error.value) or "field" in str(error.value)
    assert {p.name: p.read_bytes() for p in paths.processed.iterdir()} == before  # nothing half-written
    assert not list(paths.processed.parent.glob("*.tmp")), "a spill was left behind"
    lines[bad - 1] = lines[bad - 1].replace(",extra", "")  # the fix: the row without the extra field
    csv.write_text("".join(lines))
    run_stage("ingest", load_params(paths.params), paths)
    assert json.loads(paths.schema.read_text())["n_rows"] == 2000


def errors_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write: Callable[[Path], object], chunk_bytes: int
) -> list[str]:
    """The DataError messages of ingesting the csv `write` makes, in memory and streamed (chunks of `chunk_bytes`)."""
    monkeypatch.setattr(sources, "CHUNK_BYTES", chunk_bytes)
    messages = []
    for budget in ("null", "0.000001"):
        root = make_project(tmp_path / budget, {"data.source": "data/raw/t.csv", "data.target": "label",
                                                "data.memory_budget_mb": budget})  # fmt: skip
        write(root / "data/raw/t.csv")
        with pytest.raises(DataError) as error:
            run_stage("ingest", load_params(Paths(root).params), Paths(root))
        messages.append(str(error.value))
    return messages


def test_a_bad_value_mid_file_is_the_same_error_streamed_as_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    frame = awkward(2000).drop(columns=["notes"])
    frame["x"] = frame["x"].astype(object)
    frame.loc[1700, "x"] = "abc"  # one text value in a numeric column, far from the first chunk
    messages = errors_both(tmp_path, monkeypatch, lambda csv: frame.to_csv(csv, index=False), chunk_bytes=4096)
    assert messages[0] == messages[1]
    assert "data/raw/t.csv, line 1702, column 'x': 'abc' is not a number" in messages[1]


def test_a_quote_left_open_near_the_end_is_the_same_error_streamed_as_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The open quote swallows every later line into one value; the chunk that holds it grows to the end of the file,
    and the error names the line where the quote opens, as in memory."""
    lines = ["a,label"] + [f"{i},{'spam' if i % 3 else 'ham'}" for i in range(1500)]
    lines[1480] = '1479,"ham starts here'
    messages = errors_both(tmp_path, monkeypatch, lambda csv: csv.write_text("\n".join(lines) + "\n"), chunk_bytes=1024)
    assert messages[0] == messages[1]
    assert "data/raw/t.csv, line 1481: a quoted value is never closed" in messages[1]


def test_a_streamed_ingest_killed_mid_spill_leaves_the_last_ingest_and_the_rerun_is_whole(tmp_path: Path) -> None:
    """SIGKILL after the 5th chunk of the spill (of about 30): data/processed is the last ingest's, byte for byte; the
    rerun leaves no spill or temp directory and writes the in-memory ingest's table."""
    import os
    import signal
    import subprocess
    import sys

    root = make_project(tmp_path / "p", {"data.source": "data/raw/t.csv", "data.target": "label"})
    paths = Paths(root)
    awkward(2500).to_csv(root / "data/raw/t.csv", index=False)
    run_stage("ingest", load_params(paths.params), paths)  # in memory: the last ingest, and the reference
    before = {p.name: p.read_bytes() for p in paths.processed.iterdir()}
    write_overrides(paths.params, ["data.memory_budget_mb=0.000001"])
    code = ("import sys; import trainflow.data.sources as s; s.CHUNK_BYTES = 4096; from trainflow.cli import main; "
            "sys.exit(main(['stage', 'ingest']))")  # fmt: skip
    env = {**os.environ, "TRAINFLOW_FAILPOINT": "spill-chunk:5"}
    killed = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert "read a column at a time from a spill on disk" in killed.stderr
    assert {p.name: p.read_bytes() for p in paths.processed.iterdir()} == before
    env.pop("TRAINFLOW_FAILPOINT")
    again = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-2000:]
    assert sorted(p.name for p in paths.processed.parent.iterdir()) == ["processed", "raw"]  # no leftovers
    assert sorted(p.name for p in paths.processed.iterdir()) == sorted(before)
    table = pd.read_parquet(paths.table)
    pd.testing.assert_frame_equal(table, pd.read_parquet(pa.BufferReader(before["table.parquet"])), check_exact=True)


def test_a_jsonl_source_over_the_budget_is_read_into_memory_and_says_why(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    root = make_project(tmp_path / "p", {"data.source": "data/raw/t.jsonl", "data.target": "label",
                                         "data.memory_budget_mb": "0.000001"})  # fmt: skip
    awkward(300).drop(columns=["notes"]).to_json(root / "data/raw/t.jsonl", orient="records", lines=True)
    run_stage("ingest", load_params(Paths(root).params), Paths(root))
    err = capfd.readouterr().err
    assert "ingest: read into memory although over data.memory_budget_mb 0 (1 file of" in err
    assert "jsonl is not streamed yet, only csv, tsv, parquet" in err
