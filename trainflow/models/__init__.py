"""Built-in models and build_model(). A model's config is plain JSON so it can be rebuilt without pickle.

Forward signatures: table models take `x` [N, F] (float); text models take `tokens` [N, L] (long) and `mask` [N, L]
(bool, True for real tokens); image models take `images` [N, C, H, W] (float, normalised). A user model named by import
path follows the same convention.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainflow.core.errors import UserError


class MLP(nn.Module):
    """Linear → GELU → Dropout per hidden layer, then a linear head producing logits."""

    def __init__(self, in_features: int, out_features: int, hidden_sizes: list[int], dropout: float) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for h in hidden_sizes:
            layers += [nn.Linear(width, h), nn.GELU(), nn.Dropout(dropout)]
            width = h
        layers.append(nn.Linear(width, out_features))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


OFFERED = ("in_features", "out_features", "vocab_size", "pad_id", "in_channels", "image_size")


def model_class(name: str) -> type[nn.Module]:
    """mlp, text_transformer, text_bag, cnn, hf (a pretrained Transformers model: trainflow.models.hf), or a user
    model's class by import path `package.module:Class`."""
    if name == "mlp":
        return MLP
    if name == "text_transformer":
        from trainflow.models.text import TextTransformer

        return TextTransformer
    if name == "text_bag":
        from trainflow.models.text import TextBag

        return TextBag
    if name == "cnn":
        from trainflow.models.cnn import CNN

        return CNN
    if name == "hf":
        from trainflow.models.hf import HFSequenceModel

        return HFSequenceModel
    module_name, _, attr = name.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"model.name {name!r}: cannot import it ({exc}); is the package installed?") from None
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise UserError(f"model.name {name!r} is not a torch.nn.Module subclass")
    return cls


def build_model(config: dict[str, Any]) -> nn.Module:
    """Rebuild a model from its JSON config: {"name": ..., plus the constructor's keyword arguments}.

    The data-derived sizes (OFFERED) go only to constructors that take them; anything else is passed as given, so a
    misspelt keyword is an error, not silently dropped.
    """
    kwargs = dict(config)
    cls = model_class(kwargs.pop("name"))
    sig = inspect.signature(cls.__init__)
    if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in sig.parameters or k not in OFFERED}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise UserError(f"model {config['name']!r}: cannot build it with {kwargs} ({exc}); see model.kwargs") from None


def source_files(path: Path) -> list[Path]:
    """The Python source of a module file or a package directory (its .py files, sorted)."""
    if path.is_dir():
        return sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)
    return [path]


def source_hash(files: list[Path], relative_to: Path) -> str:
    """One hash over the files' paths (relative to `relative_to`) and bytes."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(relative_to).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def user_source(model: nn.Module) -> dict[str, str] | None:
    """For a model whose class is not trainflow's: its module, where its source is (the module's file, or its
    package's directory) and the hash of that source. None for built-in models."""
    cls = type(model)
    if cls.__module__.split(".")[0] == "trainflow":
        return None
    module = importlib.import_module(cls.__module__)
    file = Path(inspect.getfile(module)).resolve()
    top = module.__name__.split(".")[0]
    where = Path(inspect.getfile(importlib.import_module(top))).resolve()
    source = where.parent if where.name == "__init__.py" else where  # a package travels whole
    return {
        "module": module.__name__,
        "source": str(source),
        "sha256": source_hash(source_files(source), source.parent),
        "file": str(file),
    }
