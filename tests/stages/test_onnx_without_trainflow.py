"""The default registered model predicts where only ONNX Runtime, numpy and pandas are installed (issue 29): no
trainflow, torch or MLflow. The graph takes the raw feature columns (its preprocessing is inside), so what a serving
stack needs is model.onnx from the artifact store, and preprocess.json's class list is in the graph's `label` output.

The fresh environment is a real venv (`python -m venv --without-pip`, offline) holding the three packages and what
they import, nothing else; the script in it is what a user writes, reading only the graph's own input types."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from support.projects import make_project

from trainflow import cli
from trainflow.artifacts.onnx import ONNX
from trainflow.core.io import read_json
from trainflow.core.paths import Paths
from trainflow.params import load_params
from trainflow.stages import run_stage

# The distributions of onnxruntime, numpy and pandas, with what they need at import.
ONLY = ("onnxruntime", "numpy", "pandas", "python-dateutil", "six", "flatbuffers", "packaging", "protobuf")

SCRIPT = """
import importlib.util, sys
import numpy as np, onnxruntime as ort, pandas as pd

for absent in ("trainflow", "torch", "mlflow", "sklearn", "tokenizers"):
    assert importlib.util.find_spec(absent) is None, absent + " is installed"
session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
rows = pd.read_csv(sys.argv[2])
convert = {
    "tensor(double)": lambda s: pd.to_numeric(s, errors="coerce").to_numpy(np.float64),
    "tensor(string)": lambda s: s.fillna("").astype(str).to_numpy(object),
    "tensor(int64)": lambda s: pd.to_datetime(s, utc=True).dt.tz_localize(None).to_numpy("M8[ns]").view("int64"),
}
feed = {i.name: convert[i.type](rows[i.name]) for i in session.get_inputs()}
scores, label = session.run(["scores", "label"], feed)
pd.DataFrame({"prediction": label, **{f"score_{j}": scores[:, j] for j in range(scores.shape[1])}}).to_csv(
    sys.argv[3], index=False)
"""


def fresh_venv(where: Path) -> Path:
    """A venv of this Python with only `ONLY` in it (linked from this one's site-packages); its interpreter."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    python = where / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())  # fmt: skip
    for name in ONLY:
        dist = importlib.metadata.distribution(name)
        for top in {Path(str(f)).parts[0] for f in dist.files or []} - {"..", "bin"}:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)
    return python


def test_the_default_registered_model_predicts_with_only_onnxruntime_numpy_and_pandas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow

    root = make_project(tmp_path / "proj", {"train.epochs": 3, "train.progress": "false"})  # builtin:digits
    paths = Paths(root)
    for stage in ("ingest", "split", "train", "evaluate", "register"):
        run_stage(stage, load_params(paths.params), paths)
    # What a serving stack pulls from the registry: the champion's files.
    pulled = Path(mlflow.artifacts.download_artifacts("models:/trainflow-digits@champion", dst_path=str(tmp_path)))
    flavor = yaml.safe_load((pulled / "MLmodel").read_text())["flavors"]["python_function"]
    graph = pulled / flavor["data"] / ONNX
    test = pd.read_parquet(paths.split_file("test"))
    test.drop(columns="target").to_csv(tmp_path / "test.csv", index=False)
    (tmp_path / "serve.py").write_text(SCRIPT)

    python = fresh_venv(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    done = subprocess.run([python, "-I", tmp_path / "serve.py", graph, tmp_path / "test.csv", tmp_path / "out.csv"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = pd.read_csv(tmp_path / "out.csv", dtype={"prediction": str})
    # The labels reproduce evaluate's accuracy; the scores are trainflow predict's (torch) within 1e-5.
    accuracy = float((out["prediction"].to_numpy() == test["target"].astype(str).to_numpy()).mean())
    assert accuracy == read_json(paths.metrics)["accuracy"]
    monkeypatch.chdir(root)
    assert cli.main(["predict", "--model", "models:/trainflow-digits@champion", "--input", str(tmp_path / "test.csv"),
                     "--output", str(tmp_path / "torch.csv"), "--runtime", "torch"]) == 0  # fmt: skip
    expected = pd.read_csv(tmp_path / "torch.csv", dtype={"prediction": str})
    assert out["prediction"].tolist() == expected["prediction"].tolist()
    probabilities = expected[[c for c in expected.columns if c.startswith("proba_")]].to_numpy()
    assert np.max(np.abs(out.filter(like="score_").to_numpy() - probabilities)) <= 1e-5
    assert json.loads((pulled / flavor["data"] / "training.json").read_text())["onnx_not_exported"] is None
