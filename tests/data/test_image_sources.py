"""Images as data: a folder of class folders and a table of image paths (relative to each table file's folder)
or of image bytes become a column of the files' bytes; bad images and stray files are errors naming the file;
preprocessing decodes, sizes and normalises them with train statistics only."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from support.raw_sources import as_dict, error, read, write

from trainflow.core.errors import DataError
from trainflow.data import sources
from trainflow.data.preprocess import Preprocessor
from trainflow.data.sources import RawTable, read_source
from trainflow.data.validate import infer_schema
from trainflow.params import DataParams, FeatureParams


def png_bytes(pixels: list[list[int]]) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.array(pixels, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


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


IMAGE_KINDS = ".bmp, .gif, .jpeg, .jpg, .png, .tif, .tiff, .webp"


# === images =======================================================================================================


def image_folder(root: Path) -> dict[str, bytes]:
    pictures = {
        "imgs/b/2.png": png_bytes([[1, 2], [3, 4]]),
        "imgs/a/z.png": png_bytes([[5]]),
        "imgs/a/sub/y.PNG": png_bytes([[6, 7]]),
        "imgs/a/1.png": png_bytes([[8]]),
    }
    for rel, data in pictures.items():
        write(root, rel, data)
    write(root, "imgs/a/.DS_Store", "junk")
    write(root, "imgs/a/.cache/x.txt", "junk")
    write(root, "imgs/.hidden/x.txt", "junk")
    write(root, "imgs/.notes", "junk")
    return pictures


def test_image_folder_detection(tmp_path: Path) -> None:
    image_folder(tmp_path)
    assert sources._image_folder("imgs", tmp_path) == tmp_path / "imgs"
    assert sources._image_folder(str(tmp_path / "imgs"), Path("/elsewhere")) == tmp_path / "imgs"
    assert sources._image_folder("imgs/*", tmp_path) is None
    assert sources._image_folder("imgs/a/1.png", tmp_path) is None
    assert sources._image_folder("missing", tmp_path) is None
    write(tmp_path, "flat/x.png", png_bytes([[1]]))
    assert sources._image_folder("flat", tmp_path) is None  # no subfolders
    write(tmp_path, "hidden_only/.git/x", "x")
    write(tmp_path, "hidden_only/y.png", "x")
    assert sources._image_folder("hidden_only", tmp_path) is None
    write(tmp_path, "tables/sub/x.png", png_bytes([[1]]))
    write(tmp_path, "tables/t.CSV", "a\n1\n")
    assert sources._image_folder("tables", tmp_path) is None


def test_read_an_image_folder(tmp_path: Path) -> None:
    pictures = image_folder(tmp_path)
    t = read(tmp_path, "imgs", target="label", image_column="pic")
    order = ["imgs/a/1.png", "imgs/a/sub/y.PNG", "imgs/a/z.png", "imgs/b/2.png"]
    assert list(t.frame.columns) == ["pic", "pic_path", "label"]
    assert [bytes(b) for b in t.frame["pic"]] == [pictures[p] for p in order]
    assert t.frame["pic_path"].tolist() == order and t.frame["label"].tolist() == ["a", "a", "a", "b"]
    assert t.frame["pic"].dtype == object
    assert (t.source, t.files, t.rows, t.fmt, t.root, t.image_column) == (
        "imgs", [tmp_path / p for p in order], [1, 1, 1, 1], "images", tmp_path, "pic")  # fmt: skip
    assert t.where(3, "pic") == "imgs/b/2.png, column 'pic'"
    default = read(tmp_path, "imgs")
    assert list(default.frame.columns) == ["image", "image_path", "target"] and default.image_column == "image"


def test_image_folder_errors(tmp_path: Path) -> None:
    image_folder(tmp_path)
    write(tmp_path, "imgs/stray.png", png_bytes([[1]]))
    write(tmp_path, "imgs/astray.png", png_bytes([[1]]))
    assert error(tmp_path, "imgs") == (
        "data.source: imgs/astray.png is not inside a class folder; a folder of images holds one folder per class "
        "(<dir>/<class>/<image>): move it into one, or remove it"
    )
    (tmp_path / "imgs/stray.png").unlink()
    (tmp_path / "imgs/astray.png").unlink()
    (tmp_path / "imgs/c").mkdir()
    write(tmp_path, "imgs/c/.hidden.png", png_bytes([[1]]))
    assert error(tmp_path, "imgs") == "data.source: class folder imgs/c holds no images; fill or remove it"
    write(tmp_path, "imgs/c/notes", "x")
    assert error(tmp_path, "imgs") == (
        f"data.source: imgs/c/notes is not an image by its extension ((none)); a folder of images holds {IMAGE_KINDS} "
        "files: remove or rename it"
    )
    (tmp_path / "imgs/c/notes").unlink()
    write(tmp_path, "imgs/c/x.txt", "x")
    assert error(tmp_path, "imgs") == (
        f"data.source: imgs/c/x.txt is not an image by its extension (.txt); a folder of images holds {IMAGE_KINDS} "
        "files: remove or rename it"
    )
    assert sorted(sources.IMAGE_SUFFIXES) == IMAGE_KINDS.split(", ")


def test_read_images_from_a_table_of_paths(tmp_path: Path) -> None:
    pictures = image_folder(tmp_path)
    absolute = tmp_path / "imgs/b/2.png"
    write(tmp_path, "imgs/list.csv", f"id,file,label\n1, a/1.png ,x\n2,{absolute},y\n")
    t = read(tmp_path, "imgs/list.csv", image_column="file", target="label")
    assert list(t.frame.columns) == ["id", "file", "file_path", "label"]
    assert [bytes(b) for b in t.frame["file"]] == [pictures["imgs/a/1.png"], pictures["imgs/b/2.png"]]
    assert t.frame["file_path"].tolist() == ["imgs/a/1.png", "imgs/b/2.png"]
    assert t.image_column == "file"


def test_image_paths_are_relative_to_each_table_files_folder(tmp_path: Path) -> None:
    one, two = png_bytes([[1]]), png_bytes([[2, 3]])
    write(tmp_path, "p/a/img.png", one)
    write(tmp_path, "p/b/img.png", two)
    write(tmp_path, "p/a/list.csv", "f,y\nimg.png,1\nimg.png,2\n")
    write(tmp_path, "p/b/list.csv", "f,y\nimg.png,3\n")
    t = read(tmp_path, "p/*/list.csv", image_column="f", target="y")
    assert [bytes(b) for b in t.frame["f"]] == [one, one, two]
    assert t.frame["f_path"].tolist() == ["p/a/img.png", "p/a/img.png", "p/b/img.png"]


def test_read_images_without_files_is_relative_to_the_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pictures = image_folder(tmp_path)
    raw = RawTable(pd.DataFrame({"p": ["imgs/a/z.png"], "y": [1]}), "builtin:x", [], [1], "builtin", tmp_path)
    sources.read_images(raw, "p")
    assert [bytes(b) for b in raw.frame["p"]] == [pictures["imgs/a/z.png"]]
    assert raw.frame["p_path"].tolist() == ["imgs/a/z.png"] and raw.image_column == "p"
    monkeypatch.chdir(tmp_path / "imgs")
    cwd = RawTable(pd.DataFrame({"p": ["a/1.png"]}), "builtin:x", [], [1], "builtin")
    sources.read_images(cwd, "p")
    assert [bytes(b) for b in cwd.frame["p"]] == [pictures["imgs/a/1.png"]]
    assert cwd.frame["p_path"].tolist() == [str(tmp_path / "imgs/a/1.png")]


def test_read_images_keeps_a_column_of_bytes(tmp_path: Path) -> None:
    good = png_bytes([[9, 9]])
    pd.DataFrame({"img": [good, good], "y": [0, 1]}).to_parquet(tmp_path / "t.parquet")
    t = read(tmp_path, "t.parquet", image_column="img", target="y")
    assert as_dict(t.frame) == {"img": [good, good], "img_path": ["", ""], "y": [0, 1]}
    pd.DataFrame({"img": [good, b"junk"], "y": [0, 1]}).to_parquet(tmp_path / "bad.parquet")
    message = error(tmp_path, "bad.parquet", image_column="img", target="y")
    assert re.fullmatch(
        r"data\.source: image bad\.parquet, row 2, column 'img' cannot be read \(cannot identify image file "
        r"<_io\.BytesIO object at 0x[0-9a-f]+>\); replace the file or remove its row",
        message,
    ), message


def test_read_images_errors(tmp_path: Path) -> None:
    image_folder(tmp_path)
    frame = pd.DataFrame({f"c{i}": [1] for i in range(32)})
    frame["f"] = ["x"]
    raw = RawTable(frame, "src", [], [1], "builtin", tmp_path)
    with pytest.raises(DataError) as info:
        sources.read_images(raw, "nope")
    listed = ", ".join(f"'c{i}'" for i in range(30))
    assert str(info.value) == (
        f"data.image_column 'nope' is not a column of src (for this data: -S data.image_column=null); the columns are: "
        f"{listed}"
    )
    both = RawTable(pd.DataFrame({"f": ["x"], "f_path": ["y"]}), "src", [], [1], "builtin", tmp_path)
    with pytest.raises(DataError) as info:
        sources.read_images(both, "f")
    assert str(info.value) == (
        "data.source: src has a column 'f_path', the name ingest gives the paths of the images of data.image_column "
        "'f'; rename it"
    )
    write(tmp_path, "list.csv", "f,y\nimgs/a/1.png,1\n,2\n  ,3\nimgs/a/1.png,4\n")
    assert error(tmp_path, "list.csv", image_column="f", target="y") == (
        "data.source: list.csv, line 3, column 'f': the image path is missing (2 row(s) without one); fill it in or "
        "drop the row"
    )
    write(tmp_path, "gone.csv", "f,y\nimgs/a/1.png,1\nimgs/a/9.png,2\n")
    assert error(tmp_path, "gone.csv", image_column="f", target="y") == (
        f"data.source: gone.csv, line 3, column 'f': image 'imgs/a/9.png' does not exist (looked for "
        f"{tmp_path / 'imgs/a/9.png'}); paths are relative to the table file's folder"
    )
    write(tmp_path, "imgs/a/broken.png", b"\x89PNG junk")
    write(tmp_path, "broken.csv", "f,y\nimgs/a/broken.png,1\n")
    message = error(tmp_path, "broken.csv", image_column="f", target="y")
    assert message.startswith(
        "data.source: image imgs/a/broken.png (broken.csv, line 2, column 'f') cannot be read ("
    ) and message.endswith("); replace the file or remove its row"), message


def test_read_image_file_that_cannot_be_read(tmp_path: Path) -> None:
    (tmp_path / "d.png").mkdir()
    with pytest.raises(DataError) as info:
        sources._read_image_file(tmp_path / "d.png", "d.png")
    assert str(info.value) == "data.source: cannot read image d.png: Is a directory"
    path = write(tmp_path, "ok.png", png_bytes([[1, 2]]))
    assert sources._read_image_file(path, "ok.png") == path.read_bytes()


def test_a_truncated_image_fails_when_decoded(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    data = png_bytes(rng.integers(0, 255, (64, 64)).tolist())
    with pytest.raises(DataError, match=r"^data\.source: image cut\.png cannot be read \(.+\); replace the file"):
        sources._check_image(data[: len(data) // 2], "cut.png")
    sources._check_image(data, "whole.png")


def test_objects_holds_bytes() -> None:
    out = sources._objects([b"a", b"bc"])
    assert out.dtype == object and out.tolist() == [b"a", b"bc"] and out.shape == (2,)
    assert sources._objects([]).shape == (0,)
