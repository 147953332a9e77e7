"""A folder of images over data.memory_budget_mb (issue 26): ingest spills the images as it reads and checks them,
the typed table and the splits are written a bounded block of images at a time, the train stage fits the image
statistics a block at a time and trains from one file of the encoded images read by offset, evaluate scores a block
at a time. What comes out is the in-memory path's: the same processed table and splits, the same preprocessing, the
same weights bit for bit (also through augmentation and a SIGKILL), the same metrics. Nowhere is the column of
images read whole."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from support.files import digest
from support.projects import make_project
from support.stages import training

from trainflow.core.errors import DataError
from trainflow.core.paths import SPLITS, Paths
from trainflow.data import sources, spill, stream
from trainflow.data.preprocess import Preprocessor
from trainflow.data.schema import Schema
from trainflow.data.stream import Split
from trainflow.engine.loaders import RecordFile
from trainflow.params import FeatureParams, load_params, write_overrides
from trainflow.stages import run_stage

TINY = "0.000001"  # data.memory_budget_mb: everything streams


def images(folder: Path, n: int = 240, size: int = 12, seed: int = 0) -> None:
    """<folder>/<class>/<i>.png: three classes told apart by their brightness, under noise; RGB."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        label = "abc"[i % 3]
        pixels = np.clip(rng.normal(70 + 60 * (i % 3), 45, (size, size, 3)), 0, 255).astype(np.uint8)
        (folder / label).mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(folder / label / f"{i:04d}.png")


def project(tmp_path: Path, name: str, budget: str, *overrides: str) -> Paths:
    params = {"data.source": "data/raw/imgs", "data.memory_budget_mb": budget, "model.name": "cnn",
              "register.model_name": "imgs", "train.epochs": 2, "train.batch_size": 16, "train.progress": "false",
              "train.checkpoint_every": 6, "train.keep_last": 9}  # fmt: skip
    root = make_project(tmp_path / name, params)
    images(root / "data/raw/imgs")
    paths = Paths(root)
    write_overrides(paths.params, list(overrides))
    return paths


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of about 25 images at ingest and blocks of about 10 at the later stages (a 12x12 PNG is ~500 bytes)."""
    monkeypatch.setattr(sources, "IMAGE_CHUNK_BYTES", 12_000)
    monkeypatch.setattr(stream, "BLOCK_BYTES", 5_000)


def whole(paths: Paths, name: str) -> pd.DataFrame:
    """The split as Split.read reads it, past never_whole's guard (a block of rows at a time)."""
    split = Split.stored(paths.splits, name)
    return split.read_columns(split.columns)


@pytest.fixture
def never_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail a test that reads the column of images whole anywhere: the raw spill's, the typed spill's, a split's."""

    def guard(original, column_of):  # type: ignore[no-untyped-def]
        def read(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            if column_of(*args) == "image":
                pytest.fail("the column of images was read whole")
            return original(self, *args, **kwargs)

        return read

    monkeypatch.setattr(spill.SpilledFrame, "arrow", guard(spill.SpilledFrame.arrow, lambda name: name))
    monkeypatch.setattr(spill.ColumnSpill, "series", guard(spill.ColumnSpill.series, lambda name: name))
    monkeypatch.setattr(stream.ParquetColumns, "__getitem__", guard(stream.ParquetColumns.__getitem__, lambda n: n))
    monkeypatch.setattr(stream.Split, "read", lambda *a: pytest.fail("a split was read whole"))


@pytest.mark.parametrize("duplicates", ["keep", "drop"])  # drop: with data.missing drop too (no image is missing)
def test_a_streamed_folder_of_images_ingests_and_splits_to_the_in_memory_table(
    tmp_path: Path, small_blocks: None, never_whole: None, capfd: pytest.CaptureFixture[str], duplicates: str
) -> None:
    made = []
    for name, budget in (("memory", "null"), ("streamed", TINY)):
        paths = project(
            tmp_path,
            name,
            budget,
            f"data.duplicates={duplicates}",
            f"data.missing={'impute' if duplicates == 'keep' else 'drop'}",
        )
        for copy in ("a/0000.png", "b/0001.png"):  # duplicates of earlier images (the same class), in other chunks
            imgs = paths.root / "data/raw/imgs"
            shutil.copy(imgs / copy, imgs / copy.replace("/", "/z"))
        for stage in ("ingest", "split"):
            run_stage(stage, load_params(paths.params), paths)
        made.append(paths)
    memory, streamed = made
    err = capfd.readouterr().err
    assert "ingest: read into memory (242 images of" in err
    assert "ingest: read into chunks of about 0 MiB on disk as they are checked (242 images of" in err
    a, b = pd.read_parquet(memory.table), pd.read_parquet(streamed.table)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert pq.read_schema(memory.table).equals(pq.read_schema(streamed.table), check_metadata=True)
    assert json.loads(memory.schema.read_text()) == json.loads(streamed.schema.read_text())
    assert json.loads(streamed.schema.read_text())["dropped"] == (
        {"duplicates": 2, "missing": 0} if duplicates == "drop" else {}
    )
    # the images' bytes as the files hold them, and the row groups bounded: about 25 images each
    files = sorted((streamed.root / "data/raw/imgs").rglob("*.png"))
    by_path = dict(zip(b["image_path"], b["image"]))
    assert all(by_path[f.relative_to(streamed.root).as_posix()] == f.read_bytes() for f in files
               if duplicates == "keep" or f.name[0] != "z")  # fmt: skip
    groups = pq.ParquetFile(streamed.table).metadata
    assert groups.num_row_groups >= 8 and max(groups.row_group(i).num_rows for i in range(8)) < 40
    for name in SPLITS:
        pd.testing.assert_frame_equal(whole(memory, name), whole(streamed, name), check_exact=True)


def test_a_duplicate_image_is_the_same_error_streamed(tmp_path: Path, small_blocks: None, never_whole: None) -> None:
    messages = []
    for name, budget in (("memory", "null"), ("streamed", TINY)):
        paths = project(tmp_path, name, budget, "data.duplicates=error")
        shutil.copy(paths.root / "data/raw/imgs/a/0003.png", paths.root / "data/raw/imgs/a/copy.png")
        with pytest.raises(DataError) as exc:
            run_stage("ingest", load_params(paths.params), paths)
        # the project's own folder, and the address of the bytes PIL was given, aside
        messages.append(re.sub(r"0x[0-9a-f]+", "0x", str(exc.value).replace(str(paths.root), "<root>")))
        assert not paths.processed.exists()  # nothing half-written, the spill gone with it
    assert messages[0] == messages[1]
    assert "data/raw/imgs/a/copy.png: the row duplicates data/raw/imgs/a/0003.png" in messages[1]


def test_a_streamed_image_run_trains_the_in_memory_weights_and_scores_the_same(
    tmp_path: Path, small_blocks: None, capfd: pytest.CaptureFixture[str]
) -> None:
    """ingest -> split -> train -> evaluate, augmented (shifts, flips, rotations draw per sample and epoch): the
    preprocessing, every exported file and every test output are the in-memory run's, byte for byte."""
    augment = ["features.augment.shift=2", "features.augment.flip=true", "features.augment.rotate=10"]
    made = []
    for name, budget in (("memory", "null"), ("streamed", TINY)):
        paths = project(tmp_path, name, budget, *augment)
        for stage in ("ingest", "split", "train", "evaluate"):
            run_stage(stage, load_params(paths.params), paths)
        made.append(paths)
    memory, streamed = made
    err = capfd.readouterr().err
    assert "train: data streamed from disk (train + val:" in err and "evaluate: test data streamed from disk" in err
    assert sorted(p.name for p in streamed.final.iterdir()) == sorted(p.name for p in memory.final.iterdir())
    for p in memory.final.iterdir():
        if p.is_file() and p.name != "training.json":  # training.json holds the run's own times and ids
            assert digest(p) == digest(streamed.final / p.name), p.name
    outputs = [memory.metrics, memory.per_class, *sorted(memory.test_plots.glob("*.csv"))]
    for p in outputs:
        assert p.read_bytes() == (streamed.root / p.relative_to(memory.root)).read_bytes(), p.name
    metrics = json.loads(streamed.metrics.read_text())
    assert metrics["n_test"] == 36 and metrics["accuracy"] > 0.6  # learnt: the classes differ in brightness
    assert not any((streamed.checkpoints.parent / ".streamed").rglob("images.bin"))  # gone with the run


def test_the_streamed_train_setup_never_reads_the_images_whole(
    tmp_path: Path, small_blocks: None, never_whole: None
) -> None:
    from trainflow.engine.distributed import Group
    from trainflow.engine.loaders import ImageData
    from trainflow.stages.train import setup

    paths = project(tmp_path, "streamed", TINY)
    for stage in ("ingest", "split"):
        run_stage(stage, load_params(paths.params), paths)
    built = setup(training(load_params(paths.params)), paths, torch.device("cpu"), Group(), paths.checkpoints)
    assert isinstance(built.train, ImageData) and not built.train.decoded
    train = whole(paths, "train")
    stored = (built.scratch / "train" / "images.bin").read_bytes()  # type: ignore[operator]
    assert stored == b"".join(train["image"])  # the encoded images, back to back, in the split's order
    rows = [5, 0, 77, 5]
    got = built.train.batch(torch.tensor(rows))
    pixels = np.stack([np.asarray(Image.open(io.BytesIO(train["image"][i]))).transpose(2, 0, 1) for i in rows])
    mean = torch.tensor(built.pre.image_mean)[None, :, None, None]
    std = torch.tensor(built.pre.image_std)[None, :, None, None]
    assert torch.equal(got.inputs["images"], (torch.from_numpy(pixels).float() - mean) / std)
    assert got.target.tolist() == [built.pre.classes.index(train["target"][i]) for i in rows]
    built.discard()


@pytest.mark.slow  # 21 s of subprocesses; the default tier's SIGKILL of a streamed table is in test_streamed_data.py
def test_a_streamed_image_training_sigkilled_mid_epoch_resumes_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    """`trainflow stage train` streamed, SIGKILLed inside its second checkpoint write (mid-epoch), run again: the
    weights of one uninterrupted in-memory run (in a process like theirs: a convolution's sums depend on the
    threads)."""
    paths = project(tmp_path, "p", "null")
    for stage in ("ingest", "split"):
        run_stage(stage, load_params(paths.params), paths)
    trainflow = Path(sys.executable).parent / "trainflow"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = [str(trainflow), "stage", "train"]
    whole = subprocess.run(run, cwd=paths.root, env=env, capture_output=True, text=True)
    assert whole.returncode == 0 and "train: data held in memory" in whole.stderr, whole.stderr
    in_memory = digest(paths.final / "model.safetensors")
    shutil.rmtree(paths.checkpoints)
    shutil.rmtree(paths.final)
    write_overrides(paths.params, [f"data.memory_budget_mb={TINY}"])
    env["TRAINFLOW_FAILPOINT"] = "checkpoint_write:2"
    killed = subprocess.run(run, cwd=paths.root, env=env, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert "train: data streamed from disk" in killed.stderr and not paths.final.exists()
    env.pop("TRAINFLOW_FAILPOINT")
    resumed = subprocess.run(run, cwd=paths.root, env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "at update 6 (epoch 0, sample 96 of its order)" in resumed.stderr, resumed.stderr  # mid-epoch
    assert digest(paths.final / "model.safetensors") == in_memory


def png_bytes(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_the_image_fit_a_block_at_a_time_is_the_whole_fit_and_names_the_same_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Statistics summed image by image in the same order, block or not (the reference: numpy over every pixel);
    an image of another size named by its global row, where the table has no paths, in blocks of 7 rows."""
    rng = np.random.default_rng(1)
    pixels = [rng.integers(0, 256, (6, 5, 3)) for _ in range(40)]
    frame = pd.DataFrame({"image": [png_bytes(p) for p in pixels], "y": ["u", "v"] * 20})
    path = tmp_path / "train.parquet"
    frame.to_parquet(path, index=False, row_group_size=7)
    monkeypatch.setattr(stream, "BLOCK_BYTES", int(stream.table_mb(path) * 2**20 / 40 * 7.5))  # 7 rows a block
    assert len(next(stream.ParquetColumns(path).row_blocks(["image"]))) == 7
    schema = Schema(source="t", target="y", task="classification", features=[], kinds={"image": "image"},
                    classes=["u", "v"], n_rows=40, image_column="image")  # fmt: skip
    whole = Preprocessor.fit(frame, schema, FeatureParams())
    blocked = Preprocessor.fit(stream.ParquetColumns(path), schema, FeatureParams())  # type: ignore[arg-type]
    assert json.dumps(blocked.to_json(), sort_keys=True) == json.dumps(whole.to_json(), sort_keys=True)
    every = np.stack(pixels).astype(np.float64)
    np.testing.assert_allclose(whole.image_mean, every.mean(axis=(0, 1, 2)), rtol=1e-12)
    np.testing.assert_allclose(whole.image_std, every.std(axis=(0, 1, 2)), rtol=1e-9)

    frame.loc[23, "image"] = png_bytes(rng.integers(0, 256, (4, 5, 3)))
    frame.to_parquet(path, index=False, row_group_size=7)
    errors = []
    for data in (frame, stream.ParquetColumns(path)):
        with pytest.raises(DataError) as exc:
            Preprocessor.fit(data, schema, FeatureParams())  # type: ignore[arg-type]
        errors.append(str(exc.value))
    assert errors[0] == errors[1]
    assert errors[1].startswith("train: image in train, row 23 is 4x5 (height x width) but in train, row 0 is 6x5")


def test_a_record_file_reads_records_by_offset_and_names_a_truncated_file(tmp_path: Path) -> None:
    records = [b"abc", b"", b"defgh", b"i"]
    path = tmp_path / "r.bin"
    path.write_bytes(b"".join(records))
    offsets = np.cumsum([0, *map(len, records)])
    file = RecordFile(path, offsets)
    assert len(file) == 4 and file.read([2, 0, 1, 3, 2]) == [b"defgh", b"abc", b"", b"i", b"defgh"]
    path.write_bytes(b"abcde")
    with pytest.raises(ValueError, match=r"r\.bin is shorter than its offsets say"):
        file.read([2])


def test_predict_on_a_folder_of_class_folders_reads_each_image_when_it_decodes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`trainflow predict --input <folder of class folders>` lists the images and reads them batch by batch (the
    folder may be bigger than memory), with the probabilities evaluate computes from the split's stored bytes."""
    from trainflow import cli
    from trainflow.artifacts import predict
    from trainflow.artifacts.predict import ExportedModel

    paths = project(tmp_path, "p", "null", "train.epochs=1")
    for stage in ("ingest", "split", "train"):
        run_stage(stage, load_params(paths.params), paths)
    monkeypatch.setattr(sources, "_read_image_file", lambda *a: pytest.fail("predict read every image up front"))
    monkeypatch.setattr(predict, "DECODE_ONCE_BYTES", 1)  # too many to hold decoded: a batch at a time
    monkeypatch.chdir(paths.root)
    args = ["predict", "--model", "models/final", "--input", "data/raw/imgs", "--output", "all.csv"]
    assert cli.main([*args, "--batch-size", "16"]) == 0
    every = pd.read_csv(paths.root / "all.csv").set_index("image_path")
    assert len(every) == 240 and list(every.columns[:1]) == ["target"] and "image" not in every.columns
    test = whole(paths, "test")
    exported = ExportedModel.load(paths.final)
    want = exported.outputs(test)  # decoded from the stored bytes, in batches of 1,024
    got = every.loc[test["image_path"], [f"proba_{c}" for c in exported.pre.classes]].to_numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)  # written as csv: a float64's shortest repr round-trips
    assert every.loc[test["image_path"], "target"].tolist() == test["target"].tolist()


def paths_table(root: Path) -> None:
    """data/raw/list.csv: the images' paths relative to the table's folder (one absolute), their labels, a number."""
    images(root / "data/raw/imgs", n=90)
    files = sorted((root / "data/raw/imgs").rglob("*.png"))
    column = [f.relative_to(root / "data/raw").as_posix() for f in files]
    column[7] = str(files[7])
    frame = pd.DataFrame({"file": column, "label": [f.parent.name for f in files], "n": range(len(files))})
    frame.sample(frac=1.0, random_state=0).to_csv(root / "data/raw/list.csv", index=False)


def paths_project(tmp_path: Path, name: str, budget: str) -> Paths:
    params = {"data.source": "data/raw/list.csv", "data.image_column": "file", "data.target": "label",
              "data.memory_budget_mb": budget}  # fmt: skip
    root = make_project(tmp_path / name, params)
    paths_table(root)
    return Paths(root)


def test_a_table_of_image_paths_over_the_budget_spills_its_images_to_the_in_memory_table(
    tmp_path: Path, small_blocks: None, never_whole: None, capfd: pytest.CaptureFixture[str]
) -> None:
    made = []
    for name, budget in (("memory", "null"), ("streamed", TINY)):
        paths = paths_project(tmp_path, name, budget)
        for stage in ("ingest", "split"):
            run_stage(stage, load_params(paths.params), paths)
        made.append(paths)
    memory, streamed = made
    assert "ingest: images of 'file': read into chunks of about 0 MiB on disk" in capfd.readouterr().err
    a, b = pd.read_parquet(memory.table), pd.read_parquet(streamed.table)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert b["file"].map(type).eq(bytes).all() and b["n"].dtype == np.int64  # the images, and a carried column
    assert pq.read_schema(memory.table).equals(pq.read_schema(streamed.table), check_metadata=True)
    assert json.loads(memory.schema.read_text()) == json.loads(streamed.schema.read_text())
    assert pq.ParquetFile(streamed.table).metadata.num_row_groups >= 3
    for name in SPLITS:
        pd.testing.assert_frame_equal(whole(memory, name), whole(streamed, name), check_exact=True)


@pytest.mark.parametrize("fault", ["missing", "absent", "broken"])
def test_a_bad_image_path_is_the_same_error_spilled_and_nothing_is_left(
    tmp_path: Path, small_blocks: None, fault: str
) -> None:
    """The first bad row in the table's order, named by its line, as in memory; the fix the message gives works."""
    messages = []
    for name, budget in (("memory", "null"), ("streamed", TINY)):
        paths = paths_project(tmp_path, name, budget)
        table = pd.read_csv(paths.root / "data/raw/list.csv")
        if fault == "missing":
            table.loc[60, "file"] = " "
        elif fault == "absent":
            table.loc[60, "file"] = "imgs/a/nowhere.png"
        else:
            (paths.root / "data/raw" / table.loc[60, "file"]).write_bytes(b"not a png")
        table.to_csv(paths.root / "data/raw/list.csv", index=False)
        with pytest.raises(DataError) as exc:
            run_stage("ingest", load_params(paths.params), paths)
        # the project's own folder, and the address of the bytes PIL was given, aside
        messages.append(re.sub(r"0x[0-9a-f]+", "0x", str(exc.value).replace(str(paths.root), "<root>")))
        assert not paths.processed.exists()
        table.drop(index=60).to_csv(paths.root / "data/raw/list.csv", index=False)  # drop the row, as it says
        run_stage("ingest", load_params(paths.params), paths)
        assert json.loads(paths.schema.read_text())["n_rows"] == 89
    assert messages[0] == messages[1]
    assert messages[1].startswith("data.source: data/raw/list.csv, line 62, column 'file'") or (
        fault == "broken" and "(data/raw/list.csv, line 62, column 'file')" in messages[1]
    ), messages[1]
