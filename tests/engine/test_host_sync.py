"""No host sync in the hot loop: `train_step` on the device path (what runs on a GPU, forced here on the CPU) never
reads a value back to the host, for tables and text, accumulation 1 and > 1, adamw and sgd, fp32, bf16 and fp16.

On CPU nothing waits, so the guard looks at what would wait on a GPU: every ATen op that needs a device value on the
host (caught by a TorchDispatchMode, which also sees the backward pass) and the tensor methods that read memory
without dispatching an op on CPU (tolist, numpy).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_kit import make_trainer, mlp, table, text_data, text_model
from support.host_sync import HostSyncError, _NoSync, poison, windows

from trainflow.engine.loaders import Dataset
from trainflow.engine.objective import Objective

HOST_READS = ("tolist", "numpy", "__array__")


@contextlib.contextmanager
def no_host_sync() -> Iterator[None]:
    def forbidden(name: str) -> Any:
        def read(*_: Any, **__: Any) -> Any:
            raise HostSyncError(f"host-device sync in train_step: Tensor.{name}()")

        return read

    with pytest.MonkeyPatch.context() as mp:
        for name in HOST_READS:
            mp.setattr(torch.Tensor, name, forbidden(name))
        with _NoSync():
            yield


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
@pytest.mark.parametrize("accumulate", [1, 4])
@pytest.mark.parametrize("kind", ["table", "text"])
def test_train_step_never_reads_the_device(
    tmp_path: Path, kind: str, accumulate: int, optimizer: str, precision: str
) -> None:
    if kind == "table":
        model: torch.nn.Module = mlp()
        data: Dataset = table(n=64)
        first = model.net[0].weight  # type: ignore[index]
    else:
        model = text_model("token")
        data = text_data(n=64)
        first = model.head.weight  # type: ignore[union-attr]
    batch_size = 16 // accumulate
    # With accumulation, also the regularisers: per-group rates, the weight EMA, a smoothed and weighted loss.
    extras: dict[str, Any] = {}
    if accumulate > 1:
        groups = {"layer_decay": 0.8} if kind == "text" else {"param_groups": [{"match": "net.0.*", "lr_scale": 0.5}]}
        extras = {**groups, "ema_decay": 0.9}
    t = make_trainer(tmp_path, model, precision=precision, optimizer=optimizer, batch_size=batch_size,
                     accumulate=accumulate, **extras)  # fmt: skip
    if accumulate > 1:
        weights = torch.tensor([1.0, 2.0, 0.5, 1.0][: 3 if kind == "table" else 4])
        t.objective = Objective("classification", label_smoothing=0.1, class_weights=weights)
    t.decide_on_device = True
    t.prepare(data)
    poison(first, {2}, accumulate)
    steps = windows(data, batch_size, accumulate, 4)
    with no_host_sync():
        for micro in steps:
            t.train_step(micro)
    assert t.counters.applied == 3  # three applied, the poisoned one skipped, all decided on the device


@pytest.mark.parametrize(
    "injected",
    [
        lambda g: g.item(),
        lambda g: torch.nonzero(g),
        lambda g: bool(g > 0),
        lambda g: g.tolist(),
        lambda g: g.unsqueeze(0)[g.unsqueeze(0) > 0],
    ],
    ids=["item", "nonzero", "bool", "tolist", "mask-index"],
)
def test_the_guard_catches_a_sync_added_to_the_step(tmp_path: Path, injected: Any) -> None:
    """The guard itself can fail: a sync slipped into the update (here, after clipping) is caught."""
    t = make_trainer(tmp_path, mlp(), batch_size=16)
    t.decide_on_device = True
    data = table(n=64)
    t.prepare(data)
    clip = t._clip_gradients

    def clip_then_sync() -> torch.Tensor:
        norm = clip()
        injected(norm)
        return norm

    t._clip_gradients = clip_then_sync  # type: ignore[method-assign]
    with pytest.raises(HostSyncError, match="host-device sync"), no_host_sync():
        t.train_step(windows(data, 16, 1, 1)[0])


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama"])
def test_an_hf_model_step_never_reads_the_device(tmp_path: Path, kind: str, attention: str) -> None:
    """hf: models too, an encoder and decoders, SDPA and eager: Transformers' SDPA mask helpers would ask the device
    whether any token is padding (a 2-D mask's `.all()`); HFSequenceModel hands them the 4-D mask they would build,
    which they use as it is, and a decoder finds its last real token on the device. Checkpointing and layer decay on,
    as users run."""
    from support.tiny_models import tiny_bert, tiny_decoder

    from trainflow.models import hf

    words = [f"w{i}" for i in range(40)]
    if kind == "bert":
        directory = tiny_bert(tmp_path / kind, words, labels=4)
    else:
        directory = tiny_decoder(tmp_path / kind, words, kind=kind, labels=4)
    classes = ["a", "b", "c", "d"]  # text_data's labels are 0..3
    model = hf.HFSequenceModel(4, hf.config(directory, classes, 4, 64)["hf_config"], str(directory))
    model.model.set_attn_implementation(attention)
    model.activation_checkpointing(True)
    data = text_data(n=64, per_token=False, vocab=40)
    t = make_trainer(tmp_path, model, batch_size=8, accumulate=2, layer_decay=0.8)
    t.objective = Objective("classification")
    t.decide_on_device = True
    t.prepare(data)
    steps = windows(data, 8, 2, 3)
    with no_host_sync():
        for micro in steps:
            t.train_step(micro)
    assert t.counters.applied == 3
