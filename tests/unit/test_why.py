"""Why a run ran (trainflow.registry.changes): each kind of change alone, against a champion's tags, and what is
unknown."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from support.vcs import git_stdout as git

from trainflow.registry import changes


def files(rows: int, content: str = "a") -> dict[str, dict[str, object]]:
    return {"data/raw/t.csv": {"rows": rows, "sha256": content * 64}}


def test_each_change_alone_is_named_and_only_no_change_is_nothing(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@t")
    git(tmp_path, "config", "user.name", "t")
    (tmp_path / "model.py").write_text("x = 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_model.py").write_text("x = 1\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "one")
    then = git(tmp_path, "rev-parse", "HEAD")
    params = {"train.lr": "0.002", "seed": "42"}
    champion = SimpleNamespace(version="3", tags={changes.DATA_TAG: changes.data_tag(files(100)), "git_commit": then})

    same = changes.explain(tmp_path, champion, params, files(100), params, then, False)
    assert same["summary"].startswith("nothing changed since champion version 3") and same["compared_with"] == 3

    rows = changes.explain(tmp_path, champion, params, files(90, "b"), params, then, False)
    assert rows["data"] == ["data/raw/t.csv: -10 rows (100 -> 90)"] and rows["params"] == rows["code"] == []
    edited = changes.explain(tmp_path, champion, params, files(100, "c"), params, then, False)
    assert edited["data"] == ["data/raw/t.csv: the same 100 rows, other content"]
    added = changes.explain(tmp_path, champion, params, {**files(100), "data/raw/u.csv": files(5)["data/raw/t.csv"]},
                        params, then, False)  # fmt: skip
    assert added["data"] == ["data/raw/u.csv: new file, 5 rows"]

    lr = changes.explain(tmp_path, champion, params, files(100), {**params, "train.lr": "0.01"}, then, False)
    assert lr["params"] == ["train.lr: 0.002 -> 0.01"] and "nothing changed" not in lr["summary"]

    (tmp_path / "model.py").write_text("x = 2\n")
    (tmp_path / "tests" / "test_model.py").write_text("x = 2\n")  # not what makes the model
    dirty = changes.explain(tmp_path, champion, params, files(100), params, then, True)
    assert dirty["code"] == ["model.py (uncommitted)"] and "nothing changed" not in dirty["summary"]
    git(tmp_path, "commit", "-qam", "two")
    now = git(tmp_path, "rev-parse", "HEAD")
    code = changes.explain(tmp_path, champion, params, files(100), params, now, False)
    assert code["code"] == ["model.py"] and code["data"] == code["params"] == []
    assert code["summary"] == "since champion version 3: code: model.py"

    unknown = changes.explain(tmp_path, SimpleNamespace(version="1", tags={}), None, files(100), params, now, False)
    assert (unknown["data"], unknown["params"], unknown["code"]) == (None, None, None)
    assert unknown["summary"] == "since champion version 1: data: unknown | params: unknown | code: unknown"
    assert changes.explain(tmp_path, None, None, None, params, now, False)["compared_with"] is None


def test_many_files_are_one_digest_and_an_image_folder_counts_per_class(tmp_path: Path) -> None:
    many = {f"data/raw/part-{i:05d}.csv": {"rows": 10, "sha256": "f" * 64} for i in range(400)}
    tag = changes.data_tag(many)
    assert len(tag) < changes.TAG_LIMIT and '"files": 400' in tag and '"rows": 4000' in tag
    more = {**many, "data/raw/part-99999.csv": {"rows": 3, "sha256": "e" * 64}}
    assert changes._data_changes(tag, more) == ["the data changed (4000 -> 4003 rows over 400 -> 401 files; too many "
                                             "files to list)"]  # fmt: skip
    assert changes._data_changes(tag, many) == []

    for name in ("cat/1.png", "cat/2.png", "dog/1.png"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(name.encode())
    names = ["imgs/cat/1.png", "imgs/cat/2.png", "imgs/dog/1.png"]
    paths = [tmp_path / "cat/1.png", tmp_path / "cat/2.png", tmp_path / "dog/1.png"]
    folders = changes.data_files(names, [1, 1, 1], paths, group_by_folder=True)
    assert {k: v["rows"] for k, v in folders.items()} == {"imgs/cat/": 2, "imgs/dog/": 1}
    import hashlib

    assert folders["imgs/cat/"]["sha256"] == hashlib.sha256(b"cat/1.pngcat/2.png").hexdigest()
