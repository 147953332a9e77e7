"""`trainflow verify` in-process, fast: a git commit whose `trainflow` is a stand-in that writes the stage outputs, a
DVC cache laid out by hand, and a registry client that records what it is asked. Every message, the environment the
stages run in, the tag written and the result are compared whole, against hashes worked out here with hashlib (the
end-to-end retraining is tests/stages/test_verify.py, in the slow tier)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import types
from pathlib import Path
from typing import Any

import pytest

from trainflow import registry, verify
from trainflow.errors import DataError, UserError

COMMIT_FILES = {
    "params.yaml": "seed: 1\n",
    # The stand-in for the commit's trainflow: `python -c "...from trainflow.cli import main..." stage NAME -S ...`
    # records its argv and environment, and the train stage writes models/final, evaluate reports/metrics.json.
    "trainflow/__init__.py": "",
    "trainflow/cli.py": """
import json, os, sys
from pathlib import Path


def main():
    stage = sys.argv[2]
    with open(os.environ["CALLS_LOG"], "a") as f:
        f.write(json.dumps({"cwd": os.getcwd(), "argv": sys.argv[1:], "uri": os.environ["MLFLOW_TRACKING_URI"],
                            "failpoint": os.environ.get("TRAINFLOW_FAILPOINT"),
                            "pythonpath": os.environ["PYTHONPATH"],
                            "splits": sorted(p.name for p in Path("data/splits").iterdir())}) + "\\n")
    if os.environ.get("FAIL_STAGE") == stage:
        for i in range(20):
            print(f"line {i}", file=sys.stderr)
        return 3
    if stage == "train":
        Path("models/final").mkdir(parents=True)
        Path("models/final/model.safetensors").write_bytes(os.environ.get("WEIGHTS", "w1").encode())
        Path("models/final/config.json").write_text("{}")
        Path("models/final/sub").mkdir()  # a folder: not part of the hash
    else:
        Path("reports").mkdir()
        Path("reports/metrics.json").write_text(json.dumps({"accuracy": 0.75, "f1": 0.5, "loss": 0.25}))
    return 0
""",
}


def git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def model_sha(weights: bytes = b"w1") -> str:
    """tracking.model_hash of the stand-in's models/final, by hand: sorted file names, each name + NUL + bytes."""
    h = hashlib.sha256()
    for name, data in sorted({"config.json": b"{}", "model.safetensors": weights}.items()):
        h.update(name.encode() + b"\0" + data)
    return h.hexdigest()


def cache_splits(root: Path, files: dict[str, bytes]) -> str:
    """Lay out DVC's cache for a data/splits of `files` by hand; the listing's hash (md5 + .dir)."""
    cache = root / ".dvc" / "cache" / "files" / "md5"
    entries = []
    for name, data in files.items():
        md5 = hashlib.md5(data).hexdigest()
        (cache / md5[:2]).mkdir(parents=True, exist_ok=True)
        (cache / md5[:2] / md5[2:]).write_bytes(data)
        entries.append({"md5": md5, "relpath": name})
    listing = json.dumps(entries).encode()
    dir_hash = hashlib.md5(listing).hexdigest() + ".dir"
    (cache / dir_hash[:2]).mkdir(parents=True, exist_ok=True)
    (cache / dir_hash[:2] / dir_hash[2:]).write_bytes(listing)
    return dir_hash


SPLITS = {"train.parquet": b"TRAIN", "val.parquet": b"VAL", "sub/test.parquet": b"TEST"}


class Client:
    """mlflow.tracking.MlflowClient's stand-in: records set_model_version_tag."""

    tagged: list[tuple[str, str, str, str]] = []

    def set_model_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        Client.tagged.append((name, version, key, value))


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    root = tmp_path / "proj"
    root.mkdir()
    git(root, "init", "-q")
    for name, text in COMMIT_FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git(root, "add", ".")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    commit = git(root, "rev-parse", "HEAD")
    data_hash = cache_splits(root, SPLITS)
    tags = {
        "git_commit": commit,
        "data_hash": data_hash,
        registry.MODEL_TAG: model_sha(),
        "metric.accuracy": "0.75",
        "metric.f1": "0.5",
        "metric.auc": "0.9",  # not in the retrained metrics: not compared
    }
    version = types.SimpleNamespace(name="iris", version="4", tags=tags)
    asked: list[str] = []
    monkeypatch.setattr(verify, "version_of", lambda model: asked.append(model) or version)
    import mlflow.tracking

    Client.tagged = []
    monkeypatch.setattr(mlflow.tracking, "MlflowClient", Client)
    monkeypatch.setenv("TRAINFLOW_FAILPOINT", "train.update:3")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv("CALLS_LOG", str(tmp_path / "calls.jsonl"))
    for name in ("FAIL_STAGE", "WEIGHTS"):
        monkeypatch.delenv(name, raising=False)
    return types.SimpleNamespace(
        root=root, commit=commit, data_hash=data_hash, tags=tags, asked=asked, log=tmp_path / "calls.jsonl"
    )


def calls_of(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_a_version_that_reproduces_is_tagged_true_and_each_stage_ran_in_the_commit_with_its_splits(
    project: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    result = verify.verify("iris@champion", project.root)
    assert project.asked == ["iris@champion"]
    assert result == {
        "model": "models:/iris/4",
        "git_commit": project.commit,
        "data_hash": project.data_hash,
        "model_sha256": model_sha(),
        "retrained_sha256": model_sha(),
        "metrics_differ": [],
        "verified": True,
    }
    seen = calls_of(project.log)
    checkout = seen[0]["cwd"]
    assert Path(checkout).name == "project" and not Path(checkout).exists()  # a temporary folder, removed
    db = f"sqlite:///{Path(checkout).parent / 'mlflow.db'}"
    splits = ["sub", "train.parquet", "val.parquet"]
    assert seen == [
        {"cwd": checkout, "argv": ["stage", s, "-S", "train.progress=false"], "uri": db, "failpoint": None,
         "pythonpath": f"{checkout}:/elsewhere",
         "splits": splits}
        for s in ("train", "evaluate")
    ]  # fmt: skip
    stamp = (
        f"true: retrained from {project.commit[:12]} and data {project.data_hash}; byte for byte the same model and "
        "test metrics"
    )
    assert Client.tagged == [("iris", "4", "verified", stamp)]
    assert capsys.readouterr().err == (
        f"verify: retraining version 4 of iris from commit {project.commit[:12]} and its data ({project.data_hash})\n"
    )


def test_another_model_and_other_metrics_are_named_in_the_tag_and_the_result(
    project: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WEIGHTS", "w2")
    monkeypatch.delenv("PYTHONPATH")  # then the commit's checkout alone
    project.tags["metric.f1"] = "0.4"
    project.tags["metric.loss"] = "0.5"
    result = verify.verify("iris/4", project.root)
    assert result["verified"] is False and result["metrics_differ"] == ["f1", "loss"]
    assert result["retrained_sha256"] == model_sha(b"w2") != result["model_sha256"] == model_sha()
    stamp = (
        f"false: retrained from {project.commit[:12]} and data {project.data_hash}; differs: the exported model "
        "(weights, config or preprocessing); test metrics f1, loss"
    )
    assert Client.tagged == [("iris", "4", "verified", stamp)]
    assert [c["pythonpath"] for c in calls_of(project.log)] == [calls_of(project.log)[0]["cwd"]] * 2


def test_same_model_other_metrics_is_not_verified(project: types.SimpleNamespace) -> None:
    project.tags["metric.accuracy"] = "0.7"
    result = verify.verify("iris/4", project.root)
    assert (result["verified"], result["metrics_differ"]) == (False, ["accuracy"])
    assert Client.tagged[0][3].endswith("; differs: test metrics accuracy")


@pytest.mark.parametrize("stage", ["train", "evaluate"])
def test_a_failing_stage_is_named_with_the_last_15_lines_of_its_errors(
    stage: str, project: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAIL_STAGE", stage)
    with pytest.raises(UserError) as exc:
        verify.verify("iris/4", project.root)
    tail = "\n".join(f"line {i}" for i in range(5, 20))
    assert str(exc.value) == f"verify iris/4: the {stage} stage of commit {project.commit[:12]} failed:\n{tail}"
    assert Client.tagged == []


@pytest.mark.parametrize(
    ("tags", "said"),
    [
        ({"git_commit": None}, "git_commit"),
        ({"data_hash": "", registry.MODEL_TAG: "unknown"}, "data_hash, model_sha256"),
        ({"git_commit": "unknown", "data_hash": None, registry.MODEL_TAG: ""}, "git_commit, data_hash, model_sha256"),
    ],
)
def test_a_version_without_lineage_tags_names_the_missing_ones(
    tags: dict[str, Any], said: str, project: types.SimpleNamespace
) -> None:
    for k, v in tags.items():
        if v is None:
            del project.tags[k]
        else:
            project.tags[k] = v
    with pytest.raises(UserError) as exc:
        verify.verify("iris/4", project.root)
    assert str(exc.value) == (
        f"verify iris/4: version 4 has no {said} tag: it cannot be reproduced (registered outside a git checkout, or "
        "by an older trainflow)"
    )


def test_a_version_trained_from_uncommitted_changes_is_refused(project: types.SimpleNamespace) -> None:
    project.tags["git_dirty"] = "true"
    with pytest.raises(UserError) as exc:
        verify.verify("iris/4", project.root)
    assert str(exc.value) == (
        f"verify iris/4: version 4 was trained from uncommitted changes to {project.commit[:12]}; what it was trained "
        "from is not in git"
    )
    project.tags["git_dirty"] = "false"
    assert verify.verify("iris/4", project.root)["verified"] is True


def test_a_commit_not_in_the_clone_says_to_fetch_it(project: types.SimpleNamespace) -> None:
    project.tags["git_commit"] = "f" * 40
    with pytest.raises(UserError) as exc:
        verify.verify("iris/4", project.root)
    why = subprocess.run(["git", "archive", "f" * 40], cwd=project.root, capture_output=True).stderr.decode().strip()
    assert why and str(exc.value) == (
        f"verify iris/4: commit ffffffffffff is not in this clone ({why}); `git fetch` it, then verify again"
    )


# --- the DVC cache -------------------------------------------------------------------------------------------------


def test_restore_splits_copies_every_file_and_names_them(tmp_path: Path) -> None:
    dir_hash = cache_splits(tmp_path, SPLITS)
    dest = tmp_path / "out" / "splits"
    assert verify.restore_splits(tmp_path, dir_hash, dest) == ["train.parquet", "val.parquet", "sub/test.parquet"]
    assert {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()} == SPLITS


def test_a_damaged_cache_file_is_named_with_both_md5s_and_how_to_get_it_back(tmp_path: Path) -> None:
    dir_hash = cache_splits(tmp_path, SPLITS)
    md5 = hashlib.md5(b"VAL").hexdigest()
    damaged = tmp_path / ".dvc/cache/files/md5" / md5[:2] / md5[2:]
    damaged.write_bytes(b"VAX")
    with pytest.raises(DataError) as exc:
        verify.restore_splits(tmp_path, dir_hash, tmp_path / "out")
    assert str(exc.value) == (
        f"verify: data/splits/val.parquet in the DVC cache ({damaged}) is damaged: its md5 is "
        f"{hashlib.md5(b'VAX').hexdigest()}, DVC recorded {md5}; delete that file and run `dvc pull data/splits` (or "
        "`dvc fetch`) to get it back from the DVC remote"
    )
    damaged.unlink()
    with pytest.raises(DataError) as exc:
        verify.restore_splits(tmp_path, dir_hash, tmp_path / "out")
    assert str(exc.value) == f"verify: data/splits/val.parquet (md5 {md5}) is not in the DVC cache; run `dvc pull`"


def test_splits_missing_from_the_cache_are_fetched_once_then_named_if_still_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fetched: list[tuple[Path, str]] = []
    monkeypatch.setattr(verify, "fetch_splits", lambda root, commit: fetched.append((root, commit)))
    dir_hash = cache_splits(tmp_path, SPLITS)
    md5 = hashlib.md5(b"TEST").hexdigest()
    (tmp_path / ".dvc/cache/files/md5" / md5[:2] / md5[2:]).unlink()  # the listing is there, one file is not
    assert verify._cached(tmp_path / ".dvc/cache/files/md5", dir_hash) is False
    with pytest.raises(DataError):
        verify.restore_splits(tmp_path, dir_hash, tmp_path / "out", "abc")
    assert fetched == [(tmp_path, "abc")]
    with pytest.raises(DataError):
        verify.restore_splits(tmp_path, dir_hash, tmp_path / "out2")  # no commit: nothing fetched
    assert fetched == [(tmp_path, "abc")]
    other = "0" * 32 + ".dir"
    with pytest.raises(DataError) as exc:
        verify.restore_splits(tmp_path, other, tmp_path / "out", "abc")
    assert fetched == [(tmp_path, "abc")] * 2
    assert str(exc.value) == (
        f"verify: the splits it was trained on (DVC hash {other}) are not in {tmp_path / '.dvc' / 'cache'}, nor on the "
        "default DVC remote; push them from a machine that has them (`dvc push data/splits`), or add the remote that "
        "holds them (`dvc remote add -d NAME URL`), then verify again"
    )
    cache_splits(tmp_path, SPLITS)  # whole again: no fetch
    assert verify._cached(tmp_path / ".dvc/cache/files/md5", dir_hash) is True
    verify.restore_splits(tmp_path, dir_hash, tmp_path / "out3", "abc")
    assert len(fetched) == 2


def test_a_fetch_that_fails_is_said_and_left_for_restore_to_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    verify.fetch_splits(tmp_path, "0123456789abcdef")  # not a DVC repo
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "verify: fetching the splits of 0123456789ab from the DVC remote"
    assert err[1].startswith("verify: could not fetch them (") and err[1].endswith(")") and len(err) == 2


def test_md5_reads_files_larger_than_its_block(tmp_path: Path) -> None:
    data = bytes(range(256)) * 8193  # 2 MiB + 2 KiB: three blocks of 1 MiB
    (tmp_path / "f").write_bytes(data)
    assert verify._md5(tmp_path / "f") == hashlib.md5(data).hexdigest()


# --- naming a version --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "parsed"),
    [
        ("iris@champion", ("iris", "champion")),
        ("models:/iris@challenger", ("iris", "challenger")),
        ("team/iris/12", ("team/iris", "12")),
        ("models:/iris/3", ("iris", "3")),
    ],
)
def test_resolve_splits_the_name_from_the_alias_or_version(model: str, parsed: tuple[str, str]) -> None:
    assert verify.resolve(model) == parsed


@pytest.mark.parametrize("model", ["iris", "models:/iris", "@champion", "iris@", "/3", "iris/"])
def test_a_reference_without_both_parts_says_how_to_name_one(model: str) -> None:
    with pytest.raises(UserError) as exc:
        verify.resolve(model)
    assert str(exc.value) == f"verify {model}: name a version, as NAME@champion, NAME@challenger or NAME/3"


def test_version_of_looks_a_number_up_as_a_version_and_a_word_as_an_alias(monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow.tracking

    asked: list[tuple[str, str, str]] = []

    class Registry:
        def get_model_version(self, name: str, version: str) -> str:
            asked.append(("version", name, version))
            return f"{name} v{version}"

        def get_model_version_by_alias(self, name: str, alias: str) -> str:
            asked.append(("alias", name, alias))
            return f"{name} @{alias}"

    monkeypatch.setattr(mlflow.tracking, "MlflowClient", Registry)
    assert verify.version_of("iris/12") == "iris v12"
    assert verify.version_of("models:/iris@champion") == "iris @champion"
    assert asked == [("version", "iris", "12"), ("alias", "iris", "champion")]
    monkeypatch.setattr(registry, "lookup", lambda call, what: None)
    with pytest.raises(UserError) as exc:
        verify.version_of("team/iris@gone")
    assert (
        str(exc.value) == "team/iris@gone: no such version in the registry (`trainflow models list --name team/iris`)"
    )
