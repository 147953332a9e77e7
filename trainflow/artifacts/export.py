"""models/final, written: the weights as safetensors, the model as an ONNX graph (`trainflow.artifacts.onnx`), the
model's config, preprocessing and schema as JSON, and the training summary (`trainflow.artifacts.predict` reads it
back). `model_config` decides the architecture the weights belong to."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from trainflow.artifacts.onnx import ONNX, to_onnx
from trainflow.artifacts.predict import CONFIG, WEIGHTS
from trainflow.core.errors import UserError
from trainflow.core.io import atomic_dir, write_json
from trainflow.data.preprocess import Preprocessor
from trainflow.data.schema import Schema
from trainflow.models import build_model, hf
from trainflow.params import FeatureParams, ModelParams


def auto_model(pre: Preprocessor, device: torch.device) -> tuple[str, str]:
    """model.name auto: the model for this data on this device, and why (the train stage prints both)."""
    if pre.text_column and device.type == "cpu":
        return "text_bag", (
            "text on a CPU: a bag of subword and token-pair embeddings trains in seconds (a Transformer takes "
            "minutes there); set model.name: text_transformer for one"
        )
    if pre.text_column:
        return "text_transformer", f"text on {device.type}: a Transformer encoder"
    if pre.image_column:
        return "cnn", "images: a small residual convolutional net"
    return "mlp", "a table of features: a multilayer perceptron"


def model_config(
    m: ModelParams,
    features: FeatureParams,
    pre: Preprocessor,
    pretrained: Path | None = None,
    device: torch.device | None = None,
) -> dict[str, Any]:
    """The model's JSON config: what build_model() needs to rebuild it at evaluation and prediction. `pretrained`: the
    directory of model.name hf:... (`trainflow.models.hf.resolve`); `device`: where it trains (model.name auto picks
    by it; default CPU)."""
    name = m.name
    if hf.is_hf(name):
        if not pre.text_column or pretrained is None:
            raise UserError(f"model.name {name} fine-tunes a pretrained model on text: set data.text_column")
        outputs = len(pre.classes) if pre.task == "classification" else 1
        settings = hf.config(pretrained, pre.classes, outputs, features.max_length)
        return {"name": hf.NAME, "out_features": outputs, **settings, "pretrained": str(pretrained)} | m.kwargs
    if name == "auto":
        name, _ = auto_model(pre, device or torch.device("cpu"))
    outputs = len(pre.classes) if pre.task == "classification" else 1
    if name == "mlp" and pre.text_column:
        raise UserError(
            f"model.name mlp takes a table of features, but data.text_column is {pre.text_column!r}; "
            "use model.name: text_transformer or text_bag (or auto)"
        )
    if name in ("text_transformer", "text_bag") and not pre.text_column:
        raise UserError(f"model.name {name} needs text: set data.text_column (or use model.name: auto)")
    if name in ("mlp", "text_transformer", "text_bag") and pre.image_column:
        raise UserError(f"model.name {name} does not take images (column {pre.image_column!r}); use cnn (or auto)")
    if name == "cnn" and not pre.image_column:
        raise UserError("model.name cnn needs images: a folder of class folders, builtin:digits_images or "
                        "data.image_column (or use model.name: auto)")  # fmt: skip
    config: dict[str, Any] = {"name": name, "out_features": outputs}
    if name == "text_transformer":
        config |= {
            "vocab_size": pre.vocab_size,
            "max_len": features.max_length + 1,  # + [CLS]
            "d_model": m.d_model,
            "n_heads": m.n_heads,
            "n_layers": m.n_layers,
            "dropout": m.dropout,
        }
    elif name == "text_bag":
        config |= {"vocab_size": pre.vocab_size, "d_model": m.d_model, "dropout": m.dropout}
    elif pre.image_column:  # the cnn, or a user model of images
        config |= {"in_channels": pre.image_channels, "image_size": pre.image_size}
        if name == "cnn":
            config |= {"channels": m.cnn_channels, "blocks": m.cnn_blocks, "norm": m.cnn_norm}
    else:
        config["in_features"] = pre.width
        if name == "mlp":
            config |= {"hidden_sizes": m.hidden_sizes, "dropout": m.dropout}
    return config | m.kwargs


def export(
    weights: dict[str, torch.Tensor],
    config: dict[str, Any],
    pre: Preprocessor,
    schema: Schema,
    summary: dict[str, Any],
    dest: Path,
) -> None:
    """models/final: weights as safetensors and ONNX, model config and preprocessing as JSON. Nothing here is pickled.

    A pretrained model's config loses `pretrained` (where its starting weights were): the weights exported replace
    them, so predicting and serving need no copy of that directory (training.json records it).

    A model that cannot be exported as ONNX is said so here, at train time, and training.json's `onnx_not_exported`
    keeps why (None when model.onnx is written)."""
    config = {k: v for k, v in config.items() if k != "pretrained"}
    weights = {k: v.detach().cpu().contiguous() for k, v in weights.items()}
    model = build_model(config)
    model.load_state_dict(weights)
    graph, note = to_onnx(model.eval(), pre, config)
    if graph is None:
        print(f"train: {ONNX} not written ({note}); `trainflow predict --runtime onnx` and ONNX serving will not "
              "work for this model, the torch runtime will", file=sys.stderr)  # fmt: skip
    summary = {**summary, "onnx_not_exported": None if graph is not None else note}
    with atomic_dir(dest) as tmp:
        save_file(weights, str(tmp / WEIGHTS))
        if graph is not None:
            (tmp / ONNX).write_bytes(graph)
        write_json(tmp / CONFIG, config)
        pre.save(tmp)
        write_json(tmp / "schema.json", schema.to_json())
        write_json(tmp / "training.json", summary)
