"""Several processes against one, for the distributed tests on the CPU (gloo, tests/engine) and on the GPU (NCCL): the
settings per kind of data, and the comparisons of weights, states and histories that must agree."""

from __future__ import annotations

from typing import Any

import pytest
import torch

# Windows of batch_size x accumulate 2 x 2 ranks; the last one of each epoch partial. Table: 203 rows in windows of 32,
# 6 whole and one of 11 (rank 0: micro-batches of 8 and 3; rank 1: two empty ones). Text: 91 sequences in windows of
# 8, 11 whole and one of 3 (rank 0: 2 and 1). Images (a cnn with BatchNorm): 116 in windows of 32, 3 whole and one of
# 20 (rank 0: 8 and 8; rank 1: 4 and an empty one), or 107, the last window 11 (rank 0: 8 and 3; rank 1: nothing).
# One process with accumulate 4 cuts the same micro-batches from each window.
SETTINGS: dict[str, Any] = {"batch_size": 8, "accumulate": 2, "epochs": 4, "eval_every": 9, "log_every": 5}
BY_KIND = {
    "table": SETTINGS,
    "text": {**SETTINGS, "batch_size": 2},
    # train.packing: rows of 24 (TextData.pack), an empty micro-batch on a rank. 3 epochs: float rounding drifts
    # apart with every update (4 epochs: 1.3e-5 relative, as "text" is at 9e-6 there)
    "text-packed": {**SETTINGS, "batch_size": 2, "epochs": 3},
    "image": {**SETTINGS, "epochs": 5, "eval_every": 6},
    "image-tail": {**SETTINGS, "epochs": 5, "eval_every": 6},
}
# History fields that are counts or the schedule's own rates: the same numbers on any number of processes. The rest
# (train_loss, val_*) are sums of floats added in another order (per rank, then across ranks), of weights that differ
# by such sums: equal within float rounding.
EXACT = {"update", "epoch", "lr"}


def relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    x = torch.cat([a[k].flatten().double() for k in sorted(a)])
    y = torch.cat([b[k].flatten().double() for k in sorted(b)])
    return float((x - y).norm() / y.norm())


def assert_same_tensors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str) -> None:
    """Key by key: integer tensors (num_batches_tracked) exactly; float ones (weights, BatchNorm's running statistics,
    the optimizer's moments) within 1e-5 of the key's norm: gradients summed in another order, nothing more."""
    assert sorted(got) == sorted(want), what
    for k, w in want.items():
        g = got[k]
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what}/{k}"
        if w.is_floating_point():
            gap, scale = float((g.double() - w.double()).norm()), float(w.double().norm())
            assert gap <= 1e-5 * scale + 1e-9, f"{what}/{k}: differs by {gap:.3g} (norm {scale:.3g})"
        else:
            assert torch.equal(g, w), f"{what}/{k}: {g.tolist()} != {w.tolist()}"


def without_key_bias(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state without attention's key bias. It adds one number to all of a query's scores, which softmax ignores:
    its gradient is zero up to float rounding, and AdamW's normalisation makes steps of full size of that noise. Equal
    between one process and two only within the whole state's norm (checked), not its own."""
    out = dict(state)
    for k, v in state.items():
        if k.endswith("attn.qkv.bias"):  # [query | key | value]
            out[k] = torch.cat([v[: len(v) // 3], v[2 * len(v) // 3 :]])
    return out


def assert_same_history(got: list[dict[str, float]], want: list[dict[str, float]]) -> None:
    """Every key of every evaluation record: the counts and rates exactly, the sums within float rounding."""
    assert [h["update"] for h in got] == [h["update"] for h in want]
    for g, w in zip(got, want, strict=True):
        assert sorted(g) == sorted(w)
        for k, v in w.items():
            if k in EXACT:
                assert g[k] == v, f"update {w['update']}: {k}"
            else:
                assert g[k] == pytest.approx(v, rel=1e-5, abs=1e-7), f"update {w['update']}: {k}"
