"""`trainflow verify` (issue 27 item 5): a registered version retrained from its commit, params and cached data comes
out byte for byte; a damaged byte in the DVC cache is named, and the advice (delete it, `dvc pull`) makes it pass;
splits missing from the cache are fetched from the DVC remote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAST, make_project

from trainflow.cli import main

BIN = Path(sys.executable).parent


def dvc(root: Path, *args: str) -> None:
    done = subprocess.run([str(BIN / "dvc"), *args], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow  # a dvc repro and four retrainings: ~1 min idle
def test_a_version_reproduces_and_a_damaged_cache_file_is_named_then_restored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = make_project(tmp_path / "proj", {"data.source": "builtin:iris", "register.model_name": "iris", **FAST})
    dvc(root, "repro")
    dvc(root, "push")
    monkeypatch.chdir(root)
    assert main(["verify", "iris@champion"]) == 0
    out = capsys.readouterr().out
    assert "verify: models:/iris/1 (commit" in out and "reproduces" in out
    from mlflow.tracking import MlflowClient

    assert MlflowClient().get_model_version("iris", "1").tags["verified"].startswith("true: retrained from")

    tags = MlflowClient().get_model_version("iris", "1").tags
    cache = root / ".dvc/cache/files/md5"
    listing = json.loads((cache / tags["data_hash"][:2] / tags["data_hash"][2:]).read_text())
    md5 = next(e["md5"] for e in listing if e["relpath"] == "train.parquet")
    damaged = cache / md5[:2] / md5[2:]
    os.chmod(damaged, 0o644)
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 1
    damaged.write_bytes(bytes(data))
    assert main(["verify", "iris/1"]) == 2
    err = capsys.readouterr().err
    assert f"data/splits/train.parquet in the DVC cache ({damaged}) is damaged" in err, err
    assert "delete that file and run `dvc pull data/splits`" in err

    damaged.unlink()  # the advice, as written
    dvc(root, "pull", "data/splits")
    assert main(["verify", "models:/iris@champion"]) == 0

    # A clone whose cache lacks the splits (no `dvc pull`): verify fetches them from the remote itself
    for entry in listing:
        (cache / entry["md5"][:2] / entry["md5"][2:]).unlink()
    (cache / tags["data_hash"][:2] / tags["data_hash"][2:]).unlink()
    capsys.readouterr()
    assert main(["verify", "iris/1"]) == 0
    assert "fetching the splits of" in capsys.readouterr().err

    # Another model under the same tags: retrained, it differs, and verify says so (exit 1) and tags it
    client = MlflowClient()
    client.set_model_version_tag("iris", "1", "model_sha256", "0" * 64)
    client.set_model_version_tag("iris", "1", "metric.accuracy", "0.5")
    assert main(["verify", "iris/1"]) == 1
    err = capsys.readouterr().err
    assert "did not reproduce" in err and "test metrics differ: accuracy" in err
    assert client.get_model_version("iris", "1").tags["verified"].startswith("false: retrained from")


def test_a_model_name_without_a_version_says_how_to_name_one(capsys: pytest.CaptureFixture[str]) -> None:
    from trainflow.verify import resolve

    assert resolve("iris@champion") == ("iris", "champion")
    assert resolve("models:/my/model/3") == ("my/model", "3")
    assert main(["verify", "iris"]) == 2
    assert "name a version, as NAME@champion" in capsys.readouterr().err
