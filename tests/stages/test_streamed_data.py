"""A train split over data.memory_budget_mb is streamed (issue 26, the train stage's tables): the preprocessing fitted
column by column equals the in-memory fit, batches gathered from the memory-mapped matrix are TensorData's, and the
trained weights are the in-memory run's, bit for bit, also when a streamed run is resumed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from support.files import digest
from support.projects import make_project
from support.stages import training

from trainflow.artifacts.predict import model_inputs
from trainflow.core.io import read_json
from trainflow.core.paths import SPLITS, Paths
from trainflow.data import stream
from trainflow.data.preprocess import Preprocessor
from trainflow.data.schema import ROW_KEY, Schema
from trainflow.data.stream import Split
from trainflow.engine.loaders import MemmapData, TensorData
from trainflow.params import load_params, with_values, write_overrides
from trainflow.stages import run_stage


def table(n: int = 400, seed: int = 0) -> pd.DataFrame:
    """Regression rows with what the fit must get right: missing numbers (median fill), categories (counts), a
    boolean, a datetime, a rare category."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, n)
    frame = pd.DataFrame(
        {
            "x": np.where(rng.random(n) < 0.1, np.nan, x),
            "w": rng.exponential(2.0, n),
            "colour": rng.choice(["red", "green", "blue", "rare"], n, p=[0.45, 0.3, 0.24, 0.01]),
            "flag": rng.random(n) < 0.3,
            "when": pd.Timestamp("2026-01-01") + pd.to_timedelta(rng.integers(0, 300, n), unit="D"),
        }
    )
    frame["y"] = 3 * x + frame["w"] + (frame["colour"] == "red") * 2 + rng.normal(0, 0.1, n)
    return frame


@pytest.fixture
def project(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """Ingested and split, the split streamed (the table linked into data/splits and each row's split in rows.npy)
    unless the test is parametrized with split "memory" (a file per split); the budget is the default afterwards."""
    params = {"data.source": "data/raw/t.csv", "data.target": "y", "register.model_name": "t", "train.epochs": 3,
              "train.batch_size": 16, "train.progress": "false", "train.checkpoint_every": 10,
              "train.keep_last": 9}  # fmt: skip
    root = make_project(tmp_path / "proj", params)
    table().to_csv(root / "data/raw/t.csv", index=False)
    paths = Paths(root)
    run_stage("ingest", load_params(paths.params), paths)
    split = getattr(request, "param", "streamed")
    write_overrides(paths.params, [f"data.memory_budget_mb={'0.000001' if split == 'streamed' else 'null'}"])
    run_stage("split", load_params(paths.params), paths)
    write_overrides(paths.params, ["data.memory_budget_mb=null"])
    assert paths.split_file("train").is_file() == (split == "memory")
    return root


def read_split(paths: Paths, name: str) -> pd.DataFrame:
    """The split as the split stage stored it, read without stream.Split: its file, or its rows of the table."""
    if paths.split_file(name).is_file():
        return pd.read_parquet(paths.split_file(name))
    rows = np.load(paths.splits / "rows.npy")
    whole = pd.read_parquet(paths.splits / "table.parquet").drop(columns=[ROW_KEY])
    return whole[rows == SPLITS.index(name)].reset_index(drop=True)


both_splits = pytest.mark.parametrize("project", ["streamed", "memory"], indirect=True)


def train(root: Path, *overrides: str) -> str:
    paths = Paths(root)
    write_overrides(paths.params, list(overrides))
    run_stage("train", load_params(paths.params), paths)
    return digest(paths.final / "model.safetensors")


@both_splits
def test_the_column_by_column_fit_and_the_streamed_matrix_are_the_in_memory_ones(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = Paths(project)
    schema = Schema.read(paths.split_schema)
    params = load_params(paths.params)
    frame = read_split(paths, "train")  # the in-memory path's frame, read independently
    in_memory = Preprocessor.fit(frame, schema, params.features)
    by_column = Preprocessor.fit(stream.ParquetColumns(Split.stored(paths.splits, "train")), schema, params.features)  # type: ignore[arg-type]
    assert json.dumps(by_column.to_json(), sort_keys=True) == json.dumps(in_memory.to_json(), sort_keys=True)
    assert any(c.kind == "categorical" for c in in_memory.columns) and any(c.indicator for c in in_memory.columns)

    monkeypatch.setattr(stream, "BLOCK_BYTES", 4 * in_memory.width * 37)  # blocks of 37 rows: the last one partial
    x, y = stream.write_matrix(in_memory, Split.stored(paths.splits, "train"), tmp_path / "m", "train")
    held = model_inputs(in_memory, frame, "train", with_labels=True)
    assert isinstance(held, TensorData) and len(frame) % 37 != 0
    assert np.array_equal(x, held.x.numpy()) and np.array_equal(y, held.y.numpy())
    # train and val together (what the train stage writes): each as alone, the linked table read once for both
    reads: list[int] = []
    real = pq.ParquetFile.iter_batches

    def counted(self: pq.ParquetFile, *args: Any, **kwargs: Any) -> Any:
        reads.append(self.metadata.num_rows)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counted)
    splits = [Split.stored(paths.splits, "train"), Split.stored(paths.splits, "val")]
    both = stream.write_matrices(in_memory, splits, [tmp_path / "t", tmp_path / "v"], ["train", "val"])
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", real)
    assert len(reads) == (1 if splits[0].path == splits[1].path else 2)
    assert np.array_equal(both[0][0], x) and np.array_equal(both[0][1], y)
    val = model_inputs(in_memory, read_split(paths, "val"), "val", with_labels=True)
    assert isinstance(val, TensorData) and len(val.y) > 0
    assert np.array_equal(both[1][0], val.x.numpy()) and np.array_equal(both[1][1], val.y.numpy())
    streamed = MemmapData(x, y)
    idx = torch.randperm(len(frame), generator=torch.Generator().manual_seed(0))[:50]
    for got, want in (
        (streamed.batch(idx), held.batch(idx)),
        (streamed.subset(idx).batch(idx[:0]), held.batch(idx[:0])),
    ):
        assert torch.equal(got.inputs["x"], want.inputs["x"]) and torch.equal(got.target, want.target)
        assert got.count == want.count


@both_splits
def test_a_streamed_train_stage_trains_the_in_memory_weights_and_resumes_to_them(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """train.shuffle auto is blocks for a streamed table: held in memory with blocks set, the same weights; and
    streamed with rows set, the weights of the in-memory default (rows)."""
    paths = Paths(project)
    in_memory = train(project, "train.shuffle=blocks")
    err = capsys.readouterr().err
    assert "train: data held in memory" in err and "sample order: blocks" in err
    assert "train: model.name auto: mlp (a table of features: a multilayer perceptron)" in err  # what auto chose
    exported = {p.name: digest(p) for p in paths.final.iterdir()}
    shutil.rmtree(paths.checkpoints)  # train afresh, streamed

    streamed = train(project, "data.memory_budget_mb=0.001", "train.shuffle=auto")
    err = capsys.readouterr().err
    assert "train: data streamed from disk (train + val:" in err and "sample order: blocks" in err
    assert streamed == in_memory
    assert {p.name: digest(p) for p in paths.final.iterdir()} == exported  # preprocess.json, training.json too
    assert not (paths.checkpoints.parent / ".streamed").exists() or not any(
        (paths.checkpoints.parent / ".streamed").iterdir()
    )  # the memory-mapped files go with the run

    # Resumed from a checkpoint in the middle (the later ones removed), still streamed: the same weights.
    steps = sorted(p for p in paths.checkpoints.iterdir() if p.name.startswith("step-"))
    assert len(steps) > 2
    for later in steps[len(steps) // 2 :]:
        shutil.rmtree(later)
    (paths.checkpoints / "best.json").unlink(missing_ok=True)
    assert train(project) == in_memory
    assert "resumed from" in capsys.readouterr().err

    # auto held in memory is rows: the blocks run's checkpoints beside it are not resumed (the order resolved is in
    # the fingerprint), and a streamed run with rows set trains its weights
    in_memory_rows = train(project, "data.memory_budget_mb=null")
    err = capsys.readouterr().err
    assert "train: data held in memory" in err and "sample order: rows" in err and "resumed from" not in err
    assert in_memory_rows != in_memory
    shutil.rmtree(paths.checkpoints)
    assert train(project, "data.memory_budget_mb=0.001", "train.shuffle=rows") == in_memory_rows
    assert "sample order: rows" in capsys.readouterr().err


def test_train_shuffle_blocks_is_for_tables_and_auto_the_fix_it_suggests_resolves_to_rows() -> None:
    from trainflow.core.errors import ParamsError
    from trainflow.stages.train import sample_order

    text = Schema(source="t", target="y", task="regression", features=[], kinds={}, classes=[], n_rows=3,
                  text_column="review")  # fmt: skip
    with pytest.raises(ParamsError) as exc:
        sample_order("blocks", text, streamed=False)
    assert "train.shuffle" in str(exc.value) and "blocks orders the rows of a table, not text" in str(exc.value)
    assert "set it to auto or rows" in str(exc.value)
    assert [sample_order(s, text, streamed) for s in ("auto", "rows") for streamed in (False, True)] == ["rows"] * 4
    table = Schema(source="t", target="y", task="regression", features=["x"], kinds={"x": "numeric"}, classes=[],
                   n_rows=3)  # fmt: skip
    assert [sample_order("auto", table, streamed) for streamed in (False, True)] == ["rows", "blocks"]
    assert [sample_order(s, table, True) for s in ("rows", "blocks")] == ["rows", "blocks"]


@pytest.mark.slow  # three trainings and a kill (~25 s); line 2 has the streamed resume (..._trains_the_in_memory_...)
def test_a_streamed_training_sigkilled_mid_epoch_resumes_to_the_uninterrupted_weights(project: Path) -> None:
    """`trainflow stage train` streamed (a tiny data.memory_budget_mb), SIGKILLed in the middle of an epoch, inside
    its second checkpoint write, then run again: it resumes from the first, mid-epoch, and ends with the weights of
    one uninterrupted in-memory run."""
    failpoint = "checkpoint_write:2"
    import os
    import signal
    import subprocess
    import sys

    paths = Paths(project)
    in_memory = train(project, "train.shuffle=blocks")  # streamed, auto is blocks
    shutil.rmtree(paths.checkpoints)
    shutil.rmtree(paths.final)
    write_overrides(paths.params, ["data.memory_budget_mb=0.001", "train.shuffle=auto"])
    trainflow = Path(sys.executable).parent / "trainflow"
    env = {**os.environ, "TRAINFLOW_FAILPOINT": failpoint, "OMP_NUM_THREADS": "1"}
    killed = subprocess.run([str(trainflow), "stage", "train"], cwd=project, env=env, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert "train: data streamed from disk" in killed.stderr
    assert not paths.final.exists()
    env.pop("TRAINFLOW_FAILPOINT")
    resumed = subprocess.run([str(trainflow), "stage", "train"], cwd=project, env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "at update 10 (epoch 0, sample 160 of its order)" in resumed.stderr, resumed.stderr  # mid-epoch
    assert digest(paths.final / "model.safetensors") == in_memory


@both_splits
def test_a_streamed_evaluate_writes_the_in_memory_metrics_and_plots(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test split scored a block of whole batches at a time (blocks of 3 batches of 8 rows): the model's
    metrics exactly, per_class.csv and every plot CSV byte for byte as scored whole. (The baselines are fitted on
    tables held in memory only: a streamed evaluate says so and writes none.)"""
    from trainflow.baselines import split_metrics

    paths = Paths(project)
    train(project, "evaluate.batch_size=8")
    run_stage("evaluate", load_params(paths.params), paths)
    assert "test data" not in capsys.readouterr().err  # held in memory: the default budget
    outputs = [paths.per_class, *sorted(paths.test_plots.glob("*.csv"))]
    whole = {p.name: digest(p) for p in outputs}
    own, fitted = split_metrics(read_json(paths.metrics))
    assert set(fitted) == {"linear", "boosting"}
    monkeypatch.setattr(stream, "BLOCK_BYTES", 4 * pre_width(paths) * 24)
    write_overrides(paths.params, ["data.memory_budget_mb=0.001"])
    run_stage("evaluate", load_params(paths.params), paths)
    err = capsys.readouterr().err
    assert "evaluate: test data streamed from disk (test:" in err and "evaluate: no baselines: the table is" in err
    assert len(read_split(paths, "test")) > 24  # several blocks, the last one partial
    assert {p.name: digest(p) for p in outputs} == whole
    assert read_json(paths.metrics) == own


def pre_width(paths: Paths) -> int:
    return Preprocessor.load(paths.final).width


def test_the_streamed_files_live_as_long_as_the_training_even_when_building_it_fails(
    project: Path, tmp_path: Path
) -> None:
    """The memory-mapped matrix is as big as the data: a sweep trial (its own checkpoint folder) discards it like the
    train stage, and a setup that fails after writing it (a param the model refuses) leaves none behind."""
    from trainflow.engine.distributed import Group
    from trainflow.stages.train import setup

    paths = Paths(project)
    params = with_values(load_params(paths.params), {"data.memory_budget_mb": 0.001}, "test")
    trial = tmp_path / "tune" / "trial_0003"
    built = setup(training(params), paths, torch.device("cpu"), Group(), trial / "checkpoints")
    scratch = trial / ".streamed" / "rank0"
    assert isinstance(built.train, MemmapData) and built.scratch == scratch
    assert sorted(p.name for p in scratch.rglob("*.npy")) == ["x.npy", "x.npy", "y.npy", "y.npy"]  # train, val
    built.discard()
    assert not scratch.exists()

    refused = with_values(params, {"train.activation_checkpointing": True}, "test")  # an mlp cannot recompute
    with pytest.raises(Exception, match="activation_checkpointing"):
        setup(training(refused), paths, torch.device("cpu"), Group(), trial / "checkpoints")
    assert not scratch.exists()


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".parquet"])
def test_predict_streams_a_parquet_input_over_the_budget_to_the_in_memory_output(
    project: Path, tmp_path: Path, suffix: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`trainflow predict` on a Parquet table over --memory-budget-mb: blocks of whole batches (several here), each
    scored and appended; the file written is the in-memory path's (csv, tsv, jsonl: byte for byte)."""
    from trainflow.artifacts.batch_predict import predict_file

    paths = Paths(project)
    run_stage("train", load_params(paths.params), paths)
    rows = table(n=300, seed=3).drop(columns=["y"])
    rows.index = pd.Index(np.arange(300) * 7)  # an unnamed pandas index: row labels, dropped as read_source drops it
    rows.to_parquet(tmp_path / "in.parquet")
    held = predict_file(str(paths.final), tmp_path / "in.parquet", tmp_path / f"held{suffix}", batch_size=16)
    assert "streamed" not in capsys.readouterr().err
    monkeypatch.setattr(stream, "BLOCK_BYTES", 16 * 4 * 40)  # a block of 40 rows, rounded to whole batches of 16
    streamed = predict_file(str(paths.final), tmp_path / "in.parquet", tmp_path / f"streamed{suffix}", 16, 0.0001)
    assert "streamed a block at a time" in capsys.readouterr().err
    assert held["rows"] == streamed["rows"] == 300
    if suffix == ".parquet":
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "held.parquet"),
                                      pd.read_parquet(tmp_path / "streamed.parquet"))  # fmt: skip
    else:
        assert (tmp_path / f"held{suffix}").read_bytes() == (tmp_path / f"streamed{suffix}").read_bytes()
    assert not list(tmp_path.glob(".*tmp*"))  # nothing half-written left beside it


def test_a_streamed_predict_refuses_an_input_with_prediction_columns_and_writes_nothing(
    project: Path, tmp_path: Path
) -> None:
    from trainflow.artifacts.batch_predict import predict_file
    from trainflow.core.errors import UserError

    paths = Paths(project)
    run_stage("train", load_params(paths.params), paths)
    table(n=50).assign(prediction=1.0).to_parquet(tmp_path / "in.parquet")
    with pytest.raises(UserError) as exc:
        predict_file(str(paths.final), tmp_path / "in.parquet", tmp_path / "out.csv", 16, 0.0001)
    assert str(exc.value) == (
        f"--input {tmp_path / 'in.parquet'}: already has prediction column(s) ['prediction']; drop or rename them first"
    )
    assert not (tmp_path / "out.csv").exists()


def test_a_streamed_classification_split_has_the_in_memory_integer_labels(tmp_path: Path) -> None:
    """Classification targets are class indices (int64), as the cross-entropy loss takes them, streamed or not."""
    from trainflow.params import FeatureParams

    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {"x": rng.normal(0, 1, 90), "colour": rng.choice(["red", "blue"], 90), "y": rng.choice(["a", "b", "c"], 90)}
    )
    frame.to_parquet(tmp_path / "train.parquet", index=False)
    schema = Schema(source="t", target="y", task="classification", features=["x", "colour"],
                    kinds={"x": "numeric", "colour": "categorical"}, classes=["a", "b", "c"], n_rows=90)  # fmt: skip
    pre = Preprocessor.fit(frame, schema, FeatureParams())
    x, y = stream.write_matrix(pre, tmp_path / "train.parquet", tmp_path / "m", "train")
    held = model_inputs(pre, frame, "train", with_labels=True)
    assert isinstance(held, TensorData)
    assert y.dtype == np.int64 and np.array_equal(y, pd.Categorical(frame["y"], categories=schema.classes).codes)
    assert np.array_equal(x, held.x.numpy()) and np.array_equal(y, held.y.numpy())
    idx = torch.arange(10)
    got, want = MemmapData(x, y).batch(idx), held.batch(idx)
    assert got.target.dtype == want.target.dtype == torch.int64 and torch.equal(got.target, want.target)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the process's RSS from /proc")
def test_writing_the_streamed_matrix_keeps_its_pages_out_of_the_process(tmp_path: Path) -> None:
    """The preprocessed matrix (here 64 MiB) is written with plain writes: written through a memory map, every page
    would stay mapped into the process (RssFile up by the file's size) until the map is closed."""
    from trainflow.params import FeatureParams

    def rss_file_mib() -> float:
        line = next(s for s in Path("/proc/self/status").read_text().splitlines() if s.startswith("RssFile"))
        return int(line.split()[1]) / 1024

    rng = np.random.default_rng(0)
    n, width = 1 << 16, 256
    frame = pd.DataFrame(
        {f"f{i}": rng.normal(0, 1, n).astype(np.float32) for i in range(width)} | {"y": rng.normal(0, 1, n)}
    )
    frame.to_parquet(tmp_path / "train.parquet", index=False)
    schema = Schema(source="t", target="y", task="regression", features=[f"f{i}" for i in range(width)],
                    kinds={f"f{i}": "numeric" for i in range(width)}, classes=[], n_rows=n)  # fmt: skip
    pre = Preprocessor.fit(frame, schema, FeatureParams())
    before, seen = rss_file_mib(), []
    features = pre.features

    def measured(*args: object) -> np.ndarray:  # RssFile while the blocks are written
        seen.append(rss_file_mib())
        return features(*args)  # type: ignore[arg-type]

    pre.features = measured  # type: ignore[method-assign]
    x, y = stream.write_matrix(pre, tmp_path / "train.parquet", tmp_path / "m", "train")
    assert len(seen) >= 4 and max(seen) - before < 16, (before, seen)
    assert x.shape == (n, width) and np.array_equal(
        x[-3:], model_inputs(pre, frame.tail(3), "train", with_labels=True).x.numpy()
    )
