"""Images as data: a folder of class folders and a table of image paths become a column of the files' bytes; bad
images are errors naming the file; preprocessing decodes, sizes and normalises them with train statistics only."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from trainflow.core.errors import DataError
from trainflow.data.preprocess import Preprocessor
from trainflow.data.sources import read_source
from trainflow.data.validate import infer_schema
from trainflow.params import DataParams, FeatureParams


def png(path: Path, pixels: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels.astype(np.uint8)).save(path)
    return path


def folder(root: Path, sizes: dict[str, tuple[int, int]] | None = None) -> Path:
    """data/raw/imgs/<class>/<i>.png: 2 classes x 3 RGB images of distinct pixels."""
    rng = np.random.default_rng(0)
    for c in ("cat", "dog"):
        for i in range(3):
            h, w = (sizes or {}).get(f"{c}/{i}", (5, 4))
            png(root / "data/raw/imgs" / c / f"{i}.png", rng.integers(0, 256, (h, w, 3)))
    return root / "data/raw/imgs"


def ingest(root: Path, **data: object) -> tuple[pd.DataFrame, object]:
    d = DataParams.model_validate(data)
    schema, frame = infer_schema(read_source(d, root), d)
    return frame, schema


def test_a_folder_of_class_folders_is_a_table_of_image_bytes_and_labels(tmp_path: Path) -> None:
    imgs = folder(tmp_path)
    frame, schema = ingest(tmp_path, source="data/raw/imgs")
    files = sorted(imgs.rglob("*.png"))
    assert frame["image_path"].tolist() == [f.relative_to(tmp_path).as_posix() for f in files]
    assert frame["target"].tolist() == [f.parent.name for f in files]
    assert [bytes(b) for b in frame["image"]] == [f.read_bytes() for f in files]  # the files as they are
    assert schema.image_column == "image" and schema.features == [] and schema.classes == ["cat", "dog"]  # type: ignore[attr-defined]


def test_a_table_of_paths_relative_to_its_folder(tmp_path: Path) -> None:
    imgs = folder(tmp_path)
    table = tmp_path / "data/raw/list.csv"
    pd.DataFrame({"file": ["imgs/cat/0.png", str(imgs / "dog/1.png")], "label": ["c", "d"]}).to_csv(table, index=False)
    frame, schema = ingest(tmp_path, source="data/raw/list.csv", image_column="file", target="label")
    assert [bytes(b) for b in frame["file"]] == [(imgs / "cat/0.png").read_bytes(), (imgs / "dog/1.png").read_bytes()]
    assert frame["file_path"].tolist() == ["data/raw/imgs/cat/0.png", "data/raw/imgs/dog/1.png"]
    assert schema.image_column == "file"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing_file", r"data/raw/list.csv, line 3, column 'file': image 'imgs/cat/9.png' does not exist"),
        ("missing_value", r"data/raw/list.csv, line 3, column 'file': the image path is missing"),
        ("broken", r"image data/raw/imgs/cat/1.png \(data/raw/list.csv, line 3, column 'file'\) cannot be read"),
        ("truncated", r"image data/raw/imgs/cat/1.png .* cannot be read"),
        ("no_column", r"data.image_column 'file' is not a column"),
    ],
)
def test_bad_images_in_a_table_name_the_file_and_line(tmp_path: Path, case: str, expected: str) -> None:
    imgs = folder(tmp_path)
    paths = ["imgs/cat/0.png", "imgs/cat/1.png"]
    if case == "missing_file":
        paths[1] = "imgs/cat/9.png"
    elif case == "missing_value":
        paths[1] = ""
    elif case == "broken":
        (imgs / "cat/1.png").write_bytes(b"not an image")
    elif case == "truncated":
        data = (imgs / "cat/1.png").read_bytes()
        (imgs / "cat/1.png").write_bytes(data[: len(data) // 2])
    columns = {"other" if case == "no_column" else "file": paths, "label": ["a", "b"]}
    pd.DataFrame(columns).to_csv(tmp_path / "data/raw/list.csv", index=False)
    with pytest.raises(DataError, match=expected):
        ingest(tmp_path, source="data/raw/list.csv", image_column="file", target="label")


def test_bad_files_in_an_image_folder_are_named(tmp_path: Path) -> None:
    imgs = folder(tmp_path)
    (imgs / "cat/notes.txt").write_text("x")
    with pytest.raises(DataError, match=r"data/raw/imgs/cat/notes.txt is not an image by its extension"):
        ingest(tmp_path, source="data/raw/imgs")
    (imgs / "cat/notes.txt").unlink()
    (imgs / "cat/2.png").write_bytes(b"\x89PNG broken")
    with pytest.raises(DataError, match=r"image data/raw/imgs/cat/2.png cannot be read"):
        ingest(tmp_path, source="data/raw/imgs")
    (imgs / "cat/2.png").unlink()
    (imgs / "stray.png").write_bytes((imgs / "cat/0.png").read_bytes())
    with pytest.raises(DataError, match=r"data/raw/imgs/stray.png is not inside a class folder"):
        ingest(tmp_path, source="data/raw/imgs")


def test_digits_images_hold_the_digits_pixels() -> None:
    from sklearn.datasets import load_digits

    frame, schema = ingest(Path("."), source="builtin:digits_images")
    digits = load_digits()
    decoded = np.stack([np.asarray(Image.open(io.BytesIO(b))) for b in frame["image"]])
    assert np.array_equal(decoded, digits.images.astype(np.uint8))  # values 0..16, as sklearn has them
    assert frame["target"].astype(int).tolist() == digits.target.tolist()


def test_normalisation_is_fitted_on_train_only_and_saved_as_json(tmp_path: Path) -> None:
    folder(tmp_path)
    frame, schema = ingest(tmp_path, source="data/raw/imgs")
    train = frame.iloc[:4]
    pre = Preprocessor.fit(train, schema, FeatureParams())  # type: ignore[arg-type]
    pixels = np.stack([np.asarray(Image.open(io.BytesIO(b))) for b in train["image"]]).astype(np.float64)
    assert pre.image_size == [5, 4] and pre.image_channels == 3
    np.testing.assert_allclose(pre.image_mean, pixels.mean(axis=(0, 1, 2)), rtol=1e-12)
    np.testing.assert_allclose(pre.image_std, pixels.std(axis=(0, 1, 2)), rtol=1e-9)
    pre.save(tmp_path / "model")
    assert (tmp_path / "model/preprocess.json").read_text().startswith("{")
    back = Preprocessor.load(tmp_path / "model")
    values, names = back.image_source(frame)
    decoded = back.decode(values, names)
    assert decoded.shape == (6, 3, 5, 4)
    assert np.array_equal(decoded[:4].transpose(0, 2, 3, 1), pixels.astype(np.uint8))


def test_mixed_sizes_are_an_error_naming_the_file_unless_resized(tmp_path: Path) -> None:
    folder(tmp_path, sizes={"dog/1": (7, 6)})
    frame, schema = ingest(tmp_path, source="data/raw/imgs")
    with pytest.raises(DataError, match=r"image data/raw/imgs/dog/1.png is 7x6 .* but data/raw/imgs/cat/0.png is 5x4"):
        Preprocessor.fit(frame, schema, FeatureParams())  # type: ignore[arg-type]
    pre = Preprocessor.fit(frame, schema, FeatureParams(image_size=[3, 2]))  # type: ignore[arg-type]
    values, names = pre.image_source(frame)
    decoded = pre.decode(values, names)
    resized = Image.open(io.BytesIO(frame["image"][4])).resize((2, 3), Image.Resampling.BILINEAR)
    assert decoded.shape == (6, 3, 3, 2) and np.array_equal(decoded[4], np.asarray(resized).transpose(2, 0, 1))
    # A model trained without resizing refuses an image of another size at prediction, naming it.
    pre = Preprocessor.fit(frame.iloc[:3], schema, FeatureParams())  # type: ignore[arg-type]
    values, names = pre.image_source(frame)
    with pytest.raises(DataError, match=r"image data/raw/imgs/dog/1.png is 7x6 .* takes 5x4 images"):
        pre.decode(values, names)


def test_grayscale_images_keep_one_channel_and_paths_are_read_relative_to_base(tmp_path: Path) -> None:
    for i, c in enumerate("ab"):
        png(tmp_path / "data/raw/g" / c / "x.png", np.full((4, 4), 10 * (i + 1)))
    frame, schema = ingest(tmp_path, source="data/raw/g")
    pre = Preprocessor.fit(frame, schema, FeatureParams())  # type: ignore[arg-type]
    assert pre.image_channels == 1 and pre.image_mean == [15.0] and pre.image_std == [5.0]
    paths = pd.DataFrame({"image": ["a/x.png", "b/x.png"]})
    values, names = pre.image_source(paths, base=tmp_path / "data/raw/g")
    assert pre.decode(values, names)[:, 0, 0, 0].tolist() == [10, 20]
    with pytest.raises(DataError, match=r"image a/x.png: no such file"):
        values, names = pre.image_source(paths, base=tmp_path)
        pre.decode(values, names)
