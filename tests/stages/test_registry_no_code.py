"""The registry loads no code from the artifact store (issue 29, item 2): a registered trainflow model stores data
only (models/final: safetensors, ONNX, JSON) and names `trainflow.serving` of the installed package as its loader.
A code file planted in the artifact store is never executed, neither by `trainflow predict` nor by MLflow's own
pyfunc loading (what `mlflow models serve` runs), and `trainflow predict` refuses a model whose MLmodel was changed
to load code from there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pandas as pd
import pytest
import yaml

from trainflow import cli
from trainflow.errors import UserError
from trainflow.params import load_params
from trainflow.paths import Paths
from trainflow.predict import load
from trainflow.stages import run_stage

PLANTED = """
from pathlib import Path
Path({marker!r}).write_text("executed")
raise SystemExit("planted code ran")
"""


def registered(csv_project: Path) -> tuple[Paths, Path]:
    """The blobs pipeline run through register; the champion's model directory in the artifact store."""
    from mlflow.tracking import MlflowClient

    paths = Paths(csv_project)
    for stage in ("ingest", "split", "train", "evaluate", "register"):
        run_stage(stage, load_params(paths.params), paths)
    client = MlflowClient()
    version = client.get_model_version_by_alias("blobs", "champion")
    store = Path(urlparse(client.get_model_version_download_uri("blobs", version.version)).path)
    assert (store / "MLmodel").is_file(), store
    return paths, store


def load_in_a_fresh_python(uri: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """MLflow's own loading, as `mlflow models serve` does it, in a process that has not imported trainflow."""
    code = (
        "import sys, mlflow.pyfunc, pandas as pd\n"
        f"m = mlflow.pyfunc.load_model({uri!r})\n"
        "print(len(m.predict(pd.read_csv('test.csv'))))\n"
    )
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_a_code_file_planted_in_the_artifact_store_is_never_executed(
    csv_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths, store = registered(csv_project)
    flavor = yaml.safe_load((store / "MLmodel").read_text())["flavors"]["python_function"]
    assert flavor["loader_module"] == "trainflow.serving" and flavor.get("code") is None, flavor
    assert not list(store.rglob("*.py")), "no Python stored with the model"
    assert sorted(p.name for p in (store / flavor["data"]).iterdir()) == [
        "model.json", "model.onnx", "model.safetensors", "preprocess.json", "schema.json", "training.json"
    ]  # fmt: skip
    requirements = (store / "requirements.txt").read_text().split()
    assert any(r.startswith("trainflow==") for r in requirements), requirements
    # Plant code where a models-from-code trainflow model kept its package (code/trainflow/...), and beside the data.
    marker = tmp_path / "marker"
    for rel in ("code/trainflow/__init__.py", "code/trainflow/serving.py", f"{flavor['data']}/serving.py"):
        (store / rel).parent.mkdir(parents=True, exist_ok=True)
        (store / rel).write_text(PLANTED.format(marker=str(marker)))
    monkeypatch.chdir(csv_project)
    test = pd.read_parquet(paths.split_file("test")).drop(columns=["label"])
    test.to_csv("test.csv", index=False)
    assert cli.main(["predict", "--model", "models:/blobs@champion", "--input", "test.csv", "--output", "o.csv"]) == 0
    assert len(pd.read_csv("o.csv")) == len(test) and not marker.exists()
    done = load_in_a_fresh_python("models:/blobs@champion", csv_project)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(len(test)) and not marker.exists()
    # A version without a graph (registered before trainflow exported ONNX): --runtime onnx names it by its URI.
    (store / flavor["data"] / "model.onnx").unlink()
    with pytest.raises(
        UserError, match=r"model models:/blobs@champion: no model\.onnx \(registered before .*--runtime"
    ):
        load("models:/blobs@champion").on_onnx("models:/blobs@champion")
    # An MLmodel changed to load code from the artifact store: MLflow would run the planted file (shown in a fresh
    # process); trainflow predict refuses the model and runs nothing.
    (store / "code/loader.py").write_text(PLANTED.format(marker=str(marker)))
    tampered = {**flavor, "loader_module": "loader", "code": "code"}
    spec = yaml.safe_load((store / "MLmodel").read_text())
    spec["flavors"]["python_function"] = tampered
    (store / "MLmodel").write_text(yaml.safe_dump(spec))
    with pytest.raises(UserError, match=r"not a trainflow model"):
        load("models:/blobs@champion")
    assert not marker.exists()
    done = load_in_a_fresh_python("models:/blobs@champion", csv_project)
    assert done.returncode != 0 and marker.read_text() == "executed"  # the plant works: the test can see it run


LEGACY = """
from pathlib import Path

import mlflow.models
import mlflow.pyfunc

Path({marker!r}).write_text("executed")


class Legacy(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return model_input


mlflow.models.set_model(Legacy())
"""


def test_a_version_registered_as_models_from_code_is_read_as_data_and_its_code_never_runs(
    csv_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Versions registered before this change are MLflow models-from-code (a Python file, models/final as the artifact
    `model_dir`): trainflow predict scores them from their data, as the torch model in models/final does, and never
    runs their file."""
    import mlflow
    import numpy as np

    from trainflow.predict import ExportedModel

    # MLflow's default experiment, made with the database, keeps its artifacts in ./mlruns: here, not the repo's.
    monkeypatch.chdir(tmp_path)
    paths = Paths(csv_project)
    for stage in ("ingest", "split", "train"):
        run_stage(stage, load_params(paths.params), paths)
    marker = tmp_path / "marker"
    code = tmp_path / "legacy.py"
    code.write_text(LEGACY.format(marker=str(marker)))
    with mlflow.start_run():
        info = mlflow.pyfunc.log_model(name="model", python_model=str(code), artifacts={"model_dir": str(paths.final)})
    marker.unlink(missing_ok=True)  # logging a models-from-code model runs its file once, here, by MLflow's design
    test = pd.read_parquet(paths.split_file("test"))
    legacy = load(info.model_uri)
    assert np.array_equal(legacy.outputs(test), ExportedModel.load(paths.final).outputs(test))
    assert not marker.exists()


def test_register_flavor_code_stores_trainflow_s_code_only_when_asked(csv_project: Path, tmp_path: Path) -> None:
    """register.flavor: code registers the same model again, as MLflow models-from-code: trainflow's package is
    stored with it and MLflow's loading imports trainflow from there. The default version stays champion (the same
    model is not better), both versions come from the one run, and trainflow predict reads the new one as data."""
    from mlflow.tracking import MlflowClient

    from trainflow.params import write_overrides
    from trainflow.predict import ExportedModel

    paths, package_store = registered(csv_project)
    assert not (package_store / "code" / "trainflow").exists()
    write_overrides(paths.params, ["register.flavor=code"])
    run_stage("register", load_params(paths.params), paths)
    client = MlflowClient()
    versions = sorted(client.search_model_versions("name='blobs'"), key=lambda v: int(v.version))
    assert [(int(v.version), v.tags["flavor"]) for v in versions] == [(1, "package"), (2, "code")]
    assert versions[0].run_id == versions[1].run_id
    assert int(client.get_model_version_by_alias("blobs", "champion").version) == 1
    store = Path(urlparse(client.get_model_version_download_uri("blobs", "2")).path)
    flavor = yaml.safe_load((store / "MLmodel").read_text())["flavors"]["python_function"]
    assert flavor["loader_module"] == "mlflow.pyfunc.loaders.code_model"
    assert (store / "code" / "trainflow" / "serving_code.py").is_file()
    # Rerun: nothing new (one version per model and flavour).
    run_stage("register", load_params(paths.params), paths)
    assert len(client.search_model_versions("name='blobs'")) == 2

    test = pd.read_parquet(paths.split_file("test")).drop(columns=["label"])
    test.to_csv(tmp_path / "test.csv", index=False)
    code = (
        "import sys, mlflow.pyfunc, pandas as pd\n"
        "m = mlflow.pyfunc.load_model('models:/blobs/2')\n"
        "print(sys.modules['trainflow'].__file__)\n"  # the package MLflow's loading imported
        "m.predict(pd.read_csv('test.csv')).to_csv('out.csv', index=False)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "/code/trainflow/__init__.py" in done.stdout.strip().splitlines()[-1], done.stdout
    served = pd.read_csv(tmp_path / "out.csv")
    assert served["prediction"].astype(str).tolist() == ExportedModel.load(paths.final).predict_frame(test)[
        "prediction"].astype(str).tolist()  # fmt: skip
    assert (load("models:/blobs/2").outputs(test) == ExportedModel.load(paths.final).outputs(test)).all()
