"""model: the architecture, built-in or the user's own."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, model_validator

from trainflow.params.base import Section

MODEL_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
BUILTIN_MODEL_CODE = "trainflow/models"


class ModelParams(Section):
    name: str = Field(
        "auto",
        description="auto (for text: text_bag on a CPU, text_transformer on a GPU; cnn for images; else mlp; the "
        "train stage prints its choice), mlp (a multilayer perceptron for tables), text_transformer (a Transformer "
        "encoder for text), text_bag (the mean of the embeddings of a text's subword tokens and token pairs, "
        "fastText-like: seconds on a CPU), cnn (a small "
        "residual convolutional net for images), hf:<directory or hub id> (a pretrained Hugging Face Transformers "
        "model fine-tuned on data.text_column with its own tokenizer: a save_pretrained directory, relative to the "
        "project or absolute, or a hub id in the local Hugging Face cache; nothing is downloaded), or a user model "
        "by import path package.module:Class, built with `kwargs`.",
    )
    hidden_sizes: list[int] = Field(
        default_factory=lambda: [256, 128], min_length=1, description="mlp: width of each hidden layer."
    )
    dropout: float = Field(0.1, ge=0, lt=1, description="Dropout probability (mlp and text_transformer).")
    d_model: int = Field(128, ge=8, description="text_transformer and text_bag: width of token representations.")
    n_heads: int = Field(4, ge=1, description="text_transformer: attention heads; must divide d_model.")
    n_layers: int = Field(2, ge=1, description="text_transformer: encoder blocks.")
    cnn_channels: list[int] = Field(
        default_factory=lambda: [32, 64],
        min_length=1,
        description="cnn: channels of each stage (the first after a 3x3 conv stem); every stage after the first "
        "halves the height and width.",
    )
    cnn_blocks: int = Field(1, ge=1, description="cnn: residual blocks (two 3x3 convs and a skip) per stage.")
    cnn_norm: Literal["batch", "group"] = Field(
        "batch",
        description="cnn: normalisation after each conv: batch (BatchNorm; statistics of the batch in training, "
        "running averages at evaluation) or group (GroupNorm, 8 groups; the same in both, any batch size).",
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra keyword arguments for the model's constructor (user models; overrides for built-ins).",
    )
    code: str = Field(
        BUILTIN_MODEL_CODE,
        min_length=1,
        description="The source of the model, relative to the project root: a user model's module file or package "
        "(mymodels.py for mymodels:TinyNet). The train stage depends on it (dvc.yaml), so editing it retrains; "
        "the default is trainflow's own models.",
    )

    @model_validator(mode="after")
    def _valid(self) -> ModelParams:
        hf = self.name.startswith("hf:")
        if hf and not self.name[3:].strip():
            raise ValueError("model.name hf: needs the model's directory or hub id after it, e.g. hf:models/tiny-bert")
        if (
            self.name not in ("auto", "mlp", "text_transformer", "text_bag", "cnn")
            and not hf
            and not MODEL_PATH.match(self.name)
        ):
            raise ValueError(
                "model.name must be auto, mlp, text_transformer, text_bag, cnn, hf:<directory> or an import path "
                f"package.module:Class, got {self.name!r}"
            )
        if any(h <= 0 for h in self.hidden_sizes):
            raise ValueError(f"model.hidden_sizes must all be positive, got {self.hidden_sizes}")
        if any(c <= 0 for c in self.cnn_channels):
            raise ValueError(f"model.cnn_channels must all be positive, got {self.cnn_channels}")
        if self.d_model % self.n_heads:
            raise ValueError(f"model.n_heads ({self.n_heads}) must divide model.d_model ({self.d_model})")
        if not hf and MODEL_PATH.match(self.name) and self.code == BUILTIN_MODEL_CODE:
            module = self.name.partition(":")[0]
            raise ValueError(
                f"model.name {self.name!r} is your model: set model.code to its source so that editing it retrains, "
                f"e.g. -S model.code={module.replace('.', '/')}.py (or the package directory)"
            )
        return self
