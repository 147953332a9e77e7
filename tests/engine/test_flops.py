"""FLOPs per sample for built-in models (per token of a Transformers model, counted by hand from its config), peak
FLOP/s lookup and its environment override, MFU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.tiny_models import tiny_bert, tiny_decoder
from torch import nn

from trainflow.engine import flops
from trainflow.engine.flops import PEAK_FLOPS_ENV, mfu, peak_flops, train_flops_per_sample
from trainflow.models import MLP, hf
from trainflow.models.text import TextTransformer


@pytest.fixture(autouse=True)
def _no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PEAK_FLOPS_ENV, raising=False)


def _text_model() -> TextTransformer:
    return TextTransformer(vocab_size=10, out_features=3, d_model=8, n_heads=2, n_layers=2, ff_mult=2, max_len=16)


def test_mlp_flops_are_six_times_params() -> None:
    model = MLP(4, 3, [5], 0.0)  # 4*5+5 + 5*3+3 = 43 parameters
    assert train_flops_per_sample(model) == 6 * 43
    assert train_flops_per_sample(model, seq_len=99) == 6 * 43


def test_text_model_flops_are_per_token_times_length() -> None:
    model = _text_model()
    assert train_flops_per_sample(model, 5) == (6 * 1243 + 12 * 2 * 8 * 5) * 5
    with pytest.raises(ValueError, match="seq_len"):
        train_flops_per_sample(model)


def test_wrappers_are_unwrapped() -> None:
    class Wrapper(nn.Module):  # what torch.compile returns: the real module under _orig_mod
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self._orig_mod = inner

    mlp = MLP(4, 3, [5], 0.0)
    assert train_flops_per_sample(Wrapper(mlp)) == 6 * 43
    assert train_flops_per_sample(nn.DataParallel(Wrapper(_text_model())), 5) == (6 * 1243 + 12 * 2 * 8 * 5) * 5


def test_unknown_models_give_none() -> None:
    assert train_flops_per_sample(nn.Linear(3, 2)) is None
    assert train_flops_per_sample(nn.Sequential(nn.Linear(3, 2)), seq_len=4) is None


def test_peak_flops_is_none_on_cpu() -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert peak_flops(torch.device("cpu"), dtype) is None


def test_env_overrides_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PEAK_FLOPS_ENV, "1.5e14")
    assert peak_flops(torch.device("cpu"), torch.float32) == 1.5e14
    assert peak_flops(torch.device("cuda"), torch.bfloat16) == 1.5e14
    for bad in ("fast", "0", "-1"):
        monkeypatch.setenv(PEAK_FLOPS_ENV, bad)
        with pytest.raises(ValueError, match=PEAK_FLOPS_ENV):
            peak_flops(torch.device("cpu"), torch.float32)


@pytest.mark.parametrize(
    ("name", "dtype", "tf32", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", torch.bfloat16, False, 989e12),
        ("NVIDIA H100 PCIe", torch.bfloat16, False, 756e12),
        ("NVIDIA H100 PCIe", torch.float32, True, 378e12),
        ("NVIDIA H100 PCIe", torch.float32, False, 51e12),
        ("NVIDIA H200", torch.float16, False, 989e12),
        ("NVIDIA A100-SXM4-80GB", torch.bfloat16, False, 312e12),
        ("NVIDIA A100 80GB PCIe", torch.float32, True, 156e12),
        ("NVIDIA L40S", torch.bfloat16, False, 362e12),
        ("NVIDIA L4", torch.bfloat16, False, 121e12),
        ("NVIDIA A10", torch.bfloat16, False, 125e12),
        ("NVIDIA A10G", torch.bfloat16, False, None),
        ("Tesla V100-SXM2-16GB", torch.float16, False, 125e12),
        ("Tesla V100-SXM2-16GB", torch.bfloat16, False, None),
        ("NVIDIA GeForce RTX 4090", torch.bfloat16, False, 165.2e12),
        ("NVIDIA GeForce RTX 3090", torch.float32, False, 35.6e12),
        ("NVIDIA H100 80GB HBM3", torch.float64, False, None),
        ("Some Future GPU", torch.bfloat16, False, None),
    ],
)
def test_peak_flops_table(
    monkeypatch: pytest.MonkeyPatch, name: str, dtype: torch.dtype, tf32: bool, expected: float | None
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(flops, "_tf32_enabled", lambda: tf32)
    assert peak_flops(torch.device("cuda", 0), dtype) == expected


def test_mfu() -> None:
    assert mfu(250e12, 1000e12) == 0.25
    assert mfu(250e12, None) is None
    # Any positive peak divides, however small (in whatever unit both are given); zero or less is unknown.
    assert mfu(0.25, 1.0) == 0.25 and mfu(0.25, 0.5) == 0.5
    assert mfu(0.25, 0.0) is None and mfu(0.25, -1.0) is None


# --- FLOPs per token of a Transformers model, counted by hand from its config -----------------------------------


WORDS = [f"w{i}" for i in range(30)]


def test_flops_per_token_of_a_tiny_bert_count_six_per_non_embedding_parameter(tmp_path: Path) -> None:
    """BERT of width 32, 2 layers, feed-forward 64, 64 positions, 2 labels. Its embeddings (word, position, token type
    and their LayerNorm) are left out of the 6 FLOPs per parameter; the rest, counted from the config: per layer the
    attention's q, k, v and output projections 4 x (32 x 32 + 32) = 4224, two LayerNorms 2 x 64, the feed-forward
    32 x 64 + 64 = 2112 and 64 x 32 + 32 = 2080: 8544; two layers 17088, the pooler 32 x 32 + 32 = 1056 and the head
    32 x 2 + 2 = 66: 18210. Attention adds 12 x layers x width x seq_len."""
    directory = tiny_bert(tmp_path / "bert", WORDS)
    model = hf.HFSequenceModel(2, hf.config(directory, ["neg", "pos"], 2, 16)["hf_config"], str(directory))
    vocab = 5 + len(WORDS)  # the 5 special tokens and the words
    embeddings = vocab * 32 + 64 * 32 + 2 * 32 + 2 * 32
    non_embedding = 2 * (4 * (32 * 32 + 32) + 2 * 64 + (32 * 64 + 64) + (64 * 32 + 32)) + (32 * 32 + 32) + (32 * 2 + 2)
    assert non_embedding == 18210
    assert sum(q.numel() for q in model.parameters()) == embeddings + non_embedding  # the hand count is the model
    assert model.flops_per_token(16) == 6 * 18210 + 12 * 2 * 32 * 16
    assert model.flops_per_token(1) == 6 * 18210 + 12 * 2 * 32


def test_flops_per_token_of_a_tiny_gpt2_leave_out_its_token_and_position_embeddings(tmp_path: Path) -> None:
    """GPT-2 of width 32, 2 layers, 64 positions, 2 labels: wte and wpe are the embeddings. The rest: per layer two
    LayerNorms 2 x 64, c_attn 32 x 96 + 96 = 3168, the attention's c_proj 32 x 32 + 32 = 1056, the MLP's c_fc
    32 x 128 + 128 = 4224 and c_proj 128 x 32 + 32 = 4128: 12704; two layers 25408, ln_f 64 and the bias-free score
    32 x 2 = 64: 25536."""
    directory = tiny_decoder(tmp_path / "gpt2", WORDS, kind="gpt2")
    model = hf.HFSequenceModel(2, hf.config(directory, ["neg", "pos"], 2, 16)["hf_config"], str(directory))
    vocab = 1 + len(WORDS) + 1  # "!", the words, "<unk>"
    embeddings = vocab * 32 + 64 * 32
    non_embedding = 2 * (2 * 64 + (32 * 96 + 96) + (32 * 32 + 32) + (32 * 128 + 128) + (128 * 32 + 32)) + 64 + 64
    assert non_embedding == 25536
    assert sum(q.numel() for q in model.parameters()) == embeddings + non_embedding
    assert model.flops_per_token(16) == 6 * 25536 + 12 * 2 * 32 * 16
