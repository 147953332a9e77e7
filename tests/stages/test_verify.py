"""`trainflow verify`: a registered version retrained from its commit, params and cached data comes out byte for byte,
after `dvc repro`, after `trainflow run -S` (params.yaml rewritten: the recorded params are used) and after the stage
driver (`trainflow stage ...`, no `dvc commit`: the splits present are hashed and kept in DVC's cache); a damaged byte
in the DVC cache is named, and the advice (delete it, verify again) makes it pass; splits missing from the cache are
fetched from the DVC remote; a version trained from uncommitted code is refused, and the advice (commit, `verify
--commit HEAD`) makes it pass; another environment is named when the model differs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.projects import FAST, make_project
from support.vcs import git

from trainflow.cli import main
from trainflow.stages import STAGES

BIN = Path(sys.executable).parent


def dvc(root: Path, *args: str) -> None:
    done = subprocess.run([str(BIN / "dvc"), *args], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow  # a dvc repro and three retrainings: ~1 min idle
def test_a_version_reproduces_and_splits_missing_from_the_cache_are_fetched_from_the_remote(
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

    # (A damaged byte in the cache is named, and the advice works: test_versions_trained_by_the_stage_driver_verify_
    # and_a_changed_cached_byte_is_named, on the same check of restore_splits.)
    tags = MlflowClient().get_model_version("iris", "1").tags
    cache = root / ".dvc/cache/files/md5"
    listing = json.loads((cache / tags["data_hash"][:2] / tags["data_hash"][2:]).read_text())

    # A clone whose cache lacks the splits (no `dvc pull`): verify fetches them from the remote itself
    for entry in listing:
        (cache / entry["md5"][:2] / entry["md5"][2:]).unlink()
    (cache / tags["data_hash"][:2] / tags["data_hash"][2:]).unlink()
    capsys.readouterr()
    assert main(["verify", "iris/1"]) == 0
    assert "fetching the splits of" in capsys.readouterr().err

    # Another model under the same tags, trained with another torch: retrained, it differs, and verify says so (exit
    # 1), names the environment that differs (data, code and params were checked first) and tags it
    import torch

    client = MlflowClient()
    client.set_model_version_tag("iris", "1", "model_sha256", "0" * 64)
    client.set_model_version_tag("iris", "1", "metric.accuracy", "0.5")
    client.set_model_version_tag("iris", "1", "env.torch", "1.0.0")
    assert main(["verify", "iris/1"]) == 1
    err = capsys.readouterr().err
    assert "did not reproduce" in err and "test metrics differ: accuracy" in err
    assert "The data, code and params were checked before retraining and are the ones it was trained with" in err
    said = f"the environment differs from the one it was trained in: env.torch: 1.0.0 when trained, {torch.__version__}"
    assert f"{said} here." in err
    assert client.get_model_version("iris", "1").tags["verified"].startswith("false: retrained from")


def test_a_model_name_without_a_version_says_how_to_name_one(capsys: pytest.CaptureFixture[str]) -> None:
    from trainflow.registry.verify import resolve

    assert resolve("iris@champion") == ("iris", "champion")
    assert resolve("models:/my/model/3") == ("my/model", "3")
    assert main(["verify", "iris"]) == 2
    assert "name a version, as NAME@champion" in capsys.readouterr().err


@pytest.mark.slow  # a `trainflow run` and a retraining: ~1 min idle
def test_a_version_trained_by_trainflow_run_with_s_in_a_committed_tree_verifies(
    tmp_path: Path, prefect_server: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trial's lr sweep step: `trainflow run -S train.lr=0.003` rewrites params.yaml, so the tree differs from the
    commit (git_dirty), the code does not (code_dirty), and the params it ran with are recorded."""
    from mlflow.tracking import MlflowClient

    root = make_project(tmp_path / "proj", {"data.source": "builtin:iris", "register.model_name": "iris", **FAST})
    monkeypatch.chdir(root)
    assert main(["run", "-S", "train.lr=0.003"]) == 0
    tags = MlflowClient().get_model_version("iris", "1").tags
    assert (tags["git_dirty"], tags["code_dirty"]) == ("true", "false")
    assert json.loads(tags["params"])["train"]["lr"] == 0.003
    capsys.readouterr()
    assert main(["verify", "iris@champion"]) == 0, capsys.readouterr().err
    assert "verify: models:/iris/1 (commit" in capsys.readouterr().out


def stages(*overrides: str, only: tuple[str, ...] = STAGES) -> None:
    """`trainflow stage NAME -S ...` for each stage, as a user runs them by hand."""
    for name in only:
        assert main(["stage", name, *(a for o in overrides for a in ("-S", o))]) == 0, name


@pytest.mark.slow  # twelve stages and two retrainings: ~2 min idle
def test_versions_trained_by_the_stage_driver_verify_and_a_changed_cached_byte_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """All five stages by the stage driver, no `dvc commit`: data_hash is DVC's hash of the splits present (as `dvc
    commit` then records it) and register keeps them in the cache. Then a dvc.lock that records older splits (a
    `dvc commit` before a new split by the stage driver) is not what version 2 is tagged with."""
    import yaml
    from mlflow.tracking import MlflowClient

    root = make_project(tmp_path / "proj", {"data.source": "builtin:iris", "register.model_name": "iris", **FAST})
    monkeypatch.chdir(root)
    stages()
    assert not (root / "dvc.lock").exists()
    assert main(["verify", "iris/1"]) == 0, capsys.readouterr().err
    client = MlflowClient()
    tags = client.get_model_version("iris", "1").tags
    dvc(root, "commit", "-f", "ingest", "split")  # what DVC itself records for these splits
    (split,) = yaml.safe_load((root / "dvc.lock").read_text())["stages"]["split"]["outs"]
    assert tags["data_hash"] == split["md5"]

    stages("split.val_fraction=0.3", only=("split", "train", "evaluate", "register"))  # dvc.lock: the old splits
    tags = client.get_model_version("iris", "2").tags
    assert tags["data_hash"] != split["md5"]
    capsys.readouterr()
    assert main(["verify", "iris/2"]) == 0, capsys.readouterr().err

    cache = root / ".dvc/cache/files/md5"
    listing = json.loads((cache / tags["data_hash"][:2] / tags["data_hash"][2:]).read_text())
    md5 = next(e["md5"] for e in listing if e["relpath"] == "train.parquet")
    damaged = cache / md5[:2] / md5[2:]
    os.chmod(damaged, 0o644)
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 1
    damaged.write_bytes(bytes(data))
    assert main(["verify", "iris/2"]) == 2
    err = capsys.readouterr().err
    assert f"data/splits/train.parquet in the DVC cache ({damaged}) is damaged" in err, err
    assert "delete that file and verify again" in err
    damaged.unlink()  # the advice, as written: data/splits holds those bytes
    assert main(["verify", "iris/2"]) == 0, capsys.readouterr().err


@pytest.mark.slow  # five stages and a retraining: ~1 min idle
def test_a_version_trained_from_uncommitted_code_is_refused_and_the_advice_makes_it_verifiable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow.tracking import MlflowClient

    root = make_project(tmp_path / "proj", {"data.source": "builtin:iris", "register.model_name": "iris", **FAST})
    monkeypatch.chdir(root)
    with (root / "trainflow/__init__.py").open("a") as f:
        f.write("# a local change, not committed\n")
    stages()
    tags = MlflowClient().get_model_version("iris", "1").tags
    assert (tags["code_dirty"], json.loads(tags["code_changes"])) == ("true", ["trainflow/__init__.py"])
    capsys.readouterr()
    assert main(["verify", "iris@champion"]) == 2
    err = capsys.readouterr().err
    assert "version 1 was trained from uncommitted changes to commit" in err and "trainflow/__init__.py" in err
    assert "commit those files as they were when it was trained (`git commit`), then run `trainflow verify " in err
    assert "iris/1 --commit HEAD`" in err
    git(root, "commit", "-qm", "the local change", "--", "trainflow/__init__.py")  # the advice, as written
    assert main(["verify", "iris/1", "--commit", "HEAD"]) == 0, capsys.readouterr().err
    assert MlflowClient().get_model_version("iris", "1").tags["verified"].startswith("true: retrained from")
