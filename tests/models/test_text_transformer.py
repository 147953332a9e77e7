"""The built-in text transformer (trainflow.models.text): its settings, layers and defaults, every refusal in
full, its output against a reference forward pass written here, attention dropout and activation checkpointing only
where they apply, and its layer numbering and FLOP count worked out by hand."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn


def text_model(**kwargs: Any) -> Any:
    from trainflow.models.text import TextTransformer

    torch.manual_seed(0)
    config: dict[str, Any] = dict(vocab_size=11, out_features=3, d_model=8, n_heads=2, n_layers=2, ff_mult=2,
                                  max_len=6, dropout=0.0)  # fmt: skip
    return TextTransformer(**{**config, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"head": "pooled"}, "head must be one of ('sequence', 'token'), got 'pooled'"),
        ({"d_model": 10, "n_heads": 4}, "d_model (10) must be a positive multiple of n_heads (4)"),
        ({"n_heads": 0}, "d_model (8) must be a positive multiple of n_heads (0)"),
        ({"n_heads": -2}, "d_model (8) must be a positive multiple of n_heads (-2)"),
        ({"vocab_size": 0, "pad_id": 0}, "vocab_size must be >= 1, got 0"),
        ({"out_features": 0}, "out_features must be >= 1, got 0"),
        ({"d_model": 0}, "d_model must be >= 1, got 0"),
        ({"n_layers": 0}, "n_layers must be >= 1, got 0"),
        ({"ff_mult": 0}, "ff_mult must be >= 1, got 0"),
        ({"max_len": 0}, "max_len must be >= 1, got 0"),
        ({"dropout": 1.0}, "dropout must be in [0, 1), got 1.0"),
        ({"dropout": -0.1}, "dropout must be in [0, 1), got -0.1"),
        ({"pad_id": 11}, "pad_id (11) must be a token id in [0, vocab_size=11)"),
        ({"pad_id": -1}, "pad_id (-1) must be a token id in [0, vocab_size=11)"),
    ],
)
def test_text_transformer_refusals_in_full(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as exc:
        text_model(**kwargs)
    assert str(exc.value) == message


def test_text_transformer_smallest_valid_settings() -> None:
    model = text_model(vocab_size=1, out_features=1, d_model=1, n_heads=1, n_layers=1, ff_mult=1, max_len=1,
                       dropout=0.0, pad_id=0, head="token")  # fmt: skip
    assert model(torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.bool)).shape == (2, 1, 1)
    text_model(dropout=0.99, pad_id=10)


def test_text_transformer_keeps_its_settings_and_layers() -> None:
    model = text_model(pad_id=3, dropout=0.2, head="token")
    assert (model.vocab_size, model.out_features, model.d_model, model.n_heads, model.n_layers, model.max_len,
            model.pad_id, model.head_kind, model.checkpointing, model.num_layers) == (11, 3, 8, 2, 2, 6, 3, "token",
                                                                                    False, 2)  # fmt: skip
    assert model.tok_emb.weight.shape == (11, 8) and model.tok_emb.padding_idx == 3
    assert model.tok_emb.weight[3].abs().sum() == 0
    assert model.pos_emb.weight.shape == (6, 8) and model.emb_dropout.p == 0.2
    assert len(model.blocks) == 2 and model.ln_f.normalized_shape == (8,)
    assert (model.head.in_features, model.head.out_features) == (8, 3)
    block = model.blocks[0]
    assert block.attn.n_heads == 2 and block.attn.dropout == 0.2
    assert (block.attn.qkv.in_features, block.attn.qkv.out_features) == (8, 24)
    assert (block.attn.proj.in_features, block.attn.proj.out_features) == (8, 8)
    fc1, gelu, drop1, fc2, drop2 = block.mlp
    assert (fc1.in_features, fc1.out_features, fc2.in_features, fc2.out_features) == (8, 16, 16, 8)
    assert type(gelu) is nn.GELU and (drop1.p, drop2.p) == (0.2, 0.2)
    assert block.ln1.normalized_shape == block.ln2.normalized_shape == (8,)
    model.activation_checkpointing(True)
    assert model.checkpointing is True
    model.activation_checkpointing(False)
    assert model.checkpointing is False


def test_text_transformer_defaults() -> None:
    from trainflow.models.text import TextTransformer

    model = TextTransformer(vocab_size=5, out_features=2)
    assert (model.d_model, model.n_heads, model.n_layers, model.max_len, model.pad_id, model.head_kind) == (
        128, 4, 2, 256, 0, "sequence"
    )  # fmt: skip
    assert model.blocks[0].mlp[0].out_features == 4 * 128 and model.emb_dropout.p == 0.1
    assert model.blocks[0].attn.dropout == 0.1 and model.tok_emb.padding_idx == 0


def reference_forward(model: Any, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The encoder written out with plain tensor ops, from the model's weights (eval: no dropout)."""
    n, length = tokens.shape
    d, heads = model.d_model, model.n_heads
    dh = d // heads
    x = model.tok_emb.weight[tokens] + model.pos_emb.weight[:length][None]
    for block in model.blocks:
        h = F.layer_norm(x, (d,), block.ln1.weight, block.ln1.bias)
        qkv = h @ block.attn.qkv.weight.T + block.attn.qkv.bias
        q, k, v = (qkv[..., i * d : (i + 1) * d].reshape(n, length, heads, dh).transpose(1, 2) for i in range(3))
        scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(n, length, d)
        x = x + attended @ block.attn.proj.weight.T + block.attn.proj.bias
        h = F.layer_norm(x, (d,), block.ln2.weight, block.ln2.bias)
        fc1, _, _, fc2, _ = block.mlp
        x = x + F.gelu(h @ fc1.weight.T + fc1.bias) @ fc2.weight.T + fc2.bias
    x = F.layer_norm(x, (d,), model.ln_f.weight, model.ln_f.bias)
    if model.head_kind == "token":
        return x @ model.head.weight.T + model.head.bias
    pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    return pooled @ model.head.weight.T + model.head.bias


TOKENS = torch.tensor([[4, 7, 1, 9, 0], [2, 2, 0, 0, 0], [10, 3, 5, 6, 8]])


MASK = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)


@pytest.mark.parametrize("head", ["sequence", "token"])
def test_text_transformer_forward_against_a_reference(head: str) -> None:
    model = text_model(head=head, dropout=0.1).eval()
    for name, q in model.named_parameters():
        if "ln" not in name:
            nn.init.normal_(q, std=0.5)
    with torch.no_grad():
        got = model(TOKENS, MASK.long())  # a 0/1 mask works as the booleans
        expected = reference_forward(model, TOKENS, MASK)
    assert got.shape == ((3, 3) if head == "sequence" else (3, 5, 3))
    if head == "token":
        got, expected = got[MASK], expected[MASK]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_text_transformer_input_refusals_in_full() -> None:
    model = text_model()
    with pytest.raises(ValueError) as dims:
        model(torch.zeros(2, 3, 1, dtype=torch.long), torch.ones(2, 3, 1, dtype=torch.bool))
    assert str(dims.value) == "tokens must be [N, L], got shape (2, 3, 1)"
    with pytest.raises(ValueError) as shape:
        model(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 4, dtype=torch.bool))
    assert str(shape.value) == "mask shape (2, 4) must equal tokens shape (2, 3)"
    with pytest.raises(ValueError) as long:
        model(torch.zeros(1, 7, dtype=torch.long), torch.ones(1, 7, dtype=torch.bool))
    assert str(long.value) == "sequence length 7 exceeds max_len=6"
    assert model(torch.zeros(1, 6, dtype=torch.long), torch.ones(1, 6, dtype=torch.bool)).shape == (1, 3)


def test_attention_dropout_only_in_training(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainflow.models import text

    seen: list[float] = []
    real = F.scaled_dot_product_attention

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append(kwargs["dropout_p"])
        return real(*args, **kwargs)

    monkeypatch.setattr(text.F, "scaled_dot_product_attention", spy)
    model = text_model(dropout=0.3, n_layers=1)
    model.train()(TOKENS, MASK)
    model.eval()(TOKENS, MASK)
    assert seen == [0.3, 0.0]


def test_blocks_are_checkpointed_only_when_asked_training_and_with_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainflow.models import text

    calls: list[bool] = []
    real = text.checkpoint

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["use_reentrant"])
        return real(*args, **kwargs)

    monkeypatch.setattr(text, "checkpoint", spy)
    model = text_model()
    plain = model.train()(TOKENS, MASK)
    assert calls == []
    model.activation_checkpointing(True)
    checkpointed = model(TOKENS, MASK)
    assert calls == [False, False]  # each of the 2 blocks, non-reentrant
    torch.testing.assert_close(checkpointed, plain, rtol=0, atol=0)
    with torch.no_grad():
        model(TOKENS, MASK)
    model.eval()(TOKENS, MASK)
    assert calls == [False, False]


def test_layer_of_numbers_embeddings_blocks_and_the_rest() -> None:
    model = text_model(n_layers=3)
    layers = {name: model.layer_of(name) for name, _ in model.named_parameters()}
    assert layers["tok_emb.weight"] == 0 and layers["pos_emb.weight"] == 0
    assert layers["blocks.0.attn.qkv.weight"] == 1 and layers["blocks.2.mlp.3.bias"] == 3
    assert layers["ln_f.weight"] == 4 and layers["head.bias"] == 4
    assert model.layer_of("tok_embx") == 4 and model.layer_of("blocks.10.x") == 11


def test_text_flops_by_hand() -> None:
    # d 8, ff 16, out 3, 2 layers: per block ln 16 + qkv 216 + proj 72 + ln 16 + fc1 144 + fc2 136 = 600;
    # ln_f 16, head 27: 1243 outside the embeddings (11 x 8 tokens, 6 x 8 positions).
    model = text_model()
    assert model.non_embedding_params() == 1243
    assert model.flops_per_token(4) == 6.0 * 1243 + 12 * 2 * 8 * 4
    assert type(model.flops_per_token(4)) is float
