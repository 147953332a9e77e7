"""TextTransformer: outputs independent of trailing padding, training works, bad arguments refused, FLOPs formula."""

from __future__ import annotations

import pytest
import torch

from trainflow.models.text import TextTransformer

VOCAB = 50
LENGTHS = [1, 4, 7]


def _model(head: str, **kwargs: object) -> TextTransformer:
    torch.manual_seed(0)
    config: dict = dict(vocab_size=VOCAB, out_features=3, d_model=16, n_heads=4, n_layers=2, max_len=32, dropout=0.1)
    config.update(kwargs)
    return TextTransformer(head=head, **config)


def _batch(width: int, pad: str = "pad_id") -> tuple[torch.Tensor, torch.Tensor]:
    """The same sequences (lengths LENGTHS) right-padded to `width`, with pad ids or random junk after them."""
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(1, VOCAB, (n,), generator=torch.Generator().manual_seed(10 + n)) for n in LENGTHS]
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    if pad == "junk":
        tokens = torch.randint(0, VOCAB, (len(seqs), width), generator=gen)
    mask = torch.zeros(len(seqs), width, dtype=torch.bool)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = s
        mask[i, : len(s)] = True
    return tokens, mask


@pytest.mark.parametrize("pad", ["pad_id", "junk"])
def test_sequence_head_ignores_trailing_padding(pad: str) -> None:
    model = _model("sequence").eval()
    with torch.no_grad():
        short = model(*_batch(7, pad))
        long = model(*_batch(15, pad))
    assert short.shape == (3, 3) and long.shape == (3, 3)
    torch.testing.assert_close(short, long, atol=1e-6, rtol=0)


@pytest.mark.parametrize("pad", ["pad_id", "junk"])
def test_token_head_ignores_trailing_padding_and_pad_rows_are_finite(pad: str) -> None:
    model = _model("token").eval()
    with torch.no_grad():
        short = model(*_batch(7, pad))
        long = model(*_batch(15, pad))
    assert short.shape == (3, 7, 3) and long.shape == (3, 15, 3)
    assert torch.isfinite(short).all() and torch.isfinite(long).all()
    for i, n in enumerate(LENGTHS):
        torch.testing.assert_close(short[i, :n], long[i, :n], atol=1e-6, rtol=0)


def test_a_sample_does_not_depend_on_the_rest_of_the_batch() -> None:
    model = _model("sequence").eval()
    tokens, mask = _batch(15)
    with torch.no_grad():
        together = model(tokens, mask)
        alone = model(tokens[2:3, :7], mask[2:3, :7])
    torch.testing.assert_close(together[2:3], alone, atol=1e-6, rtol=0)


def test_the_mask_is_used() -> None:
    model = _model("sequence").eval()
    tokens, mask = _batch(15)
    with torch.no_grad():
        masked = model(tokens, mask)
        unmasked = model(tokens, torch.ones_like(mask))
    assert not torch.allclose(masked[:2], unmasked[:2], atol=1e-4)


@pytest.mark.parametrize("head", ["sequence", "token"])
def test_training_forward_backward_gives_finite_grads(head: str) -> None:
    model = _model(head).train()
    tokens, mask = _batch(15, "junk")
    out = model(tokens, mask)
    assert torch.isfinite(out).all()
    loss = out[mask].square().mean() if head == "token" else out.square().mean()
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.blocks[0].attn.qkv.parameters())
    # dropout is active in training mode and off in eval mode
    with torch.no_grad():
        assert not torch.equal(model(tokens, mask), model(tokens, mask))
        model.eval()
        assert torch.equal(model(tokens, mask), model(tokens, mask))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"head": "pooled"}, "head"),
        ({"d_model": 10, "n_heads": 4}, "n_heads"),
        ({"n_heads": 0}, "n_heads"),
        ({"n_layers": 0}, "n_layers"),
        ({"dropout": 1.0}, "dropout"),
        ({"pad_id": VOCAB}, "pad_id"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, message: str) -> None:
    config: dict = {"vocab_size": VOCAB, "out_features": 2, "d_model": 16, "n_heads": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        TextTransformer(**config)


def test_too_long_or_mismatched_input_raises() -> None:
    model = _model("sequence", max_len=8)
    with pytest.raises(ValueError, match="max_len"):
        model(torch.ones(2, 9, dtype=torch.long), torch.ones(2, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask"):
        model(torch.ones(2, 8, dtype=torch.long), torch.ones(2, 7, dtype=torch.bool))
    model(torch.ones(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.bool))  # exactly max_len is fine


def test_flops_per_token_by_hand() -> None:
    # d=8, ff=2*8=16, out=3, 2 layers. Per block: ln1 16 + qkv 8*24+24 + proj 8*8+8 + ln2 16 + fc1 8*16+16
    # + fc2 16*8+8 = 16+216+72+16+144+136 = 600. Plus ln_f 16 and head 8*3+3 = 27: 2*600+16+27 = 1243.
    model = TextTransformer(vocab_size=10, out_features=3, d_model=8, n_heads=2, n_layers=2, ff_mult=2, max_len=16)
    assert model.non_embedding_params() == 1243
    assert sum(p.numel() for p in model.parameters()) == 1243 + 10 * 8 + 16 * 8
    assert model.flops_per_token(5) == 6 * 1243 + 12 * 2 * 8 * 5
