"""Why a run ran (trainflow.registry.changes): each kind of change alone, against a champion's tags, and what is
unknown; and each part whole: the data files and their tag, the data, params and code changes, the why dict."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
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


# --- each part of the why, whole -------------------------------------------------------------------------------


def test_data_files_are_rows_and_sha256_per_file_sorted_by_name(tmp_path: Path) -> None:
    (tmp_path / "b.csv").write_bytes(b"x\n1\n2\n")
    (tmp_path / "a.csv").write_bytes(b"x\n3\n")
    big = b"0123456789" * 150_000  # over one read block (1 MiB)
    (tmp_path / "c.csv").write_bytes(big)
    paths = [tmp_path / "b.csv", tmp_path / "a.csv", tmp_path / "c.csv"]
    got = changes.data_files(["data/b.csv", "data/a.csv", "data/c.csv"], [2, 1, 7], paths, group_by_folder=False)
    assert got == {
        "data/a.csv": {"rows": 1, "sha256": hashlib.sha256(b"x\n3\n").hexdigest()},
        "data/b.csv": {"rows": 2, "sha256": hashlib.sha256(b"x\n1\n2\n").hexdigest()},
        "data/c.csv": {"rows": 7, "sha256": hashlib.sha256(big).hexdigest()},
    }
    assert list(got) == ["data/a.csv", "data/b.csv", "data/c.csv"]
    with pytest.raises(ValueError):  # a row count for each file, no fewer
        changes.data_files(["data/b.csv", "data/a.csv"], [2], [tmp_path / "b.csv", tmp_path / "a.csv"], False)
    images = [tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "a.csv"]
    folders = changes.data_files(["img/dog/1.png", "img/cat/2.png", "img/cat/1.png"], [1, 1, 1], images, True)
    assert folders == {
        "img/cat/": {"rows": 2, "sha256": hashlib.sha256(b"x\n1\n2\n" + b"x\n3\n").hexdigest()},
        "img/dog/": {"rows": 1, "sha256": hashlib.sha256(b"x\n3\n").hexdigest()},
    }


def test_the_data_tag_is_compact_json_up_to_the_limit_and_a_digest_past_it() -> None:
    """The compact form has no spaces and 12 hex of each hash; at exactly TAG_LIMIT characters it is kept."""
    sha = "0123456789abcdef" * 4
    assert changes.data_tag({"a.csv": {"rows": 3, "sha256": sha}, "b.csv": {"rows": 0, "sha256": sha}}) == (
        '{"a.csv":[3,"0123456789ab"],"b.csv":[0,"0123456789ab"]}'
    )
    at_limit = {"n" * (changes.TAG_LIMIT - 23): {"rows": 1, "sha256": sha}}  # '{"' + name + '":[1,"' + 12 + '"]}'
    assert len(changes.data_tag(at_limit)) == changes.TAG_LIMIT == 4500
    assert json.loads(changes.data_tag(at_limit)) == {"n" * 4477: [1, "0123456789ab"]}
    over = {"n" * 4478: {"rows": 1, "sha256": sha}, "m": {"rows": 2, "sha256": sha}}
    compact = json.dumps({k: [v["rows"], sha[:12]] for k, v in over.items()}, separators=(",", ":"))
    digest = hashlib.sha256(compact.encode()).hexdigest()[:16]
    assert changes.data_tag(over) == f'{{"files": 2, "rows": 3, "digest": "{digest}"}}'


def test_data_changes_name_each_file_new_removed_grown_or_edited() -> None:
    sha, other = "a" * 64, "b" * 64
    then = changes.data_tag({"gone.csv": {"rows": 4, "sha256": sha}, "grew.csv": {"rows": 2, "sha256": sha},
                         "edit.csv": {"rows": 5, "sha256": sha}, "same.csv": {"rows": 1, "sha256": sha}})  # fmt: skip
    now = {"grew.csv": {"rows": 3, "sha256": other}, "edit.csv": {"rows": 5, "sha256": other},
           "same.csv": {"rows": 1, "sha256": sha}, "new.csv": {"rows": 7, "sha256": sha}}  # fmt: skip
    assert changes._data_changes(then, now) == [
        "edit.csv: the same 5 rows, other content",
        "gone.csv: removed (4 rows)",
        "grew.csv: +1 rows (2 -> 3)",
        "new.csv: new file, 7 rows",
    ]
    assert changes._data_changes(None, now) is None
    assert changes._data_changes(changes.data_tag(now), now) == []


def test_data_changes_against_a_digest_tag_are_one_sentence_with_question_marks_for_what_a_list_lacks() -> None:
    many = {f"p{i:04d}-{'x' * 20}.csv": {"rows": 10, "sha256": "f" * 64} for i in range(200)}
    assert "digest" in changes.data_tag(many)
    listed = changes.data_tag({"a.csv": {"rows": 1, "sha256": "f" * 64}})
    assert changes._data_changes(listed, many) == [
        "the data changed (? -> 2000 rows over ? -> 200 files; too many files to list)"
    ]
    assert changes._data_changes(changes.data_tag(many), {"a.csv": {"rows": 1, "sha256": "f" * 64}}) == [
        "the data changed (2000 -> ? rows over 200 -> ? files; too many files to list)"
    ]
    assert changes._data_changes(changes.data_tag(many), many) == []


def test_param_changes_are_old_to_new_sorted_with_unset_for_a_missing_side() -> None:
    assert changes._param_changes({"a": "1", "b": "2", "d": "5"}, {"b": "3", "c": "4", "d": "5"}) == [
        "a: 1 -> (unset)",
        "b: 2 -> 3",
        "c: (unset) -> 4",
    ]
    assert changes._param_changes(None, {"a": "1"}) is None
    assert changes._param_changes({}, {}) == []


def test_a_param_new_since_the_champion_reads_unset_before_and_a_removed_one_unset_after() -> None:
    then = {"seed": "0", "train.lr": "0.1"}
    now = {"seed": "0", "train.epochs": "5"}
    assert changes._param_changes(then, now) == ["train.epochs: (unset) -> 5", "train.lr: 0.1 -> (unset)"]


def test_code_changes_are_the_package_and_root_modules_git_changed_and_unknown_without_a_commit(tmp_path: Path) -> None:
    assert changes._code_changes(tmp_path, None, "c1", False) is None
    assert changes._code_changes(tmp_path, "", "c1", False) is None
    assert changes._code_changes(tmp_path, "unknown", "c1", False) is None
    assert changes._code_changes(tmp_path, "c1", "unknown", False) is None
    assert changes._code_changes(tmp_path, "c1", "c1", False) == []  # same commit, clean: no git needed
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@t")
    git(tmp_path, "config", "user.name", "t")
    for name in ("model.py", "trainflow/a.py", "sub/b.py", "notes.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("1\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "one")
    one = git(tmp_path, "rev-parse", "HEAD")
    for name in ("model.py", "trainflow/a.py", "sub/b.py", "notes.txt"):
        (tmp_path / name).write_text("2\n")
    git(tmp_path, "commit", "-qam", "two")
    two = git(tmp_path, "rev-parse", "HEAD")
    assert changes._code_changes(tmp_path, one, two, False) == ["model.py", "trainflow/a.py"]
    assert changes._code_changes(tmp_path, "0" * 40, two, False) is None  # not in this clone
    git(tmp_path, "tag", "unknown", one)  # even where "unknown" names a commit, it stands for no commit recorded
    assert changes._code_changes(tmp_path, "unknown", two, False) is None
    assert changes._code_changes(tmp_path, one, "unknown", False) is None
    (tmp_path / "model.py").write_text("3\n")
    (tmp_path / "sub/b.py").write_text("3\n")
    assert changes._code_changes(tmp_path, two, two, True) == ["model.py (uncommitted)"]
    assert changes._code_changes(tmp_path, one, two, True) == ["model.py", "trainflow/a.py"]
    assert changes._code_changes(tmp_path, one, two, False) == ["model.py", "trainflow/a.py"]
    # explain asks git in the project it is given, and says what is uncommitted there
    champion = SimpleNamespace(version="1", tags={"git_commit": one})
    assert changes.explain(tmp_path, champion, {}, None, {}, two, True)["code"] == ["model.py", "trainflow/a.py"]
    champion = SimpleNamespace(version="2", tags={"git_commit": two})
    assert changes.explain(tmp_path, champion, {}, None, {}, two, True)["summary"] == (
        "since champion version 2: data: unknown | code: model.py (uncommitted)"
    )


def test_explain_is_the_whole_why_dict_for_a_first_version_a_repeat_and_a_change() -> None:
    root = Path("/nonexistent")  # same commit and a clean tree: git is never asked
    files = {"t.csv": {"rows": 2, "sha256": "a" * 64}}
    params = {"seed": "1"}
    assert changes.explain(root, None, None, files, params, "c1", False) == {
        "compared_with": None,
        "summary": "the first version of this model: nothing to compare with",
    }
    champion = SimpleNamespace(version="4", tags={changes.DATA_TAG: changes.data_tag(files), "git_commit": "c1"})
    assert changes.explain(root, champion, params, files, params, "c1", False) == {
        "compared_with": 4,
        "data": [],
        "params": [],
        "code": [],
        "summary": "nothing changed since champion version 4 (data, params and code are the same): a scheduled or "
        "repeated run",
    }
    assert changes.explain(root, champion, params, None, {"seed": "2"}, "c1", False) == {
        "compared_with": 4,
        "data": None,
        "params": ["seed: 1 -> 2"],
        "code": [],
        "summary": "since champion version 4: data: unknown | params: seed: 1 -> 2",
    }
    # the data and code the same but the champion's params unknown: not "nothing changed"
    unknown_params = changes.explain(root, champion, None, files, params, "c1", False)
    assert unknown_params["summary"] == "since champion version 4: params: unknown"
    no_data_tag = SimpleNamespace(version="4", tags={"git_commit": "c1"})
    assert changes.explain(root, no_data_tag, params, files, params, "c1", False)["summary"] == (
        "since champion version 4: data: unknown"
    )
    no_commit = SimpleNamespace(version="4", tags={changes.DATA_TAG: changes.data_tag(files)})
    assert changes.explain(root, no_commit, params, files, params, "c1", False)["summary"] == (
        "since champion version 4: code: unknown"
    )


def test_explain_lists_twenty_changes_of_a_kind_and_counts_the_rest() -> None:
    then = {f"p{i:02d}": "0" for i in range(22)}
    now = {f"p{i:02d}": "1" for i in range(22)}
    champion = SimpleNamespace(version="1", tags={"git_commit": "c"})
    got = changes.explain(Path("/nonexistent"), champion, then, None, now, "c", False)
    assert got["params"] == [f"p{i:02d}: 0 -> 1" for i in range(22)]
    shown = "; ".join(f"p{i:02d}: 0 -> 1" for i in range(20))
    assert got["summary"] == f"since champion version 1: data: unknown | params: {shown}; ... and 2 more"
    twenty = changes.explain(Path("/nonexistent"), champion, {k: then[k] for k in list(then)[:20]},
                         None, {k: now[k] for k in list(now)[:20]}, "c", False)  # fmt: skip
    assert twenty["summary"] == f"since champion version 1: data: unknown | params: {shown}"
