"""The registry loads no code from the artifact store: a registered trainflow model stores data only (models/final:
safetensors, ONNX, JSON) and names `trainflow.serving` of the installed package as its loader, and the registry keeps
the sha256 of each of its files (trainflow.artifacts.manifest). Whoever can write to the artifact store can change
MLmodel to
load code from there (`code: code` and a planted `code/trainflow/serving.py`: MLflow's own loading runs it); the load
line the run summary prints, `trainflow predict` and `trainflow.serving.download` then refuse the version, naming each
file that changed, was added or is missing, and run nothing."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pandas as pd
import pytest
import yaml

from trainflow import cli
from trainflow.artifacts import manifest
from trainflow.artifacts.predict import load
from trainflow.core.errors import UserError
from trainflow.core.paths import Paths
from trainflow.params import load_params
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


def in_a_fresh_python(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`line` (an expression that loads a model) run as a user runs it: in a new process that has imported nothing
    of trainflow's but what the line names, scoring test.csv."""
    imports = "import mlflow.pyfunc\n" + ("import trainflow.serving\n" if "trainflow.serving" in line else "")
    code = f"{imports}import pandas as pd\nm = {line}\nprint(len(m.predict(pd.read_csv('test.csv'))))\n"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # a whole pipeline and four loads (~30 s); tests/artifacts/test_manifest.py holds the check in line 2
def test_the_printed_load_line_and_predict_refuse_an_artifact_store_changed_to_run_planted_code(
    csv_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One registered version, changed in the store every way in turn (one registration: each costs a minute)."""
    from trainflow.stages.report import summary

    paths, store = registered(csv_project)
    flavor = yaml.safe_load((store / "MLmodel").read_text())["flavors"]["python_function"]
    assert flavor["loader_module"] == "trainflow.serving" and flavor.get("code") is None, flavor
    assert not list(store.rglob("*.py")), "no Python stored with the model"
    assert sorted(p.name for p in (store / flavor["data"]).iterdir()) == [
        "model.json", "model.onnx", "model.safetensors", "preprocess.json", "schema.json", "training.json"
    ]  # fmt: skip
    requirements = (store / "requirements.txt").read_text().split()
    assert any(r.startswith("trainflow==") for r in requirements), requirements
    backup = tmp_path / "backup"
    shutil.copytree(store, backup)
    monkeypatch.chdir(csv_project)
    test = pd.read_parquet(paths.split_file("test")).drop(columns=["label"])
    test.to_csv("test.csv", index=False)
    line = next(x for x in summary(paths, {}).splitlines() if "load it:" in x).split("load it:", 1)[1].strip()

    # The attack: MLmodel set to load code from the store, trainflow's package planted there.
    marker = tmp_path / "marker"
    for rel in ("code/trainflow/__init__.py", "code/trainflow/serving.py"):
        (store / rel).parent.mkdir(parents=True, exist_ok=True)
        (store / rel).write_text(PLANTED.format(marker=str(marker)))
    spec = yaml.safe_load((store / "MLmodel").read_text())
    spec["flavors"]["python_function"]["code"] = "code"
    (store / "MLmodel").write_text(yaml.safe_dump(spec))
    done = in_a_fresh_python(line, csv_project)
    assert not marker.exists(), f"{line} ran the planted code"
    assert done.returncode != 0 and "UserError" in done.stderr, done.stderr[-2000:]
    said = done.stderr.strip().splitlines()[-1]
    assert "changed: MLmodel; added: code/trainflow/__init__.py, code/trainflow/serving.py)" in said, said
    capsys.readouterr()
    args = ["predict", "--model", "models:/blobs@champion", "--input", "test.csv", "--output", "o.csv"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "changed: MLmodel; added: code/trainflow/__init__.py, code/trainflow/serving.py)" in err, err
    assert "model models:/blobs@champion (version 1 of 'blobs')" in err and "Nothing of it was loaded or run" in err
    assert not Path("o.csv").exists() and not marker.exists()
    with pytest.raises(UserError, match=r"added: code/trainflow/__init__\.py"):
        from trainflow import serving

        serving.download("models:/blobs/1", tmp_path / "served")
    assert not (tmp_path / "served").exists()
    # A changed weight file and a missing graph are named too.
    weights = (backup / flavor["data"] / "model.safetensors").read_bytes()
    (store / flavor["data"] / "model.safetensors").write_bytes(weights[:-1] + bytes([weights[-1] ^ 1]))
    (store / flavor["data"] / "model.onnx").unlink()
    with pytest.raises(UserError) as refused:
        load("models:/blobs@champion")
    assert (
        "changed: MLmodel, data/final/model.safetensors; added: code/trainflow/__init__.py, "
        "code/trainflow/serving.py; missing: data/final/model.onnx)"
    ) in str(refused.value)
    assert not marker.exists()

    # What the message says to do: restore the version's files from a backup of the store. Then both work again.
    shutil.rmtree(store)
    shutil.copytree(backup, store)
    assert cli.main(args) == 0 and len(pd.read_csv("o.csv")) == len(test)
    done = in_a_fresh_python(line, csv_project)
    assert done.returncode == 0 and done.stdout.strip() == str(len(test)), done.stderr[-2000:]

    # A version without the manifest tags (registered before trainflow recorded them): `trainflow predict` reads it
    # as data and says it did not check it; trainflow.serving refuses it, naming the two ways that work.
    from mlflow.tracking import MlflowClient

    from trainflow import serving

    client = MlflowClient()
    keys = [k for k in client.get_model_version("blobs", "1").tags if k.startswith(manifest.HEAD_TAG)]
    assert manifest.HEAD_TAG in keys and manifest.part_tag(0) in keys
    for key in keys:
        client.delete_model_version_tag("blobs", "1", key)
    with pytest.raises(UserError) as refused:
        serving.load("models:/blobs@champion")
    said = str(refused.value)
    assert "version 1 of 'blobs' was registered before trainflow recorded manifests" in said, said
    assert "`trainflow predict --model models:/blobs@champion ...` scores it reading data only" in said
    assert "`mlflow.pyfunc.load_model('models:/blobs@champion')` loads it unchecked" in said
    capsys.readouterr()
    assert cli.main(args) == 0 and len(pd.read_csv("o.csv")) == len(test)
    assert "its files were not checked against the registry (version 1 of 'blobs' was registered before" in (
        capsys.readouterr().err
    )
    import mlflow.pyfunc  # the store is as registered here: MLflow's own loading runs nothing planted

    assert len(mlflow.pyfunc.load_model("models:/blobs@champion").predict(test)) == len(test)
    # A version without a graph (registered before trainflow exported ONNX): --runtime onnx names it by its URI.
    (store / flavor["data"] / "model.onnx").unlink()
    with pytest.raises(
        UserError, match=r"model models:/blobs@champion: no model\.onnx \(registered before .*--runtime"
    ):
        load("models:/blobs@champion").on_onnx("models:/blobs@champion")

    # The plant works: loaded by MLflow alone (what the summary printed before manifests), it runs.
    for rel in ("code/trainflow/__init__.py", "code/trainflow/serving.py"):
        (store / rel).parent.mkdir(parents=True, exist_ok=True)
        (store / rel).write_text(PLANTED.format(marker=str(marker)))
    (store / "MLmodel").write_text(yaml.safe_dump(spec))
    done = in_a_fresh_python("mlflow.pyfunc.load_model('models:/blobs@champion')", csv_project)
    assert done.returncode != 0 and marker.read_text() == "executed"


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

    from trainflow.artifacts.predict import ExportedModel

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


@pytest.mark.slow  # two pipelines (~20 s)
def test_register_flavor_code_stores_trainflow_s_code_only_when_asked(csv_project: Path, tmp_path: Path) -> None:
    """register.flavor: code registers the same model again, as MLflow models-from-code: trainflow's package is
    stored with it and MLflow's loading imports trainflow from there. The default version stays champion (the same
    model is not better), both versions come from the one run, and trainflow predict reads the new one as data."""
    from mlflow.tracking import MlflowClient

    from trainflow.artifacts.predict import ExportedModel
    from trainflow.params import write_overrides

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
    # Its manifest (trainflow's package is stored with it) is more than one tag holds, and is each file's sha256.
    tags = versions[1].tags
    assert json.loads(tags[manifest.HEAD_TAG])["parts"] >= 2
    assert all(len(tags[manifest.part_tag(i)]) <= manifest.PART_CHARS for i in range(2))
    by_hand = {p.relative_to(store).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
               for p in store.rglob("*") if p.is_file() and p.name != "registered_model_meta"}  # fmt: skip
    assert manifest.recorded(tags, "version 2") == by_hand
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
