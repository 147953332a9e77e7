"""`trainflow verify` in-process, fast: a git commit whose `trainflow` is a stand-in that writes the stage outputs, a
DVC cache laid out by hand, and a registry client that records what it is asked. Every message, the environment the
stages run in, the params they read, the tag written and the result are compared whole, against hashes worked out here
with hashlib (the end-to-end retraining is tests/stages/test_verify.py, in the slow tier)."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainflow.core.errors import DataError, UserError
from trainflow.registry import lineage, registry, verify

COMMIT_FILES = {
    "params.yaml": "seed: 1\n",
    # The stand-in for the commit's trainflow: `python -c "...from trainflow.cli import main..." ARGS` records its
    # argv, environment and params.yaml; `params check` prints params.yaml as JSON (the resolved params), the train
    # stage writes models/final, evaluate reports/metrics.json.
    "trainflow/__init__.py": "",
    "trainflow/cli.py": """
import json, os, sys
from pathlib import Path


def main():
    splits = Path("data/splits")
    with open(os.environ["CALLS_LOG"], "a") as f:
        f.write(json.dumps({"cwd": os.getcwd(), "argv": sys.argv[1:], "uri": os.environ["MLFLOW_TRACKING_URI"],
                            "failpoint": os.environ.get("TRAINFLOW_FAILPOINT"),
                            "pythonpath": os.environ["PYTHONPATH"], "params": Path("params.yaml").read_text(),
                            "splits": sorted(p.name for p in splits.iterdir()) if splits.is_dir() else None}) + "\\n")
    stage = sys.argv[2]
    if os.environ.get("FAIL_STAGE") == stage:
        for i in range(20):
            print(f"line {i}", file=sys.stderr)
        return 3
    if sys.argv[1] == "params":
        import yaml

        print(json.dumps(yaml.safe_load(Path("params.yaml").read_text()), indent=2))
    elif stage == "train":
        Path("models/final").mkdir(parents=True)
        Path("models/final/model.safetensors").write_bytes(os.environ.get("WEIGHTS", "w1").encode())
        Path("models/final/config.json").write_text("{}")
        Path("models/final/training.json").write_text('{"device": "cpu"}')
        Path("models/final/sub").mkdir()  # a folder: not part of the hash
    else:
        Path("reports").mkdir()
        metrics = {"accuracy": 0.75, "f1": 0.5, "loss": 0.25}
        Path("reports/metrics.json").write_text(os.environ.get("METRICS") or json.dumps(metrics))
    return 0
""",
}


def git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def model_sha(weights: bytes = b"w1") -> str:
    """tracking.model_hash of the stand-in's models/final, by hand: sorted file names, each name + NUL + bytes."""
    h = hashlib.sha256()
    files = {"config.json": b"{}", "model.safetensors": weights, "training.json": b'{"device": "cpu"}'}
    for name, data in sorted(files.items()):
        h.update(name.encode() + b"\0" + data)
    return h.hexdigest()


def cache_splits(root: Path, files: dict[str, bytes]) -> str:
    """Lay out DVC's cache for a data/splits of `files` by hand; the listing's hash (md5 + .dir)."""
    cache = root / ".dvc" / "cache" / "files" / "md5"
    entries = []
    for name, data in sorted(files.items()):
        md5 = hashlib.md5(data).hexdigest()
        (cache / md5[:2]).mkdir(parents=True, exist_ok=True)
        (cache / md5[:2] / md5[2:]).write_bytes(data)
        entries.append({"md5": md5, "relpath": name})
    listing = json.dumps(entries).encode()
    dir_hash = hashlib.md5(listing).hexdigest() + ".dir"
    (cache / dir_hash[:2]).mkdir(parents=True, exist_ok=True)
    (cache / dir_hash[:2] / dir_hash[2:]).write_bytes(listing)
    return dir_hash


SPLITS = {
    "schema.json": b"{}",
    "train.parquet": b"TRAIN",
    "val.parquet": b"VAL",
    "test.parquet": b"TEST",
    "sub/extra.bin": b"EXTRA",
}


def split_sha(files: dict[str, bytes]) -> str:
    """What training hashes of the splits (its data_sha256), by hand: the schema, then train, val and test, each
    name + NUL + bytes."""
    h = hashlib.sha256()
    for name in ("schema.json", "train.parquet", "val.parquet", "test.parquet"):
        h.update(name.encode() + b"\0" + files[name])
    return h.hexdigest()


# The params the version was trained with (its `params` tag): not the commit's params.yaml (seed 1), as after a
# `trainflow run -S seed=7 -S train.lr=0.003` in a committed tree.
TRAINED_WITH = {"seed": 7, "train": {"lr": 0.003, "progress": True}}


def params_tag(params: dict[str, Any]) -> tuple[str, str]:
    """(params tag, params_hash) by hand: compact JSON with sorted keys, the first 16 hex digits of its sha256."""
    text = json.dumps(params, sort_keys=True, separators=(",", ":"))
    return text, hashlib.sha256(text.encode()).hexdigest()[:16]


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
    git(root, "commit", "-qm", "c")
    commit = git(root, "rev-parse", "HEAD")
    data_hash = cache_splits(root, SPLITS)
    params, params_hash = params_tag(TRAINED_WITH)
    tags = {
        "git_commit": commit,
        "git_dirty": "true",  # params.yaml differed from the commit (-S): the code did not
        "code_dirty": "false",
        "data_hash": data_hash,
        "data_sha256": split_sha(SPLITS),
        "params": params,
        "params_hash": params_hash,
        **lineage.environment("cpu"),
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
    for name in ("FAIL_STAGE", "WEIGHTS", "METRICS"):
        monkeypatch.delenv(name, raising=False)
    return types.SimpleNamespace(
        root=root, commit=commit, data_hash=data_hash, tags=tags, asked=asked, log=tmp_path / "calls.jsonl"
    )


def calls_of(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []


def test_a_version_that_reproduces_is_tagged_true_and_each_stage_ran_in_the_commit_with_its_params_and_splits(
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
        "environment_differs": None,
        "verified": True,
    }
    seen = calls_of(project.log)
    checkout = seen[0]["cwd"]
    assert Path(checkout).name == "project" and not Path(checkout).exists()  # a temporary folder, removed
    # Every call read the params the version was trained with, not the commit's params.yaml (seed: 1)
    assert [yaml.safe_load(c.pop("params")) for c in seen] == [TRAINED_WITH] * 3
    db = f"sqlite:///{Path(checkout).parent / 'mlflow.db'}"
    splits = ["schema.json", "sub", "test.parquet", "train.parquet", "val.parquet"]
    common = {"cwd": checkout, "uri": db, "failpoint": None, "pythonpath": f"{checkout}:/elsewhere"}
    assert seen == [
        {**common, "argv": ["params", "check"], "splits": None},  # before the splits are restored
        *(
            {**common, "argv": ["stage", s, "-S", "train.progress=false"], "splits": splits}
            for s in ("train", "evaluate")
        ),
    ]
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
    assert result["environment_differs"] == []  # recorded here: nothing differs
    stamp = (
        f"false: retrained from {project.commit[:12]} and data {project.data_hash}; differs: the exported model "
        "(weights, config or preprocessing); test metrics f1, loss"
    )
    assert Client.tagged == [("iris", "4", "verified", stamp)]
    assert [c["pythonpath"] for c in calls_of(project.log)] == [calls_of(project.log)[0]["cwd"]] * 3


def test_same_model_other_metrics_is_not_verified(project: types.SimpleNamespace) -> None:
    project.tags["metric.accuracy"] = "0.7"
    result = verify.verify("iris/4", project.root)
    assert (result["verified"], result["metrics_differ"]) == (False, ["accuracy"])
    assert Client.tagged[0][3].endswith("; differs: test metrics accuracy")


@pytest.mark.parametrize(
    "retrained",
    [0.75 + 1e-4, math.nextafter(0.75, 1.0), math.nextafter(0.75, 0.0)],
    ids=["1e-4 more", "one ulp more", "one ulp less"],
)
def test_metrics_that_differ_by_any_amount_are_not_verified(
    retrained: float, project: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same model bytes on the same split bytes give the same floats: any difference is one (no tolerance). The
    retrained metrics.json is perturbed by hand; the recorded tag is repr(0.75)."""
    monkeypatch.setenv("METRICS", json.dumps({"accuracy": retrained, "f1": 0.5}))
    result = verify.verify("iris/4", project.root)
    assert retrained != 0.75 and (result["verified"], result["metrics_differ"]) == (False, ["accuracy"])


def test_a_metric_undefined_both_times_is_the_same(
    project: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NaN (a metric undefined on these rows, written by json as NaN) recorded and retrained: the same."""
    monkeypatch.setenv("METRICS", '{"accuracy": 0.75, "f1": NaN}')
    project.tags["metric.f1"] = repr(float("nan"))
    assert verify.verify("iris/4", project.root)["verified"] is True
    project.tags["metric.f1"] = "0.5"
    assert verify.verify("iris/4", project.root)["metrics_differ"] == ["f1"]


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


# --- code: the commit's, unless it differed ------------------------------------------------------------------------


def test_params_changed_by_s_do_not_make_a_version_unverifiable(project: types.SimpleNamespace) -> None:
    """git_dirty: true (params.yaml differed from the commit, as after any `trainflow run -S`) with the code the
    commit's (code_dirty: false): retrained from the commit with the recorded params."""
    assert project.tags["git_dirty"] == "true"
    assert verify.verify("iris/4", project.root)["verified"] is True


def test_a_version_trained_from_uncommitted_code_is_refused_and_the_advice_makes_it_verifiable(
    project: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The version was trained from code changed after its commit (the stand-in writing weights w1; the commit's
    writes w0). Following the message: commit those files, `verify --commit HEAD`, and it reproduces."""
    trained = (project.root / "trainflow/cli.py").read_text()
    (project.root / "trainflow/cli.py").write_text(trained.replace('"WEIGHTS", "w1"', '"WEIGHTS", "w0"'))
    git(project.root, "commit", "-qam", "before the change")
    before = git(project.root, "rev-parse", "HEAD")
    (project.root / "trainflow/cli.py").write_text(trained)  # the change the version was trained from, uncommitted
    project.tags.update(
        {"git_commit": before, "code_dirty": "true", "code_changes": '["trainflow/cli.py", "mymodel.py"]'}
    )
    with pytest.raises(UserError) as exc:
        verify.verify("iris@champion", project.root)
    assert str(exc.value) == (
        f"verify iris@champion: version 4 was trained from uncommitted changes to commit {before[:12]}: "
        "trainflow/cli.py, mymodel.py; what it was trained from is not in git. To verify it, commit those files as "
        "they were when it was trained (`git commit`), then run `trainflow verify iris/4 --commit HEAD`: it retrains "
        "the version from that commit"
    )
    assert calls_of(project.log) == [] and Client.tagged == []
    git(project.root, "commit", "-qam", "the change")  # the advice, as written
    after = git(project.root, "rev-parse", "HEAD")
    result = verify.verify("iris/4", project.root, "HEAD")
    assert (result["verified"], result["git_commit"]) == (True, after)
    assert Client.tagged[-1][3] == (
        f"true: retrained from {after[:12]} (the version's own commit: {before[:12]}) and data {project.data_hash}; "
        "byte for byte the same model and test metrics"
    )
    # The commit without the change does not reproduce it
    assert verify.verify("iris/4", project.root, before)["verified"] is False


def test_an_older_version_with_git_dirty_alone_is_refused_and_says_it_may_be_params_yaml(
    project: types.SimpleNamespace,
) -> None:
    for key in ("code_dirty", "params"):
        del project.tags[key]
    with pytest.raises(UserError) as exc:
        verify.verify("iris/4", project.root)
    assert str(exc.value) == (
        f"verify iris/4: version 4 was trained from uncommitted changes to commit {project.commit[:12]} (or in "
        "params.yaml: it was registered by an older trainflow, which did not tell them apart); what it was trained "
        "from is not in git. To verify it, commit those files as they were when it was trained (`git commit`), then "
        "run `trainflow verify iris/4 --commit HEAD`: it retrains the version from that commit"
    )
    project.tags["git_dirty"] = "false"  # then the commit's params.yaml is what it was trained with
    project.tags["params_hash"] = params_tag({"seed": 1})[1]
    assert verify.verify("iris/4", project.root)["verified"] is True
    assert [yaml.safe_load(c["params"]) for c in calls_of(project.log)] == [{"seed": 1}] * 3


def test_a_commit_not_in_the_clone_says_to_fetch_it(project: types.SimpleNamespace) -> None:
    project.tags["git_commit"] = "f" * 40
    with pytest.raises(UserError) as exc:
        verify.verify("iris/4", project.root)
    why = subprocess.run(["git", "archive", "f" * 40], cwd=project.root, capture_output=True).stderr.decode().strip()
    assert why and str(exc.value) == (
        f"verify iris/4: commit ffffffffffff is not in this clone ({why}); `git fetch` it, then verify again"
    )


# --- params: the recorded ones, checked by the commit's own code -----------------------------------------------------


def test_params_that_do_not_resolve_to_the_versions_params_hash_are_named_before_retraining(
    project: types.SimpleNamespace,
) -> None:
    project.tags["params_hash"] = "0123456789abcdef"
    with pytest.raises(UserError) as exc:
        verify.verify("iris/4", project.root)
    got = params_tag(TRAINED_WITH)[1]
    assert str(exc.value) == (
        f"verify iris/4: the params recorded with version 4 resolve to params_hash {got} under the code of commit "
        f"{project.commit[:12]}, not to the version's 0123456789abcdef: that code reads them otherwise than the code "
        "that trained it"
    )
    assert [c["argv"] for c in calls_of(project.log)] == [["params", "check"]] and Client.tagged == []


def test_an_older_version_without_its_params_whose_commit_has_other_params_says_how_to_verify_it(
    project: types.SimpleNamespace,
) -> None:
    del project.tags["params"]  # registered before params were recorded: the commit's params.yaml is all there is
    with pytest.raises(UserError) as exc:
        verify.verify("iris/4", project.root)
    assert str(exc.value) == (
        "verify iris/4: version 4 was registered without its params (by an older trainflow), and params.yaml of "
        f"commit {project.commit[:12]} is not what it was trained with (params_hash {params_tag({'seed': 1})[1]}, the "
        f"version's {params_tag(TRAINED_WITH)[1]}). Where params.yaml still holds the params it was trained with, "
        "commit it and run `trainflow verify iris/4 --commit HEAD`"
    )
    (project.root / "params.yaml").write_text(yaml.safe_dump(TRAINED_WITH))  # the advice, as written
    git(project.root, "commit", "-qam", "params")
    assert verify.verify("iris/4", project.root, "HEAD")["verified"] is True


# --- data: restored by DVC hash, checked against what training read -------------------------------------------------


def test_splits_that_are_not_what_it_was_trained_on_are_named_before_retraining(
    project: types.SimpleNamespace,
) -> None:
    """The data_hash tag names other (intact) splits than data_sha256 was computed from, as dvc.lock's stale hash
    did after `trainflow stage` runs: said as data, before the retraining, with no word of the environment."""
    other = {**SPLITS, "val.parquet": b"VAL2"}
    project.tags["data_hash"] = cache_splits(project.root, other)
    with pytest.raises(DataError) as exc:
        verify.verify("iris/4", project.root)
    assert str(exc.value) == (
        f"verify iris/4: the splits DVC hash {project.tags['data_hash']} names (schema.json, sub/extra.bin, "
        "test.parquet, train.parquet, val.parquet) are not those version 4 was trained on: hashed as training hashes "
        f"them they give {split_sha(other)[:16]}, the version's data_sha256 is {split_sha(SPLITS)[:16]}. Its "
        "data_hash tag names other splits than it was trained on (an older trainflow tagged dvc.lock's hash, which "
        "`trainflow stage` does not update): it cannot be verified"
    )
    assert [c["argv"] for c in calls_of(project.log)] == [["params", "check"]] and Client.tagged == []


def test_a_changed_byte_of_a_cached_split_is_named_before_retraining(project: types.SimpleNamespace) -> None:
    md5 = hashlib.md5(b"TRAIN").hexdigest()
    cached = project.root / ".dvc/cache/files/md5" / md5[:2] / md5[2:]
    cached.write_bytes(b"TRAIM")
    with pytest.raises(DataError) as exc:
        verify.verify("iris/4", project.root)
    assert str(exc.value) == (
        f"verify: data/splits/train.parquet in the DVC cache ({cached}) is damaged: its md5 is "
        f"{hashlib.md5(b'TRAIM').hexdigest()}, DVC recorded {md5}; delete that file and verify again: verify fetches "
        "it from the DVC remote, or takes it from data/splits where that holds the same bytes"
    )
    cached.unlink()  # the advice, as written: the workspace holds the same bytes
    (project.root / "data/splits").mkdir(parents=True)
    (project.root / "data/splits/train.parquet").write_bytes(b"TRAIN")
    assert verify.verify("iris/4", project.root)["verified"] is True


# --- the environment: named only when data, code and params matched -------------------------------------------------


def test_another_environment_is_named_when_the_retrained_model_differs(
    project: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy
    import torch

    monkeypatch.setenv("WEIGHTS", "w2")  # as another torch would train it
    project.tags["env.torch"] = "1.0.0"
    project.tags["env.numpy"] = "0.1"
    result = verify.verify("iris/4", project.root)
    assert result["verified"] is False
    assert result["environment_differs"] == [
        f"env.numpy: 0.1 when trained, {numpy.__version__} here",
        f"env.torch: 1.0.0 when trained, {torch.__version__} here",
    ]
    for key in [k for k in project.tags if k.startswith("env.")]:
        del project.tags[key]
    assert verify.verify("iris/4", project.root)["environment_differs"] is None  # not recorded (an older trainflow)


def test_another_environment_is_not_named_when_the_model_reproduces(project: types.SimpleNamespace) -> None:
    project.tags["env.torch"] = "1.0.0"
    assert verify.verify("iris/4", project.root)["environment_differs"] is None


@pytest.mark.parametrize("broken", ["data", "params", "code"])
def test_the_environment_is_never_named_before_data_params_and_code_were_checked(
    broken: str, project: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WEIGHTS", "w2")
    project.tags["env.torch"] = "1.0.0"
    if broken == "data":
        project.tags["data_sha256"] = "0" * 64
    elif broken == "params":
        project.tags["params_hash"] = "0" * 16
    else:
        project.tags["code_dirty"] = "true"
    with pytest.raises(UserError) as exc:  # DataError is a UserError
        verify.verify("iris/4", project.root)
    said = {"data": "data_sha256", "params": "params_hash", "code": "uncommitted changes"}[broken]
    assert said in str(exc.value) and "env." not in str(exc.value) and "environment" not in str(exc.value)
    assert not any(c["argv"][:2] == ["stage", "train"] for c in calls_of(project.log))


# --- the DVC cache -------------------------------------------------------------------------------------------------


def test_restore_splits_copies_every_file_and_names_them(tmp_path: Path) -> None:
    dir_hash = cache_splits(tmp_path, SPLITS)
    dest = tmp_path / "out" / "splits"
    assert verify.restore_splits(tmp_path, dir_hash, dest) == sorted(SPLITS)
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
        f"{hashlib.md5(b'VAX').hexdigest()}, DVC recorded {md5}; delete that file and verify again: verify fetches it "
        "from the DVC remote, or takes it from data/splits where that holds the same bytes"
    )
    damaged.unlink()
    with pytest.raises(DataError) as exc:
        verify.restore_splits(tmp_path, dir_hash, tmp_path / "out")
    assert str(exc.value) == (
        f"verify: data/splits/val.parquet (md5 {md5}) is neither in the DVC cache nor in data/splits; run `dvc pull`"
    )
    (tmp_path / "data/splits").mkdir(parents=True)
    (tmp_path / "data/splits/val.parquet").write_bytes(b"VAX")  # other bytes in the workspace: not taken
    with pytest.raises(DataError):
        verify.restore_splits(tmp_path, dir_hash, tmp_path / "out")
    (tmp_path / "data/splits/val.parquet").write_bytes(b"VAL")
    verify.restore_splits(tmp_path, dir_hash, tmp_path / "out2")
    assert (tmp_path / "out2/val.parquet").read_bytes() == b"VAL"


def test_splits_no_dvc_commit_stored_are_taken_from_the_workspace_when_their_hash_matches(tmp_path: Path) -> None:
    """No listing in the cache (the stage driver, before register kept them there): data/splits, if DVC's hash of
    it is the one asked for."""
    for name, data in SPLITS.items():
        (tmp_path / "data/splits" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "data/splits" / name).write_bytes(data)
    dir_hash = cache_splits(tmp_path / "elsewhere", SPLITS)  # the hash, worked out by hand; not in tmp_path's cache
    assert verify.restore_splits(tmp_path, dir_hash, tmp_path / "out") == sorted(SPLITS)
    assert {p.relative_to(tmp_path / "out").as_posix(): p.read_bytes() for p in (tmp_path / "out").rglob("*")
            if p.is_file()} == SPLITS  # fmt: skip
    (tmp_path / "data/splits/val.parquet").write_bytes(b"VAX")
    with pytest.raises(DataError, match="nor in data/splits"):
        verify.restore_splits(tmp_path, dir_hash, tmp_path / "out3")


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
        "default DVC remote, nor in data/splits; push them from a machine that has them (`dvc push data/splits`), or "
        "add the remote that holds them (`dvc remote add -d NAME URL`), then verify again"
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


def test_restore_splits_copies_each_file_of_the_dvc_directory_listing_into_dest(tmp_path: Path) -> None:
    """A DVC directory hash lists its files (relpath, md5); each cached file is copied to dest under its relpath, also
    into a dest that exists, and into a sub-folder."""
    from trainflow.registry.verify import restore_splits

    cache = tmp_path / ".dvc/cache/files/md5"
    files = {"train.parquet": b"train rows", "nested/test.parquet": b"test rows"}
    listing = []
    for name, data in files.items():
        md5 = hashlib.md5(data).hexdigest()
        (cache / md5[:2]).mkdir(parents=True, exist_ok=True)
        (cache / md5[:2] / md5[2:]).write_bytes(data)
        listing.append({"relpath": name, "md5": md5})
    text = json.dumps(listing).encode()
    dir_hash = hashlib.md5(text).hexdigest() + ".dir"
    (cache / dir_hash[:2]).mkdir(parents=True, exist_ok=True)
    (cache / dir_hash[:2] / dir_hash[2:]).write_bytes(text)
    dest = tmp_path / "restored"
    dest.mkdir()
    assert restore_splits(tmp_path, dir_hash, dest) == ["train.parquet", "nested/test.parquet"]
    assert {n: (dest / n).read_bytes() for n in files} == files
