"""MLflow models-from-code entry: a pyfunc over the safetensors weights and JSON preprocessing (no pickle).

MLflow executes this file when it loads the logged model; the exported model directory travels as an artifact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from mlflow.models import set_model
from mlflow.pyfunc import PythonModel

from trainflow.predict import ExportedModel


class TrainflowModel(PythonModel):
    def load_context(self, context: Any) -> None:
        self.exported = ExportedModel.load(Path(context.artifacts["model_dir"]))

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        return self.exported.predict_frame(frame)


set_model(TrainflowModel())
