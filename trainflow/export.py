"""models/final, written: the weights as safetensors, the model's config, preprocessing and schema as JSON, and the
training summary (`trainflow.predict` reads it back). `model_config` decides the architecture the weights belong to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from trainflow.data.preprocess import Preprocessor
from trainflow.data.schema import Schema
from trainflow.errors import UserError
from trainflow.io import atomic_dir, write_json
from trainflow.params import PipelineParams
from trainflow.predict import CONFIG, WEIGHTS


def model_config(params: PipelineParams, pre: Preprocessor) -> dict[str, Any]:
    """The model's JSON config: what build_model() needs to rebuild it at evaluation and prediction."""
    m = params.model
    name = m.name
    if name == "auto":
        name = "text_transformer" if pre.text_column else "mlp"
    outputs = len(pre.classes) if pre.task == "classification" else 1
    if name == "mlp" and pre.text_column:
        raise UserError(
            f"model.name mlp takes a table of features, but data.text_column is {pre.text_column!r}; "
            "use model.name: text_transformer (or auto)"
        )
    if name == "text_transformer" and not pre.text_column:
        raise UserError("model.name text_transformer needs text: set data.text_column (or use model.name: auto)")
    config: dict[str, Any] = {"name": name, "out_features": outputs}
    if name == "text_transformer":
        config |= {
            "vocab_size": pre.vocab_size,
            "max_len": params.features.max_length + 1,  # + [CLS]
            "d_model": m.d_model,
            "n_heads": m.n_heads,
            "n_layers": m.n_layers,
            "dropout": m.dropout,
        }
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
    """models/final: weights as safetensors, model config and preprocessing as JSON. Nothing here is pickled."""
    with atomic_dir(dest) as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in weights.items()}, str(tmp / WEIGHTS))
        write_json(tmp / CONFIG, config)
        pre.save(tmp)
        write_json(tmp / "schema.json", schema.to_json())
        write_json(tmp / "training.json", summary)
