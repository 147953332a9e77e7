"""Load the exported model (safetensors + JSON, no pickle) and score a table with its saved preprocessing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file
from torch import nn

from trainflow.data.preprocess import Preprocessor
from trainflow.errors import UserError
from trainflow.io import read_json
from trainflow.models import build_model

WEIGHTS, CONFIG, PREPROCESS = "model.safetensors", "model.json", "preprocess.json"


@dataclass
class ExportedModel:
    model: nn.Module
    pre: Preprocessor

    @classmethod
    def load(cls, directory: Path) -> ExportedModel:
        for name in (WEIGHTS, CONFIG, PREPROCESS):
            if not (directory / name).is_file():
                raise UserError(f"model {directory}: {name} is missing; run `trainflow stage train` first")
        model = build_model(read_json(directory / CONFIG))
        model.load_state_dict(load_file(str(directory / WEIGHTS)))
        model.eval()
        return cls(model, Preprocessor.load(directory / PREPROCESS))

    @torch.no_grad()
    def predict_proba(self, frame: pd.DataFrame, batch_size: int = 4096) -> np.ndarray:
        x = torch.from_numpy(self.pre.features_array(frame))
        # Softmax in float64 so each row sums to one to the precision metrics such as log-loss expect.
        parts = [torch.softmax(self.model(xb).double(), dim=1) for xb in x.split(batch_size)]
        return torch.cat(parts).numpy() if parts else np.zeros((0, len(self.pre.classes)))

    def predict_frame(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The input rows plus `prediction` and one `proba_<class>` column per class."""
        proba = self.predict_proba(frame)
        out = frame.copy()
        out["prediction"] = np.asarray(self.pre.classes, dtype=object)[proba.argmax(axis=1)]
        for i, c in enumerate(self.pre.classes):
            out[f"proba_{c}"] = proba[:, i]
        return out
