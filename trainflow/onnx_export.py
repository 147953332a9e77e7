"""models/final/model.onnx: the trained model as an ONNX graph, which ONNX Runtime (or any ONNX serving stack: Triton,
ONNX Runtime Server) runs with no trainflow, torch or Python of ours.

The graph starts where preprocessing ends: its inputs are the engine's batch after preprocess.json's steps, one
named input per tensor:

- tables: `features`, float32 [rows, width]: the standardised numeric columns, their missing-value indicators and
  the one-hot categories, in preprocess.json's order;
- text: `tokens`, int64 [rows, length], and `mask`, bool [rows, length]: the ids of tokenizer.json (beside it),
  padded on the right with preprocess.json's pad_id, the mask True on real tokens;
- images: `images`, float32 [rows, channels, height, width]: the decoded pixels (0-255, as floats) minus
  preprocess.json's image_mean, over its image_std, per channel.

Its output `scores` is float64, as `trainflow predict` computes it: class probabilities (the softmax is in the graph)
or, for regression, the value in the target's units (the target's standardisation is undone in the graph).

Why ONNX, and why torch's TorchScript-based exporter: ONNX is what serving stacks load without Python (a
`torch.export` program needs torch to run). The TorchScript-based exporter traces the model in about 0.3 s, needs
only the `onnx` package and gave mlp, cnn, text_transformer and text_bag within 2e-7 of torch; the dynamo-based one
took 6 s for the MLP and needs onnxscript. Its output is the same bytes for the same weights (so an unchanged retrain
still exports byte for byte, and register adds no version).

A model the exporter cannot trace, or whose graph disagrees with torch by more than `TOLERANCE` on the example
batches below (a model whose forward reads values on the host, say: tracing freezes them), gets no model.onnx: the
train stage says so when it trains, and `trainflow predict --runtime onnx` names the reason from training.json.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from trainflow.data.preprocess import Preprocessor

ONNX = "model.onnx"
OPSET = 18
TOLERANCE = 1e-5  # the largest |ONNX Runtime - torch| accepted on the example batches


class Scores(nn.Module):
    """The model, then what `ExportedModel.outputs` does to its outputs, in the graph."""

    def __init__(self, model: nn.Module, pre: Preprocessor, keys: list[str]) -> None:
        super().__init__()
        self.model, self.keys, self.classification = model, keys, pre.task == "classification"
        self.target_mean, self.target_std = float(pre.target_mean or 0.0), float(pre.target_std or 1.0)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        out = self.model(**dict(zip(self.keys, inputs, strict=True))).double()
        if self.classification:
            return torch.softmax(out, dim=-1)
        return out.reshape(-1) * self.target_std + self.target_mean


def signature(pre: Preprocessor) -> tuple[list[str], list[str], dict[str, dict[int, str]]]:
    """The engine's batch keys, the graph's input names and their dynamic axes, for this preprocessing."""
    if pre.text_column is not None:
        axes = {0: "rows", 1: "length"}
        return ["tokens", "mask"], ["tokens", "mask"], {"tokens": axes, "mask": axes}
    if pre.image_column is not None:
        return ["images"], ["images"], {"images": {0: "rows"}}
    return ["x"], ["features"], {"features": {0: "rows"}}


def example_batches(pre: Preprocessor, config: dict[str, Any]) -> list[list[torch.Tensor]]:
    """Inputs of the shapes a model meets: 1, 3 and 17 rows; text of 1, 5 and 11 tokens (at most the model's longest
    sequence) with rows padded to the longest. Random: the check is that the graph computes what torch computes, not
    that the values mean anything."""
    g = torch.Generator().manual_seed(0)
    batches: list[list[torch.Tensor]] = []
    hf_config = config.get("hf_config", {})
    longest = int(config.get("max_len") or hf_config.get("max_position_embeddings") or 11)
    for rows, length in ((1, 1), (3, min(5, longest)), (17, min(11, longest))):
        if pre.text_column is not None:
            vocab = int(config.get("vocab_size") or hf_config.get("vocab_size") or 2)
            lengths = torch.randint(1, length + 1, (rows,), generator=g)
            lengths[0] = length
            mask = torch.arange(length)[None, :] < lengths[:, None]
            tokens = torch.randint(1, max(2, min(vocab, 1000)), (rows, length), generator=g)
            batches.append([torch.where(mask, tokens, pre.pad_id), mask])
        elif pre.image_column is not None:
            height, width = pre.image_size
            batches.append([torch.randn(rows, pre.image_channels, height, width, generator=g)])
        else:
            batches.append([torch.randn(rows, pre.width, generator=g)])
    return batches


def to_onnx(model: nn.Module, pre: Preprocessor, config: dict[str, Any]) -> tuple[bytes | None, str]:
    """The ONNX graph of `model` (on the CPU, in eval mode) with its largest difference from torch on the example
    batches; or None and why not."""
    try:
        import onnxruntime
    except ImportError as exc:
        return None, f"{exc.name} is not installed (pip install onnx onnxruntime)"
    keys, names, axes = signature(pre)
    scores = Scores(model, pre, keys).eval()
    batches = example_batches(pre, config)
    try:
        with warnings.catch_warnings(), tempfile.TemporaryDirectory() as tmp:
            warnings.simplefilter("ignore")  # tracer warnings: the parity check below is what decides
            torch.onnx.export(
                scores, tuple(batches[1]), Path(tmp) / ONNX, input_names=names, output_names=["scores"],
                dynamic_axes={**axes, "scores": {0: "rows"}}, opset_version=OPSET, dynamo=False,
            )  # fmt: skip
            graph = (Path(tmp) / ONNX).read_bytes()
        session = onnxruntime.InferenceSession(graph, providers=["CPUExecutionProvider"])
        worst = 0.0
        with torch.no_grad():
            for batch in batches:
                expected = scores(*batch).numpy()
                (got,) = session.run(None, {name: t.numpy() for name, t in zip(names, batch, strict=True)})
                worst = max(worst, float(np.max(np.abs(got - expected))) if expected.size else 0.0)
    except Exception as exc:  # the exporter and ONNX Runtime raise many kinds; each means "not exportable"
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        return None, f"the exporter failed: {type(exc).__name__}: {first}"
    if not worst <= TOLERANCE:
        return None, f"ONNX Runtime's outputs differ from torch's by {worst:.2e} (more than {TOLERANCE:g})"
    return graph, f"max |ONNX Runtime - torch| {worst:.1e} on the example batches"


class OnnxModel:
    """models/final/model.onnx in ONNX Runtime, scoring the batches `ExportedModel.outputs` makes."""

    def __init__(self, graph: bytes, pre: Preprocessor) -> None:
        import onnxruntime

        self.session = onnxruntime.InferenceSession(graph, providers=["CPUExecutionProvider"])
        self.keys, self.names, _ = signature(pre)

    def __call__(self, **inputs: torch.Tensor) -> np.ndarray:
        feed = {name: inputs[key].cpu().numpy() for key, name in zip(self.keys, self.names, strict=True)}
        (out,) = self.session.run(None, feed)
        return np.asarray(out)
