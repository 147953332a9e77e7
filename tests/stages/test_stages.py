"""Each stage on small data in a temp project: outputs, errors naming what to fix, resume rules, the champion gate."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from support.projects import retrain
from support.stages import run_all
from support.stages import trainflow as _cli

from trainflow.core.errors import DataError, ServiceError
from trainflow.core.io import read_json, write_json
from trainflow.core.paths import Paths
from trainflow.params import load_params, write_overrides


def champion(name: str) -> str:
    from mlflow.tracking import MlflowClient

    return str(MlflowClient().get_model_version_by_alias(name, "champion").version)


def test_pipeline_outputs_and_lineage(csv_project: Path) -> None:
    out = run_all(csv_project)
    paths = Paths(csv_project)
    assert out["ingest"] == {"rows": 240, "features": 4, "classes": 3, "task": "classification"}
    assert sum(out["split"].values()) == 240
    metrics = read_json(paths.metrics)
    baselines = {f"baseline_{b}.{m}" for b in ("linear", "boosting") for m in ("accuracy", "f1_macro", "log_loss")}
    assert set(metrics) == {"accuracy", "f1_macro", "log_loss", "roc_auc", "pr_auc", "ece", "n_test", *baselines}
    assert metrics["accuracy"] >= 0.9  # separable blobs
    # The exported model is safetensors, ONNX and JSON only: nothing that could be unpickled.
    assert sorted(p.name for p in paths.final.iterdir()) == [
        "model.json",
        "model.onnx",
        "model.safetensors",
        "preprocess.json",
        "schema.json",
        "training.json",
    ]
    for png in ("training_curves.png", "test/predictions.png"):
        assert (paths.plots / png).read_bytes()[:4] == b"\x89PNG"
    assert "val_loss" in (paths.plots / "history.csv").read_text().splitlines()[0]

    reg = read_json(paths.registration)
    assert reg["version"] == 1 and reg["champion"] is True
    from mlflow.tracking import MlflowClient

    version = MlflowClient().get_model_version("blobs", "1")
    assert len(version.tags["git_commit"]) == 40
    assert version.tags["mlflow_run_id"] == read_json(paths.train_run)["run_id"]
    assert float(version.tags["metric.accuracy"]) == metrics["accuracy"]
    assert float(version.tags["metric.baseline_boosting.log_loss"]) == metrics["baseline_boosting.log_loss"]
    assert version.tags["data_sha256"] == read_json(paths.final / "training.json")["data_sha256"]
    assert champion("blobs") == "1"

    # The registered model loads through MLflow (no pickle) and predicts what evaluate scored.
    import mlflow.pyfunc
    import pandas as pd

    test = pd.read_parquet(paths.split_file("test"))
    served = mlflow.pyfunc.load_model("models:/blobs@champion").predict(test)
    confusion = pd.read_csv(paths.test_plots / "predictions.csv")
    assert list(served["prediction"]) == list(confusion["predicted"])


def test_champion_moves_only_when_the_gate_metric_improves(trained: Path) -> None:
    """register.decide: point (the accuracies below are made up: the paired rule re-scores both models instead)."""
    from trainflow.params import write_overrides

    write_overrides(Paths(trained).params, ["register.decide=point"])
    paths = Paths(trained)
    metrics = read_json(paths.metrics)
    for seed, accuracy, champion_after in ((1, metrics["accuracy"], "1"), (2, metrics["accuracy"] - 0.1, "1"),
                                           (3, metrics["accuracy"] + 0.01, "4")):  # equal, worse, better  # fmt: skip
        retrain(trained, seed=seed)  # a new training run: a new version
        write_json(paths.metrics, {**metrics, "accuracy": accuracy})
        run_all(trained, ("register",))
        assert champion("blobs") == champion_after
    assert read_json(paths.registration)["version"] == 4
    assert read_json(paths.registration)["previous_champion"] == 1


def test_a_run_registers_one_version_however_often_register_runs(trained: Path) -> None:
    """A rerun of register on an unchanged run, and a retry after a partial success, create no second version."""
    from mlflow.tracking import MlflowClient

    from trainflow.registry import registry

    paths = Paths(trained)
    first = read_json(paths.registration)
    run_all(trained, ("register",))
    again = read_json(paths.registration)
    assert again["version"] == first["version"] == 1 and again["champion"] is True
    assert "already registered as version 1" in again["decision"]
    assert first["decision"] in again["decision"]  # the decision it had then, quoted
    # The rest of the record describes the registry as it is, field by field, as the first registration did.
    for key in ("model_name", "model_uri", "gate_metric", "value", "champion_version"):
        assert again[key] == first[key], key
    assert again["value"] == pytest.approx(read_json(paths.metrics)[again["gate_metric"]])
    assert (again["previous_champion"], again["previous_value"], again["previous_metrics"]) == (None, None, None)
    assert again["rescored"] is False
    assert again["tags"] == first["tags"]
    # A partial success: the next run's version gets created, then the registry fails before the decision.
    retrain(trained, seed=1)
    calls = {"n": 0}
    set_alias = MlflowClient.set_registered_model_alias

    def fail_once(self: MlflowClient, *args: object) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("the tracking server went away")
        set_alias(self, *args)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(MlflowClient, "set_registered_model_alias", fail_once)
        with pytest.raises(ServiceError, match="did not answer"):
            run_all(trained, ("register",))
        assert sorted(int(v.version) for v in MlflowClient().search_model_versions("name='blobs'")) == [1, 2]
        run_all(trained, ("register",))  # the retry: finds version 2 by its run and decides
    retried = read_json(paths.registration)
    assert retried["version"] == 2 and retried["decision"].endswith("stays version 1")
    assert sorted(int(v.version) for v in MlflowClient().search_model_versions("name='blobs'")) == [1, 2]
    assert MlflowClient().get_model_version("blobs", "2").tags[registry.DECISION_TAG] == retried["decision"]


def test_resume_only_when_training_params_data_and_code_match(
    csv_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainflow.engine import fingerprint

    first = run_all(csv_project, ("ingest", "split", "train"))["train"]
    assert first["resumed_from_update"] is None
    paths = Paths(csv_project)
    weights = (paths.final / "model.safetensors").read_bytes()
    # Unchanged params, data and code: the finished run resumes at its last update; the model is bit-identical.
    again = run_all(csv_project, ("train",))["train"]
    assert again["resumed_from_update"] == first["updates"] > 0
    assert (paths.final / "model.safetensors").read_bytes() == weights
    # A changed lr must retrain, not "resume" the finished run and change nothing.
    write_overrides(paths.params, ["train.lr=0.0005"])
    assert run_all(csv_project, ("train",))["train"]["resumed_from_update"] is None
    assert (paths.final / "model.safetensors").read_bytes() != weights
    assert run_all(csv_project, ("train",))["train"]["resumed_from_update"] is not None  # and that run resumes
    # Changed data (a train row less) or changed training code: fresh starts too.
    import pandas as pd

    train_file = paths.split_file("train")
    pd.read_parquet(train_file).iloc[:-1].to_parquet(train_file, index=False)
    assert run_all(csv_project, ("train",))["train"]["resumed_from_update"] is None
    monkeypatch.setattr(fingerprint, "code_hash", lambda: "the engine changed")
    assert run_all(csv_project, ("train",))["train"]["resumed_from_update"] is None


def test_the_code_hash_covers_the_code_that_decides_the_weights(tmp_path: Path) -> None:

    from trainflow.engine.fingerprint import PACKAGE, code_hash

    copy = tmp_path / "trainflow"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    base = code_hash(copy)
    assert base == code_hash(PACKAGE)
    decides_weights = (
        "engine/trainer.py",
        "models/text.py",
        "data/preprocess.py",
        "artifacts/predict.py",
        "artifacts/export.py",
    )
    for decides in (*decides_weights, "stages/train.py"):
        (copy / decides).write_text((copy / decides).read_text() + "\n# changed\n")
        assert code_hash(copy) != base, decides
        shutil.copy2(PACKAGE / decides, copy / decides)
    for cosmetic in ("plots.py", "tracking.py", "stages/evaluate.py", "engine/fingerprint.py"):
        (copy / cosmetic).write_text((copy / cosmetic).read_text() + "\n# changed\n")
    assert code_hash(copy) == base


def _stage_killed_at(root: Path, stage: str, failpoint: str) -> None:
    """`trainflow stage STAGE` in a subprocess, SIGKILLed at the failpoint."""
    import signal
    import subprocess
    import sys

    trainflow = Path(sys.executable).parent / "trainflow"
    env = {**os.environ, "TRAINFLOW_FAILPOINT": failpoint}
    proc = subprocess.run([str(trainflow), "stage", stage], cwd=root, env=env, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


@pytest.mark.parametrize(
    ("stage", "failpoint"),
    [
        ("train", "update:3"),  # while training
        # the exported model is complete, not yet in place
        pytest.param("train", "rename-final:1", marks=pytest.mark.slow),
        # the model is in place, the run record not yet
        pytest.param("train", "rename-train_run.json:1", marks=pytest.mark.slow),
        # the test plots are complete, not yet in place
        pytest.param("evaluate", "rename-test:1", marks=pytest.mark.slow),
        ("evaluate", "rename-metrics.json:1"),  # the plots are in place, the metrics not yet
    ],
)
def test_a_killed_stage_leaves_every_output_whole(trained: Path, stage: str, failpoint: str) -> None:
    """Killed while it trains, or between its atomic writes: each output file is the previous run's or the new run's,
    byte for byte, never a mixture or a half-written file."""
    before = _snapshot(trained)
    paths = Paths(trained)
    write_overrides(paths.params, ["train.lr=0.0005", "seed=3"])  # the rerun writes different outputs
    _stage_killed_at(trained, stage, failpoint)
    after = _snapshot(trained)
    run_all(trained, (stage,))  # finish the rerun: the new outputs
    finished = _snapshot(trained)
    outputs = {"train": ("models/final", "reports/train_run.json", "reports/plots/history.csv"),
               "evaluate": ("reports/metrics.json", "reports/per_class.csv", "reports/plots/test")}[stage]  # fmt: skip
    written = [k for k in after if k.startswith(outputs)]
    assert set(written) == {k for k in before if k.startswith(outputs)}  # no output missing, none half-added

    def whole(k: str) -> bool:  # the old bytes, the new run's bytes, or (records of run ids) a complete JSON document
        return after[k] in (before.get(k), finished.get(k)) or (k.endswith(".json") and bool(json.loads(after[k])))

    assert written and all(whole(k) for k in written)
    if failpoint in ("update:3", "rename-final:1", "rename-test:1"):  # before its first output: all as before
        assert all(after[k] == before[k] for k in written)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for d in ("data", "models", "reports")
        if (root / d).exists()
        for p in (root / d).rglob("*")
        if p.is_file()
    }


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("data.source=data/raw/nope.csv", "data/raw/nope.csv"),
        ("data.target=species", "'species' is not a column"),
    ],
)
def test_data_errors_exit_2_and_leave_outputs_intact(
    csv_project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], override: str, needle: str
) -> None:
    assert _cli(csv_project, monkeypatch, "stage", "ingest") == 0
    before = _snapshot(csv_project)
    capsys.readouterr()
    assert _cli(csv_project, monkeypatch, "stage", "ingest", "-S", override) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert _snapshot(csv_project) == before


def test_a_wrong_typed_value_is_named_by_file_line_and_column(csv_project: Path) -> None:
    import pandas as pd

    frame = pd.read_csv(csv_project / "data/raw/blobs.csv")
    frame["f2"] = frame["f2"].astype(object)
    frame.loc[57, "f2"] = "abc"  # data row 57 is line 59: the header is line 1
    frame["city"] = "Oslo"  # a string column is a categorical feature, not an error
    frame.to_csv(csv_project / "data/raw/blobs.csv", index=False)
    with pytest.raises(DataError, match=r"data/raw/blobs.csv, line 59, column 'f2': 'abc' is not a number"):
        run_all(csv_project, ("ingest",))
    assert not (csv_project / "data/processed").exists()


def test_stage_writes_overrides_into_params_yaml(csv_project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _cli(csv_project, monkeypatch, "stage", "ingest", "-S", "data.exclude=[f3]") == 0
    assert load_params(csv_project / "params.yaml").data.exclude == ["f3"]
    schema = json.loads((csv_project / "data/processed/schema.json").read_text())
    assert schema["features"] == ["f0", "f1", "f2"]
