"""Load the exported model (safetensors + JSON, no pickle) and score a table with its saved preprocessing.

The train, evaluate and register stages import this module, so it holds no file I/O of its own
(`trainflow.artifacts.batch_predict` reads
and writes the files of `trainflow predict`): what the stages depend on stays what they use.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from trainflow.artifacts.onnx import ONNX, OnnxModel
from trainflow.core.errors import UserError
from trainflow.core.io import read_json
from trainflow.data.preprocess import Preprocessor
from trainflow.engine.loaders import Batch, ImageData, TensorData, TextData
from trainflow.models import build_model, user_source

WEIGHTS, CONFIG = "model.safetensors", "model.json"
# Rows scored per forward pass, by evaluate (evaluate.batch_size), `trainflow predict` and the served model alike:
# the same batches give bit-identical outputs, so a prediction can be checked against what evaluate scored.
BATCH_SIZE = 1024
# Images whose decoded pixels take at most this many bytes are decoded once, up front; more are decoded batch by batch
# in a background thread (ImageData).
DECODE_ONCE_BYTES = 1 << 30


def model_inputs(
    pre: Preprocessor,
    frame: pd.DataFrame,
    where: str,
    with_labels: bool,
    base: Path | None = None,
    normalise: bool = True,
) -> TensorData | TextData | ImageData:
    """The engine's dataset for `frame`: token sequences when the schema has a text column, images when it has an image
    column (paths relative to `base`, default the working directory; `normalise` False: the pixels as they are, for a
    graph that normalises them itself), else the feature matrix."""
    if with_labels:
        y = torch.from_numpy(
            pre.scale_target(pre.labels(frame, where)) if pre.task == "regression" else pre.labels(frame, where)
        )
    else:
        y = torch.zeros(len(frame), dtype=torch.long)
    if pre.text_column is not None:
        return TextData([torch.from_numpy(t) for t in pre.tokens(frame, where)], y, pad_id=pre.pad_id)
    if pre.image_column is not None:
        return image_inputs(pre, frame, y, where, base, normalise)
    return TensorData(torch.from_numpy(pre.features(frame, where)), y)


def image_inputs(
    pre: Preprocessor, frame: pd.DataFrame, y: torch.Tensor, where: str, base: Path | None, normalise: bool = True
) -> ImageData:
    values, names = pre.image_source(frame, where, base)
    channels, (height, width) = pre.image_channels, pre.image_size
    mean, std = (pre.image_mean, pre.image_std) if normalise else ([0.0] * channels, [1.0] * channels)
    if len(values) * channels * height * width <= DECODE_ONCE_BYTES:
        return ImageData(torch.from_numpy(pre.decode(values, names, where)), y, mean, std)

    def decode(rows: list[int]) -> torch.Tensor:
        return torch.from_numpy(pre.decode([values[i] for i in rows], [names[i] for i in rows], where))

    return ImageData(decode, y, mean, std)


@dataclass
class ExportedModel:
    model: nn.Module
    pre: Preprocessor
    directory: Path | None = None  # where it was loaded from (models/final, or a registered version's artifacts)
    onnx: OnnxModel | None = None  # set: outputs() runs model.onnx in ONNX Runtime instead of the torch model

    @classmethod
    def load(cls, directory: Path) -> ExportedModel:
        for name in (WEIGHTS, CONFIG):
            if not (directory / name).is_file():
                raise UserError(f"model {directory}: {name} is missing; run `trainflow stage train` first")
        repair = (
            "restore it (`dvc checkout --force models/final` in the project that trained it) or train it again "
            "(`trainflow stage train`)"
        )
        try:
            config = read_json(directory / CONFIG)
        except ValueError as exc:  # json.JSONDecodeError
            raise UserError(f"model {directory}: {CONFIG} is not valid JSON ({exc}); {repair}") from None
        model = build_model(config)
        _check_source(model, directory)
        try:
            weights = load_file(str(directory / WEIGHTS))
        except (SafetensorError, OSError) as exc:
            raise UserError(f"model {directory}: {WEIGHTS} is corrupt or truncated ({exc}); {repair}") from None
        try:
            model.load_state_dict(weights)
        except RuntimeError as exc:  # a tensor missing, extra or of another shape
            first = str(exc).splitlines()[0:2]
            raise UserError(
                f"model {directory}: {WEIGHTS} does not fit {CONFIG} ({' '.join(first)}); {repair}"
            ) from None
        model.eval()
        return cls(model, Preprocessor.load(directory), directory)

    def on_onnx(self, model: str | None = None) -> ExportedModel:
        """The same model, scored by ONNX Runtime from the model.onnx exported beside its weights. `model`: what the
        user named it by (a registry URI or a directory), for the message when there is no graph."""
        assert self.directory is not None, "on_onnx needs a model loaded from a directory"
        path = self.directory / ONNX
        if path.is_file():
            return replace(self, onnx=OnnxModel(path.read_bytes(), self.pre))
        training = self.directory / "training.json"
        why = read_json(training).get("onnx_not_exported") if training.is_file() else None
        registered = model is not None and ":/" in model
        name = model if registered else self.directory
        if why:
            said = f"the train stage could not export it: {why}); score it with --runtime torch"
        elif registered:
            said = ("registered before trainflow exported ONNX); score it with --runtime torch, or name a version "
                    "registered since (`trainflow models list`)")  # fmt: skip
        else:
            said = "trained before trainflow exported ONNX); `trainflow stage train` exports it, or use --runtime torch"
        raise UserError(f"model {name}: no {ONNX} ({said}")

    @torch.no_grad()
    def outputs(
        self, frame: pd.DataFrame, batch_size: int = BATCH_SIZE, where: str = "input", base: Path | None = None
    ) -> np.ndarray:
        """Raw model outputs in float64: class probabilities (softmax) or regression values (in target units). Image
        paths are relative to `base` (default: the working directory)."""
        if self.onnx is not None and self.onnx.raw:  # a table: the graph preprocesses its raw columns itself
            columns = self.pre.typed_columns(frame, where)
            scored = [self.onnx.feed({k: v[lo : lo + batch_size] for k, v in columns.items()})
                      for lo in range(0, len(frame), batch_size)]  # fmt: skip
            if scored:
                return np.concatenate(scored)
        normalise = self.onnx is None or self.onnx.normalised
        data = model_inputs(self.pre, frame, where, with_labels=False, base=base, normalise=normalise)
        parts = []
        for start in range(0, len(data), batch_size):
            batch: Batch = data.batch(torch.arange(start, min(start + batch_size, len(data))))
            if self.onnx is not None:  # the graph does the softmax and the target's unscaling, in float64 too
                parts.append(torch.from_numpy(self.onnx(**batch.inputs)))
                continue
            out = self.model(**batch.inputs).double()
            # Softmax in float64 so each row sums to one to the precision metrics such as log-loss expect.
            parts.append(torch.softmax(out, dim=1) if self.pre.task == "classification" else out.reshape(-1))
        if not parts:
            width = len(self.pre.classes) if self.pre.task == "classification" else 0
            return np.zeros((0, width)) if width else np.zeros(0)
        values = torch.cat(parts).numpy()
        return values if self.pre.task == "classification" or self.onnx is not None else self.pre.unscale_target(values)

    def predict_frame(
        self, frame: pd.DataFrame, batch_size: int = BATCH_SIZE, where: str = "input", base: Path | None = None
    ) -> pd.DataFrame:
        """The input rows plus `prediction` (and one `proba_<class>` column per class for classification)."""
        values = self.outputs(frame, batch_size, where, base)
        out = frame.copy()
        if self.pre.task == "regression":
            out["prediction"] = values
            return out
        out["prediction"] = np.asarray(self.pre.classes, dtype=object)[values.argmax(axis=1)]
        for i, c in enumerate(self.pre.classes):
            out[f"proba_{c}"] = values[:, i]
        return out


def _check_source(model: nn.Module, directory: Path) -> None:
    """A user model's weights fit the code they were trained with: refuse them if that code changed since."""
    training = directory / "training.json"
    trained = read_json(training).get("model_source") if training.is_file() else None
    now = user_source(model)
    if trained is None or now is None or now["sha256"] == trained["sha256"]:
        return
    raise UserError(
        f"model {directory}: it was trained with another version of {trained['module']} ({now['source']} changed "
        "since); retrain it (`trainflow stage train`, or `trainflow run`) before evaluating or predicting with it"
    )


def load(model: str) -> ExportedModel:
    """A model by MLflow URI (`models:/<name>@champion`, `models:/<name>/<version>`, `runs:/...`) or by the path of an
    exported model directory (models/final). A registered version's files are fetched and checked against the
    registry's manifest of them first (`trainflow.artifacts.manifest`: refused, naming each file changed, added or
    missing);
    its exported directory is then read as data: nothing stored with it is imported or unpickled, also for versions
    registered as models-from-code."""
    if ":/" not in model:
        directory = Path(model)
        if not directory.is_dir():
            raise UserError(
                f"--model {model}: no such directory; give an exported model directory (models/final) or a "
                "registered model URI such as models:/<name>@champion"
            )
        return ExportedModel.load(directory)
    import yaml

    from trainflow.artifacts import manifest

    local, version, checked = manifest.fetch(model)
    if not checked:
        manifest.warn_unchecked(model, version)
    spec = yaml.safe_load((local / "MLmodel").read_text()) if (local / "MLmodel").is_file() else None
    flavor = (spec or {}).get("flavors", {}).get("python_function", {})
    if flavor.get("loader_module") == "trainflow.serving" and "data" in flavor:
        return ExportedModel.load(local / flavor["data"])
    earlier = flavor.get("artifacts", {}).get("model_dir", {}).get("path")  # registered as models-from-code
    if earlier is not None and (local / earlier / CONFIG).is_file():
        return ExportedModel.load(local / earlier)
    raise UserError(f"--model {model}: not a trainflow model (its python_function flavor is {flavor or 'missing'})")
