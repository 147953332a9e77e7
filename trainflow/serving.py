"""The registered model's loader: MLflow imports this module from the *installed* trainflow (the MLmodel file names
`loader_module: trainflow.serving`, and the model's requirements pin trainflow's version) and calls `_load_pyfunc`
with the model's data, models/final as the train stage exported it: safetensors, ONNX and JSON, nothing pickled.

No Python of trainflow's is stored with the model, so whoever can write to the artifact store cannot make a machine
that loads the model run code. (Versions registered before this, as MLflow models-from-code, carry their code; a
user model's own module travels with the model, as it must: `tracking.log_pyfunc`.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from trainflow.predict import ExportedModel


class TrainflowModel:
    """What MLflow's pyfunc wraps: `predict` scores a frame (or MLflow's JSON input) as `trainflow predict` does."""

    def __init__(self, exported: ExportedModel) -> None:
        self.exported = exported

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> pd.DataFrame:
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        return self.exported.predict_frame(frame)


def _load_pyfunc(data_path: str) -> TrainflowModel:
    return TrainflowModel(ExportedModel.load(Path(data_path)))
