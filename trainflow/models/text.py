"""A small hand-written Transformer encoder for token sequences, built on scaled_dot_product_attention.

Outputs for a sequence do not depend on how much padding follows it: padded keys are masked out of attention, positions
are counted from the start of the sequence, and pooling averages over real tokens only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

HEADS = ("sequence", "token")


class _SelfAttention(nn.Module):
    """Multi-head self-attention over a key padding mask."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        """x [N, L, D], attn_mask bool [N, 1, 1, L] (True = attend) -> [N, L, D]."""
        n, length, d = x.shape
        qkv = self.qkv(x).view(n, length, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each [N, H, L, Dh]
        dropout_p = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
        out = out.transpose(1, 2).reshape(n, length, d)
        projected: torch.Tensor = self.proj(out)
        return projected


class _Block(nn.Module):
    """Pre-LayerNorm encoder block: x + attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, d_model: int, n_heads: int, ff_mult: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = _SelfAttention(d_model, n_heads, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, ff_mult * d_model),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(ff_mult * d_model, d_model),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), attn_mask)
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class TextTransformer(nn.Module):
    """Transformer-encoder classifier/regressor over token ids.

    head="sequence" gives [N, out_features] from a masked mean over real tokens; head="token" gives
    [N, L, out_features], one output per position (outputs at padded positions are meaningless).
    """

    # train.packing's layout (TextData.pack): rows as wide as a micro-batch's longest sequence, since attention costs
    # the square of a row's width
    packing = "rows"

    def __init__(
        self,
        vocab_size: int,
        out_features: int,
        d_model: int = 128,
        n_heads: int = 4,
        n_layers: int = 2,
        ff_mult: int = 4,
        max_len: int = 256,
        dropout: float = 0.1,
        pad_id: int = 0,
        head: str = "sequence",
    ) -> None:
        super().__init__()
        if head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {head!r}")
        if n_heads < 1 or d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be a positive multiple of n_heads ({n_heads})")
        for name, value in (
            ("vocab_size", vocab_size),
            ("out_features", out_features),
            ("d_model", d_model),
            ("n_layers", n_layers),
            ("ff_mult", ff_mult),
            ("max_len", max_len),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if not 0 <= pad_id < vocab_size:
            raise ValueError(f"pad_id ({pad_id}) must be a token id in [0, vocab_size={vocab_size})")
        self.vocab_size = vocab_size
        self.out_features = out_features
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_layers = n_layers
        self.max_len = max_len
        self.pad_id = pad_id
        self.head_kind = head
        self.checkpointing = False  # activation_checkpointing()

        self.tok_emb = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.pos_emb = nn.Embedding(max_len, d_model)
        self.emb_dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(_Block(d_model, n_heads, ff_mult, dropout) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, out_features)

    def forward(
        self,
        tokens: torch.Tensor,
        mask: torch.Tensor | None = None,
        documents: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tokens long [N, L], mask bool [N, L] (True = real token, each row has at least one) -> outputs. Or packed
        (train.packing, TextData.pack): tokens, documents and positions [R, W], lengths [N] -> the same outputs
        ([N, out_features]; head token: [R, W, out_features], the packed layout)."""
        if documents is not None:
            assert positions is not None and lengths is not None
            return self._packed(tokens, documents, positions, lengths)
        assert mask is not None
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be [N, L], got shape {tuple(tokens.shape)}")
        if mask.shape != tokens.shape:
            raise ValueError(f"mask shape {tuple(mask.shape)} must equal tokens shape {tuple(tokens.shape)}")
        length = tokens.shape[1]
        if length > self.max_len:
            raise ValueError(f"sequence length {length} exceeds max_len={self.max_len}")
        mask = mask.bool()
        positions = torch.arange(length, device=tokens.device)
        attn_mask = mask[:, None, None, :]  # [N, 1, 1, L]: every query attends to the real keys only
        x = self._encode(tokens, positions, attn_mask)
        if self.head_kind == "token":
            out: torch.Tensor = self.head(x)
            return out
        weights = mask.unsqueeze(-1)
        summed = torch.where(weights, x, torch.zeros_like(x)).sum(dim=1)
        pooled = summed / weights.sum(dim=1).clamp(min=1).to(x.dtype)
        out = self.head(pooled)
        return out

    def _packed(
        self, tokens: torch.Tensor, documents: torch.Tensor, positions: torch.Tensor, lengths: torch.Tensor
    ) -> torch.Tensor:
        """Packed rows: a token attends to the tokens of its own sequence only (and a row's padding to the padding),
        positions restart at each sequence, and a sequence's pooled mean sums its own tokens: each output is the
        padded forward's. Attention still costs W * W per row (SDPA takes the block-diagonal mask as a dense one)."""
        if tokens.shape[1] > self.max_len:
            raise ValueError(f"packed rows of {tokens.shape[1]} tokens exceed max_len={self.max_len}")
        attn_mask = (documents[:, :, None] == documents[:, None, :]).unsqueeze(1)  # [R, 1, W, W]
        x = self._encode(tokens, positions, attn_mask)
        if self.head_kind == "token":
            out: torch.Tensor = self.head(x)
            return out
        n = len(lengths)
        slot = torch.where(documents >= 0, documents, n).flatten()  # a row's padding sums into row n, dropped
        summed = x.new_zeros(n + 1, x.shape[-1]).index_add_(0, slot, x.flatten(0, 1))[:n]
        pooled = summed / lengths.clamp(min=1).unsqueeze(-1).to(x.dtype)
        out = self.head(pooled)
        return out

    def _encode(self, tokens: torch.Tensor, positions: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        x = self.emb_dropout(self.tok_emb(tokens) + self.pos_emb(positions))
        for block in self.blocks:
            if self.checkpointing and self.training and torch.is_grad_enabled():
                # Keep only the block's input; backward recomputes the rest. Non-reentrant, and it restores the RNG
                # state first, so the recomputed dropout masks are the forward's: the gradients are the same.
                x = checkpoint(block, x, attn_mask, use_reentrant=False)
            else:
                x = block(x, attn_mask)
        encoded: torch.Tensor = self.ln_f(x)
        return encoded

    def activation_checkpointing(self, on: bool) -> None:
        """train.activation_checkpointing: recompute each block's activations in backward instead of keeping them
        (memory of one block's activations instead of n_layers', for about one more forward pass of compute)."""
        self.checkpointing = on

    @property
    def num_layers(self) -> int:
        return self.n_layers

    def layer_of(self, name: str) -> int:
        """train.layer_decay's layer of a parameter: 0 the embeddings, 1..n_layers the blocks, n_layers + 1 the rest
        (final norm and head, which learn at the scheduled rate)."""
        if name.startswith(("tok_emb.", "pos_emb.")):
            return 0
        if name.startswith("blocks."):
            return int(name.split(".")[1]) + 1
        return self.n_layers + 1

    def non_embedding_params(self) -> int:
        """Parameters outside the token and positional embeddings."""
        embedding = self.tok_emb.weight.numel() + self.pos_emb.weight.numel()
        return sum(p.numel() for p in self.parameters()) - embedding

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 * non-embedding params + 12 * n_layers * d_model * seq_len."""
        return float(6 * self.non_embedding_params() + 12 * self.n_layers * self.d_model * seq_len)


class TextBag(nn.Module):
    """A bag of embeddings (fastText-like): the mean of the embeddings of a text's subword tokens (and, with
    `buckets` > 0, of its neighbouring token pairs, hashed into that many rows), then dropout and a linear head. No
    attention and no positions, so it trains in seconds on a CPU where a Transformer takes minutes. Padding is never
    counted: the mean is over real tokens (and pairs of real tokens) only, so an output does not depend on how much
    padding follows its text.

    Pairs are off by default: on bench/text_defaults.py's sets they helped a lot where a negation turns a word around
    (sentiment) but hurt where topics share most words (they overfit; benchmarks/text-defaults.md);
    `model.kwargs: {buckets: 32000}` turns them on."""

    PAIR = 1_000_003  # a pair (a, b) is row vocab_size + (a * PAIR + b) % buckets
    packing = "one row"  # train.packing's layout (TextData.pack): a bag has no attention, so every token in one row

    def __init__(
        self, vocab_size: int, out_features: int, d_model: int = 64, buckets: int = 0, dropout: float = 0.1
    ) -> None:
        super().__init__()
        if vocab_size < 1 or out_features < 1 or d_model < 1 or buckets < 0:
            raise ValueError(f"vocab_size, out_features and d_model must be positive and buckets at least 0 "
                             f"({vocab_size}, {out_features}, {d_model}, {buckets})")  # fmt: skip
        self.vocab_size, self.buckets = vocab_size, buckets
        self.emb = nn.Embedding(vocab_size + buckets, d_model)
        nn.init.normal_(self.emb.weight, std=0.02)
        with torch.no_grad():
            self.emb.weight[vocab_size:] = 0.0  # pairs start out silent: a pair's row grows only where it helps
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(d_model, out_features)

    def forward(
        self,
        tokens: torch.Tensor,
        mask: torch.Tensor | None = None,
        documents: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tokens [N, L] (long), mask [N, L] (bool, True for real tokens) -> [N, out_features]. Or packed
        (train.packing): tokens and documents [R, W], lengths [N] (positions are not used: a bag has none)."""
        if documents is not None:
            assert lengths is not None
            return self._packed(tokens, documents, lengths)
        assert mask is not None
        ids, weights = tokens, mask
        if self.buckets:
            pairs = (tokens[:, :-1] * self.PAIR + tokens[:, 1:]) % self.buckets + self.vocab_size
            ids = torch.cat([tokens, pairs], dim=1)
            weights = torch.cat([mask, mask[:, :-1] & mask[:, 1:]], dim=1)
        w = weights.to(self.emb.weight.dtype).unsqueeze(-1)
        pooled = (self.emb(ids) * w).sum(dim=1) / w.sum(dim=1).clamp(min=1.0)
        out: torch.Tensor = self.head(self.drop(pooled))
        return out

    def _packed(self, tokens: torch.Tensor, documents: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The padded forward's means without padding: each token's embedding (and each pair's, of two neighbours in
        one sequence) summed into its sequence's row, over its real tokens (and pairs)."""
        ids, docs = tokens.flatten(), documents.flatten()
        n = len(lengths)
        slot = torch.where(docs >= 0, docs, n)  # padding sums into row n, dropped
        terms = lengths
        if self.buckets:
            pairs = (ids[:-1] * self.PAIR + ids[1:]) % self.buckets + self.vocab_size
            same = (docs[:-1] == docs[1:]) & (docs[:-1] >= 0)
            ids = torch.cat([ids, pairs])
            slot = torch.cat([slot, torch.where(same, docs[:-1], n)])
            terms = 2 * lengths - 1  # a sequence of L tokens has L - 1 pairs
        emb = self.emb(ids)
        summed = emb.new_zeros(n + 1, emb.shape[-1]).index_add_(0, slot, emb)[:n]
        pooled = summed / terms.clamp(min=1).unsqueeze(-1).to(emb.dtype)
        out: torch.Tensor = self.head(self.drop(pooled))
        return out
