"""The registered model as MLflow models-from-code (register.flavor: code): MLflow runs this file, stored with the
model, each time it loads it, with trainflow's package stored beside it (`code_paths`) first on the path, so a
machine without trainflow installed can load and serve the model. The price: whoever can write to the artifact store
can make every machine that loads the model with MLflow alone run their code (`trainflow.serving.load` checks the
stored files against the registry's manifest first, but needs trainflow installed). The default flavour (`package`)
stores no code: `trainflow.serving`. `trainflow predict` never runs this file; it reads the model's data
(`predict.load`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from mlflow.models import set_model
from mlflow.pyfunc import PythonModel

from trainflow.artifacts.predict import ExportedModel
from trainflow.serving import TrainflowModel


class CodeModel(PythonModel):
    def load_context(self, context: Any) -> None:
        self.model = TrainflowModel(ExportedModel.load(Path(context.artifacts["model_dir"])))

    def predict(self, context: Any, model_input: Any, params: dict[str, Any] | None = None) -> pd.DataFrame:
        return self.model.predict(model_input, params)


set_model(CodeModel())
