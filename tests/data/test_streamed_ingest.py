"""Ingest over data.memory_budget_mb (issue 26): the source is parsed a chunk of records at a time into a spill and
typed a column at a time, and what comes out is the in-memory ingest's: the same processed table (values, dtypes,
Parquet schema and pandas metadata), the same schema.json, the same split after it; the same errors, naming file and
line, with nothing half-written.

The chunks here are a few KiB (sources.CHUNK_BYTES) and the typed columns' batches a few hundred rows
(spill.BATCH_ROWS), so that columns change their inferred type between chunks, quoted line breaks straddle chunk
ends, and the rows dropped fall on batch boundaries."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pv
import pyarrow.parquet as pq
import pytest
from support.projects import make_project

from trainflow.core.errors import DataError
from trainflow.core.paths import SPLITS, Paths
from trainflow.data import sources, spill
from trainflow.data.stream import Split
from trainflow.params import load_params, write_overrides
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
    # each source file's sha256: hashed as the chunks were read when streamed, by hashlib over the file here
    files = json.loads((streamed.processed / "sources.json").read_text())
    assert files == json.loads((memory.processed / "sources.json").read_text())
    for name, entry in files.items():
        assert entry["sha256"] == hashlib.sha256((streamed.root / name).read_bytes()).hexdigest(), name


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
            Split.stored(memory.splits, name).read(), Split.stored(streamed.splits, name).read()
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


def test_integer_and_boolean_columns_missing_only_in_the_first_chunk_key_every_row_as_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row's key hashes its values as the whole frame types them: an integer (or boolean) column with a missing
    value is float64 (or object) there, also in the chunks that have none (int64, bool: other hashes, and so
    another split, before the fix)."""
    n = 2000
    frame = pd.DataFrame({"count": np.arange(n).astype(object), "flag": np.where(np.arange(n) % 3, "true", "false"),
                          "label": np.where(np.arange(n) % 2, "spam", "ham")})  # fmt: skip
    frame.loc[5, ["count", "flag"]] = None  # in the first chunk only
    memory, streamed = ingest_both(
        tmp_path, monkeypatch, lambda root: frame.to_csv(root / "data/raw/t.csv", index=False), "data/raw/t.csv", []
    )
    assert_same_ingest(memory, streamed)
    for paths in (memory, streamed):
        run_stage("split", load_params(paths.params), paths)
    for name in SPLITS:
        pd.testing.assert_frame_equal(
            Split.stored(memory.splits, name).read(), Split.stored(streamed.splits, name).read()
        )


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


def test_a_parquet_column_of_nan_values_streams_to_the_nulls_the_in_memory_ingest_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NaN values (not nulls: pyarrow keeps them apart, pandas does not) in a Parquet source's float and float32
    columns, besides nulls: a linked column is read from the source again and must be searched for them a batch at a
    time. The reference: pyarrow's whole read of the source, a null wherever the value is null or NaN."""
    rng = np.random.default_rng(4)
    n = 1500
    x = rng.normal(0, 1, n)
    x[rng.random(n) < 0.1] = np.nan
    mask = rng.random(n) < 0.05
    source = pa.table({
        "x": pa.array(x, mask=mask),  # NaN values and nulls
        "h": pa.array(np.where(np.arange(n) % 301 == 7, np.nan, rng.normal(0, 1, n)).astype(np.float32)),
        "i": pa.array(rng.integers(0, 9, n)),
        "label": pa.array(rng.choice(["spam", "ham"], n)),
    })  # fmt: skip
    assert pa.compute.sum(pa.compute.is_nan(source.column("x"))).as_py() > 100 and source.column("x").null_count > 10

    def parquet(root: Path) -> None:
        pq.write_table(source, root / "data/raw/t.parquet", row_group_size=256)

    memory, streamed = ingest_both(tmp_path, monkeypatch, parquet, "data/raw/t.parquet", [])
    assert_same_ingest(memory, streamed)
    written = pq.read_table(streamed.table)
    for name in ("x", "h", "i"):
        whole = pq.read_table(memory.root / "data/raw/t.parquet").column(name).cast(pa.float64())
        missing = pa.compute.or_kleene(pa.compute.is_null(whole), pa.compute.is_nan(whole)).fill_null(True)
        assert written.column(name).is_null().equals(missing), name
        assert written.column(name).drop_null().equals(whole.filter(pa.compute.invert(missing))), name


def test_ingest_takes_arrow_buffers_from_jemalloc_where_pyarrow_has_it_and_gives_the_pool_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """spill.arrow_memory: the spilled ingest gives memory back after each column, which mimalloc makes slow; the
    other stages keep the pool they had (jemalloc raised streamed train's peak RSS)."""
    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        pytest.skip("this pyarrow has no jemalloc")
    from trainflow.stages import ingest

    seen = []
    decay = []
    monkeypatch.setattr(
        pa, "jemalloc_set_decay_ms", lambda ms: decay.append((ms, pa.default_memory_pool().backend_name))
    )
    infer = ingest.infer_schema
    monkeypatch.setattr(
        ingest, "infer_schema", lambda *a: seen.append(pa.default_memory_pool().backend_name) or infer(*a)
    )
    before = pa.default_memory_pool()
    pa.set_memory_pool(pa.mimalloc_memory_pool())
    try:
        root = make_project(tmp_path / "p", {"data.source": "data/raw/t.csv", "data.target": "label"})
        awkward(200).to_csv(root / "data/raw/t.csv")
        run_stage("ingest", load_params(Paths(root).params), Paths(root))
        assert seen == ["jemalloc"]
        assert decay == [(0, "mimalloc")]  # freed pages go back at once; set before jemalloc makes its arenas
        assert pa.default_memory_pool().backend_name == "mimalloc"
    finally:
        pa.set_memory_pool(before)


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


def jsonl_lines(n: int, seed: int = 0) -> list[str]:
    """Records whose types a reader of the first chunks gets wrong: integers until a late float, a field missing (or
    null) until the middle, a field first seen in the last rows, NA spellings, blank lines; duplicates; text."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        r: dict[str, object] = {"x": None if rng.random() < 0.05 else round(float(rng.normal()), 6)}
        r["late_float"] = 1.5 if i == n - 37 else int(rng.integers(0, 100))
        if i >= n // 2:
            r["late_values"] = str(rng.choice(["p", "q", "NA"]))  # "NA": missing, as in a csv
        elif i % 3 == 0:
            r["late_values"] = None
        if i >= n - 50:
            r["newcomer"] = int(rng.integers(0, 3))  # pyarrow adds the field; earlier rows are null there
        r["note"] = f'said "hi" {i} é' if i % 7 == 0 else f"n{i}"
        r["label"] = str(rng.choice(["spam", "ham"]))
        lines.append(json.dumps(r, ensure_ascii=False))
        if i % 97 == 0:
            lines.append("")  # a blank line: skipped
    lines[-5:-2] = lines[10:13]  # duplicates of earlier records
    return lines


def write_jsonl(path: Path, lines: list[str], encoding: str = "utf-8") -> None:
    path.write_bytes(("\n".join(lines) + "\n").encode(encoding))


def jsonl_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write: Callable[[Path], object], overrides: list[str],
    streamed_whole: bool = False,
) -> tuple[Paths, Paths]:  # fmt: skip
    """data/raw/t.jsonl as `write` makes it, ingested in memory and streamed in chunks of 4 KiB; `streamed_whole`:
    the streamed ingest may read the file whole (its fallback), else reading it whole fails the test."""
    made = []
    for name, budget in (("memory", "null"), ("streamed", "0.000001")):
        root = make_project(tmp_path / name, {"data.source": "data/raw/t.jsonl", "data.target": "label",
                                               "data.memory_budget_mb": budget})  # fmt: skip
        write(root / "data/raw/t.jsonl")
        write_overrides(Paths(root).params, overrides)
        made.append(Paths(root))
    run_stage("ingest", load_params(made[0].params), made[0])
    with monkeypatch.context() as m:
        m.setattr(sources, "CHUNK_BYTES", 4096)
        m.setattr(spill, "BATCH_ROWS", 300)
        if not streamed_whole:
            m.setattr(sources, "_read_jsonl", lambda *a: pytest.fail("the streamed ingest read a whole jsonl file"))
        run_stage("ingest", load_params(made[1].params), made[1])
    return made[0], made[1]


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_a_streamed_jsonl_ingests_to_the_in_memory_table_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], encoding: str
) -> None:
    lines = jsonl_lines(2500)
    memory, streamed = jsonl_both(tmp_path, monkeypatch, lambda p: write_jsonl(p, lines, encoding),
                                  [f"data.encoding={encoding}", "data.duplicates=drop"])  # fmt: skip
    err = capfd.readouterr().err
    assert "ingest: read a column at a time from a spill on disk" in err and "read whole" not in err
    assert_same_ingest(memory, streamed)
    table = pd.read_parquet(streamed.table)
    assert table["late_float"].dtype == np.float64 and table["newcomer"].isna().sum() == 2500 - 50
    assert table["late_values"].isna().sum() > 2500 // 2 // 3  # the early nulls and the "NA"s
    assert json.loads(streamed.schema.read_text())["dropped"] == {"duplicates": 3}


def test_the_jsonl_chunks_are_typed_as_pyarrow_types_the_whole_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference is pyarrow's own read of the whole file: integers then a float make float64, a field null (or
    absent) in the first chunks takes the later chunks' type, a field seen only at the end is null before."""
    import pyarrow.json as pj

    path = tmp_path / "t.jsonl"
    write_jsonl(path, jsonl_lines(2500))
    whole = pj.read_json(path)
    monkeypatch.setattr(sources, "CHUNK_BYTES", 4096)
    from trainflow.params import DataParams

    d = DataParams.model_validate({"source": "t.jsonl", "target": "label", "memory_budget_mb": 0.000001})
    raw = sources.read_source(d, tmp_path, spill=tmp_path / "spill")
    assert isinstance(raw.frame, spill.SpilledFrame) and len(raw.frame.parts[0]) > 20
    assert raw.frame.columns == whole.column_names
    for name in whole.column_names:
        column = raw.frame.arrow(name)
        if name == "late_values":  # "NA" is missing, as in a csv: pyarrow keeps the text
            whole_values = pa.compute.if_else(pa.compute.equal(whole.column(name), "NA"), None, whole.column(name))
        else:
            whole_values = whole.column(name)
        assert column.type == whole.schema.field(name).type, name
        assert column.equals(whole_values.cast(column.type)), name
    first = pa.ipc.open_file(raw.frame.parts[0][0]).schema
    assert first.field("late_float").type == pa.int64() and first.field("late_values").type == pa.null()


@pytest.mark.parametrize("where", ["in-a-chunk", "between-chunks"])
def test_a_jsonl_column_that_changes_type_is_read_whole_as_in_memory_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], where: str
) -> None:
    """A column's values change type (text, then a number): pyarrow's whole-file read fails and the in-memory reader
    falls back to Python's parser; the streamed one reads that file as it does (the same table) and its note says
    why: within a chunk pyarrow's read of the chunk fails, between chunks the chunks' types disagree."""
    lines = jsonl_lines(1500)
    if where == "in-a-chunk":
        lines[1400] = json.dumps(json.loads(lines[1400]) | {"note": 12345})
        why = "a column's values change type"
    else:  # "code": text in the first rows, numbers in the last ones, absent between: each chunk has one type
        for k in [k for k in [*range(20), *range(1480, 1500)] if lines[k]]:
            lines[k] = json.dumps(json.loads(lines[k]) | {"code": f"c{k}" if k < 20 else k})
        why = "column 'code' changes type"
    memory, streamed = jsonl_both(tmp_path, monkeypatch, lambda p: write_jsonl(p, lines), [], streamed_whole=True)
    err = capfd.readouterr().err
    assert f"data/raw/t.jsonl: read whole into memory although over data.memory_budget_mb: {why} " in err
    assert_same_ingest(memory, streamed)
    column = "note" if where == "in-a-chunk" else "code"
    assert {"12345", "1499"} & set(pd.read_parquet(streamed.table)[column])  # text, as Python's parser has it


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ('{"x": 1, "label": "spam"', "line 1801: not valid JSON (Expecting ',' delimiter at character 25)"),
        ("[1, 2]", "line 1801: expected one JSON object per line, found a list"),
    ],
    ids=["broken", "not-an-object"],
)
def test_a_malformed_jsonl_line_mid_file_is_the_same_error_streamed_as_in_memory_and_the_fix_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: str, message: str
) -> None:
    lines = [json.dumps({"x": i, "label": "spam" if i % 3 else "ham"}) for i in range(2000)]
    lines[1800] = bad  # line 1801, in a chunk well after the first
    messages = []
    monkeypatch.setattr(sources, "CHUNK_BYTES", 4096)
    for budget in ("null", "0.000001"):
        root = make_project(tmp_path / budget, {"data.source": "data/raw/t.jsonl", "data.target": "label",
                                                "data.memory_budget_mb": budget})  # fmt: skip
        paths = Paths(root)
        write_jsonl(root / "data/raw/t.jsonl", lines[:100])
        run_stage("ingest", load_params(paths.params), paths)  # the last ingest
        before = {p.name: p.read_bytes() for p in paths.processed.iterdir()}
        write_jsonl(root / "data/raw/t.jsonl", lines)
        with pytest.raises(DataError) as error:
            run_stage("ingest", load_params(paths.params), paths)
        messages.append(str(error.value))
        assert {p.name: p.read_bytes() for p in paths.processed.iterdir()} == before  # nothing half-written
        assert not list(paths.processed.parent.glob("*.tmp"))
    tail = "; each line must hold one JSON object" if "valid JSON" in message else ""
    assert messages[0] == messages[1] == f"data.source: data/raw/t.jsonl, {message}{tail}", messages
    lines[1800] = json.dumps({"x": 1800, "label": "ham"})  # the fix: one object on the line
    write_jsonl(root / "data/raw/t.jsonl", lines)
    run_stage("ingest", load_params(paths.params), paths)
    assert json.loads(paths.schema.read_text())["n_rows"] == 2000


@pytest.mark.parametrize("case", ["empty", "blank-lines", "bad-byte"])
def test_an_empty_or_undecodable_jsonl_is_the_same_error_streamed_as_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    good = ("\n".join(json.dumps({"x": i, "label": "a" if i % 2 else "b"}) for i in range(600)) + "\n").encode()
    content = {"empty": b"", "blank-lines": b"\n\n  \n", "bad-byte": good[:9000] + b"\xff" + good[9000:]}[case]
    monkeypatch.setattr(sources, "CHUNK_BYTES", 4096)
    messages = []
    for budget in ("null", "0.000001"):
        root = make_project(tmp_path / budget, {"data.source": "data/raw/t.jsonl", "data.target": "label",
                                                "data.memory_budget_mb": budget})  # fmt: skip
        (root / "data/raw/t.jsonl").write_bytes(content)
        with pytest.raises(DataError) as error:
            run_stage("ingest", load_params(Paths(root).params), Paths(root))
        messages.append(str(error.value))
    assert messages[0] == messages[1], messages
    if case == "bad-byte":
        line = good[:9000].count(b"\n") + 1
        assert messages[1].startswith(f"data.source: data/raw/t.jsonl, line {line}: byte 0xff is not valid utf-8")
    elif case == "empty":
        assert messages[1] == "data.source: data/raw/t.jsonl is empty: no rows"
    else:
        assert messages[1] == "data.source: data/raw/t.jsonl has no rows; fill it, or remove it from data.source"


def test_a_jsonl_source_in_utf16_over_the_budget_is_read_into_memory_and_says_why(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    root = make_project(tmp_path / "p", {"data.source": "data/raw/t.jsonl", "data.target": "label",
                                         "data.memory_budget_mb": "0.000001", "data.encoding": "utf-16"})  # fmt: skip
    write_jsonl(root / "data/raw/t.jsonl", jsonl_lines(300), "utf-16")
    run_stage("ingest", load_params(Paths(root).params), Paths(root))
    err = capfd.readouterr().err
    assert "ingest: read into memory although over data.memory_budget_mb 0 (1 file of" in err
    assert "jsonl in utf-16 is not streamed (its line breaks are not the byte \\n)" in err


# --- the header checks, in memory and streamed alike ---------------------------------------------------------


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
