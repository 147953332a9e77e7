"""trainflow.artifacts.manifest on folders made here: each file's sha256 (by hashlib here), the manifest cut into
registry tags
no longer than MLflow 2's servers take and read back whole, and the check naming what changed, was added or is
missing. The registered model end to end: tests/stages/test_registry_no_code.py."""

from __future__ import annotations

import errno
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from trainflow.artifacts import manifest
from trainflow.core.errors import DiskFullError, ServiceError, UserError


def model_folder(root: Path, files: int = 3) -> Path:
    root.mkdir()
    (root / "MLmodel").write_text("flavors: {}\n")
    for i in range(files):
        (root / "data" / "final").mkdir(parents=True, exist_ok=True)
        (root / "data" / "final" / f"file_{i:03d}.json").write_text(json.dumps({"i": i}))
    return root


def by_hand(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file() and p.relative_to(root).as_posix() != manifest.DOWNLOAD_NOTE
    }


def test_the_manifest_is_each_file_s_sha256_and_leaves_out_only_mlflow_s_download_note(tmp_path: Path) -> None:
    root = model_folder(tmp_path / "m")
    (root / manifest.DOWNLOAD_NOTE).write_text("model_name: m\n")  # MLflow writes it beside downloaded files
    (root / "data" / manifest.DOWNLOAD_NOTE).write_text("not MLflow's: a file of the model\n")
    listed = manifest.files(root)
    assert listed == by_hand(root) and f"data/{manifest.DOWNLOAD_NOTE}" in listed
    assert manifest.DOWNLOAD_NOTE not in listed and list(listed) == sorted(listed)


def test_a_manifest_longer_than_a_tag_is_cut_into_parts_and_read_back_whole(tmp_path: Path) -> None:
    root = model_folder(tmp_path / "m", files=200)
    tags = manifest.tags(root)
    head = json.loads(tags[manifest.HEAD_TAG])
    parts = [tags[manifest.part_tag(i)] for i in range(head["parts"])]
    assert head["parts"] >= 3 and head["files"] == 201
    assert set(tags) == {manifest.HEAD_TAG, *(manifest.part_tag(i) for i in range(head["parts"]))}
    assert all(len(p) <= manifest.PART_CHARS for p in parts) and len(parts[0]) == manifest.PART_CHARS
    assert head["sha256"] == hashlib.sha256("".join(parts).encode()).hexdigest()
    assert manifest.recorded(tags, "v1") == by_hand(root)
    assert manifest.recorded({"other": "tag"}, "v1") is None  # registered before manifests
    # A part lost (a registration cut off while tagging), or the head: refused, not taken for "no manifest".
    for lost in (manifest.part_tag(1), manifest.HEAD_TAG):
        cut = {k: v for k, v in tags.items() if k != lost}
        with pytest.raises(UserError, match=r"v1: the registry's manifest of its files .* is incomplete"):
            manifest.recorded(cut, "v1")


def test_the_check_names_each_file_changed_added_or_missing(tmp_path: Path) -> None:
    root = model_folder(tmp_path / "m")
    recorded = manifest.files(root)
    manifest.check(root, recorded, "model m", "file:///store")  # the same files: nothing to say
    (root / "MLmodel").write_text("flavors: {python_function: {code: code}}\n")
    (root / "code" / "trainflow").mkdir(parents=True)
    (root / "code" / "trainflow" / "serving.py").write_text("print('planted')\n")
    (root / "data" / "final" / "file_001.json").unlink()
    with pytest.raises(UserError) as refused:
        manifest.check(root, recorded, "model m", "file:///store")
    said = str(refused.value)
    assert said.startswith(
        "model m: its files in the artifact store (file:///store) are not the ones registered (changed: MLmodel; "
        "added: code/trainflow/serving.py; missing: data/final/file_001.json)"
    )
    assert "Nothing of it was loaded or run" in said


@pytest.mark.parametrize(
    ("failure", "error"),
    [
        (lambda: requests.exceptions.ConnectionError("connection refused"), ServiceError),
        (lambda: OSError(errno.ENOSPC, "No space left on device"), DiskFullError),
    ],
)
def test_a_store_that_fails_while_the_manifest_is_recorded_decides_nothing_and_says_to_rerun(
    monkeypatch: pytest.MonkeyPatch, failure: Callable[[], Exception], error: type[Exception]
) -> None:
    import mlflow.artifacts

    def download_artifacts(*_: object, **__: object) -> str:
        raise failure()

    monkeypatch.setattr(mlflow.artifacts, "download_artifacts", download_artifacts)
    said = r"Nothing was decided and no version registered\. .*[Rr]erun `trainflow stage register`"
    with pytest.raises(error, match=said):
        manifest.record("runs:/abc/model")
