"""The registered model's loader, and the checked way to load or serve a registered version.

MLflow imports this module from the *installed* trainflow (the MLmodel file names `loader_module: trainflow.serving`,
and the model's requirements pin trainflow's version) and calls `_load_pyfunc` with the model's data, models/final as
the train stage exported it: safetensors, ONNX and JSON, nothing pickled. No Python of trainflow's is stored with
the model (a user model's own module travels with it, as it must: `tracking.log_pyfunc`).

That alone does not keep the artifact store's writers from running code: MLflow reads MLmodel first, and an MLmodel
changed to `code: code` beside a planted `code/trainflow/serving.py` makes `mlflow.pyfunc.load_model` import the
planted file. So `load` and `download` fetch a registered version's files into a fresh folder and check them against
the manifest the registry recorded at registration (`trainflow.artifacts.manifest`) before MLflow reads any of them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from trainflow.artifacts.predict import ExportedModel
from trainflow.core.errors import UserError


class TrainflowModel:
    """What MLflow's pyfunc wraps: `predict` scores a frame (or MLflow's JSON input) as `trainflow predict` does."""

    def __init__(self, exported: ExportedModel) -> None:
        self.exported = exported

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> pd.DataFrame:
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        return self.exported.predict_frame(frame)


def _load_pyfunc(data_path: str) -> TrainflowModel:
    return TrainflowModel(ExportedModel.load(Path(data_path)))


def checked(model: str) -> Path:
    """A fresh local folder holding the files of registered version `model` (models:/<name>@<alias>,
    models:/<name>/<version>), each checked against the registry's manifest. Refused (UserError) when one differs,
    and when no manifest vouches for them: MLflow's loading would run what their MLmodel names."""
    from trainflow.artifacts import manifest

    if not model.startswith("models:/"):
        raise UserError(
            f"{model}: not a registry URI; trainflow.serving loads a registered version (models:/<name>@champion, "
            "models:/<name>/<version>), whose files the registry's manifest vouches for"
        )
    local, version, ok = manifest.fetch(model)
    if ok:
        return local
    raise UserError(
        f"model {model}: no manifest vouches for its files ({manifest.unchecked(version)}), and MLflow's loading "
        f"would run whatever its MLmodel names. `trainflow predict --model {model} ...` scores it reading data only; "
        f"`mlflow.pyfunc.load_model('{model}')` loads it unchecked, if you trust the artifact store"
    )


def load(model: str) -> Any:
    """The registered version `model` as an MLflow pyfunc (`.predict(frame)`), loaded by MLflow from a local copy of
    its files only once each was checked against the registry's manifest (`checked`). What the run summary and the
    model card print to load a model."""
    import mlflow.pyfunc

    return mlflow.pyfunc.load_model(str(checked(model)))


def download(model: str, dest: Path) -> Path:
    """The checked files of registered version `model` (`checked`), copied into `dest` (which must not exist), for
    `mlflow models serve -m <dest>`: MLflow then serves files that were checked, never the store's."""
    if dest.exists():
        raise UserError(f"{dest}: already exists; name a folder that does not, for the model's files")
    shutil.copytree(checked(model), dest)
    return dest
