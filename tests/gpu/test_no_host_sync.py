"""No host sync in `train_step` on a real GPU, for tables (mlp), text (text_transformer), images (cnn) and hf: models,
fp32, bf16 and fp16, accumulation 1 and 4, adamw and sgd.

Under `torch.cuda.set_sync_debug_mode("error")` every CUDA call that makes the host wait for the device raises: a
device-to-host copy (.item(), bool(), float(), .tolist(), nonzero, boolean-mask indexing) or a synchronize.
tests/engine/test_host_sync.py finds, on the CPU, the ops that would wait; this finds the waits themselves, in what
runs on the GPU: its kernels, autocast, the GradScaler, the fused optimizers, Transformers' attention. A non-finite
update is skipped inside the guarded steps, so the skip path runs under it too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dist_ranks
import pytest
import torch
from engine_kit import mlp, table, text_data, text_model
from support.host_sync import poison, windows
from torch import nn

from trainflow.engine.loaders import Dataset
from trainflow.engine.objective import Objective
from trainflow.engine.trainer import Trainer
from trainflow.models.cnn import CNN

from .gpu_kit import CUDA, cuda_trainer

WARM_UP, GUARDED = 2, 4  # windows: the first calls create cuBLAS handles and caches; then the guarded ones
POISONED = WARM_UP + 2  # 1-based: a guarded window whose gradients become inf
N = 16 * (WARM_UP + GUARDED)  # samples: windows of 16


@contextlib.contextmanager
def no_host_sync() -> Iterator[None]:
    """Any CUDA call in the block that makes the host wait for the GPU raises a RuntimeError."""
    torch.cuda.synchronize()  # what was queued before the block is not the block's
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def model_and_data(kind: str) -> tuple[nn.Module, Dataset, torch.Tensor, int]:
    """The model, N samples on the GPU, the parameter whose gradient gets poisoned, and the number of classes."""
    if kind == "table":
        model: nn.Module = mlp()
        data: Dataset = table(n=N)
        first = dict(model.named_parameters())["net.0.weight"]
        classes = 3
    elif kind == "text":
        model = text_model("token")
        data = text_data(n=N)
        first = dict(model.named_parameters())["head.weight"]
        classes = 4
    else:
        # torch's BatchNorm with momentum None reads its batch count on the host every forward (dist_ranks sets it
        # on one layer, to test the merged statistics): the cnn as the pipeline builds it keeps the default.
        torch.manual_seed(5)
        model = CNN(2, 3, [8, 16], 1, image_size=[6, 5])
        data = dist_ranks.images(N, seed=1)
        first = next(model.parameters())
        classes = 3
    data.to(CUDA)  # type: ignore[attr-defined]
    return model, data, first, classes


def run_guarded(t: Trainer, data: Dataset, first: torch.Tensor, batch_size: int, accumulate: int) -> None:
    t.prepare(data)
    poison(first, {POISONED}, accumulate)
    steps = windows(data, batch_size, accumulate, WARM_UP + GUARDED)  # batching is data preparation: before the guard
    for micro in steps[:WARM_UP]:
        t.train_step(micro)
    with no_host_sync():
        for micro in steps[WARM_UP:]:
            t.train_step(micro)
    assert t.decide_on_device
    assert t.counters.applied == WARM_UP + GUARDED - 1  # the poisoned window skipped, decided on the device


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
@pytest.mark.parametrize("accumulate", [1, 4])
@pytest.mark.parametrize("kind", ["table", "text", "image"])
def test_train_step_never_waits_for_the_gpu(
    tmp_path: Path, kind: str, accumulate: int, optimizer: str, precision: str
) -> None:
    model, data, first, classes = model_and_data(kind)
    batch_size = 16 // accumulate
    # With accumulation, also the regularisers: per-group rates, the weight EMA, a smoothed and weighted loss.
    extras: dict[str, Any] = {}
    if accumulate > 1:
        groups: dict[str, dict[str, Any]] = {
            "text": {"layer_decay": 0.8},
            "table": {"param_groups": [{"match": "net.0.*", "lr_scale": 0.5}]},
        }
        extras = {**groups.get(kind, {}), "ema_decay": 0.9}
    t = cuda_trainer(tmp_path, model, precision=precision, optimizer=optimizer, batch_size=batch_size,
                     accumulate=accumulate, **extras)  # fmt: skip
    if accumulate > 1:
        weights = torch.tensor([1.0, 2.0, 0.5, 1.0][:classes], device=CUDA)
        t.objective = Objective("classification", label_smoothing=0.1, class_weights=weights)
    run_guarded(t, data, first, batch_size, accumulate)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama"])
def test_an_hf_model_step_never_waits_for_the_gpu(tmp_path: Path, kind: str, attention: str) -> None:
    """Tiny random Transformers models built here (no download), as tests/engine/test_host_sync.py builds them:
    an encoder and two decoders, activation checkpointing and layer decay on, as users run them."""
    from support.tiny_models import tiny_bert, tiny_decoder

    from trainflow.models import hf

    words = [f"w{i}" for i in range(40)]
    if kind == "bert":
        directory = tiny_bert(tmp_path / kind, words, labels=4)
    else:
        directory = tiny_decoder(tmp_path / kind, words, kind=kind, labels=4)
    model = hf.HFSequenceModel(4, hf.config(directory, ["a", "b", "c", "d"], 4, 64)["hf_config"], str(directory))
    model.model.set_attn_implementation(attention)
    model.activation_checkpointing(True)
    data = text_data(n=N, per_token=False, vocab=40)
    data.to(CUDA)
    t = cuda_trainer(tmp_path / "ckpt", model, batch_size=8, accumulate=2, layer_decay=0.8)
    run_guarded(t, data, [*model.parameters()][-1], 8, 2)  # the head's: outside the recomputed layers


def test_the_guard_catches_a_sync_added_to_the_step(tmp_path: Path) -> None:
    """The guard itself can fail on this GPU: one `.item()` slipped into the update (after clipping) is caught."""
    model, data, _, _ = model_and_data("table")
    t = cuda_trainer(tmp_path, model, batch_size=16)
    t.prepare(data)
    step = windows(data, 16, 1, 2)
    t.train_step(step[0])
    clip = t._clip_gradients

    def clip_then_sync() -> torch.Tensor:
        norm = clip()
        norm.item()
        return norm

    t._clip_gradients = clip_then_sync  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="synchroniz"), no_host_sync():
        t.train_step(step[1])
