"""FusedAdamWStep: AdamW's fused kernel called directly is torch.optim.AdamW(fused=True).step(), bit for bit: the
weights and every state tensor after updates with two groups of their own rates and decay, a parameter left without a
gradient, updates skipped by found_inf, and a state dict loaded in between (a resume)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from trainflow.engine.optim import FusedAdamWStep

STEPS = 12


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 3), nn.Linear(3, 3))


def adamw(m: nn.Module, **kw: object) -> torch.optim.AdamW:
    decay = [q for q in m.parameters() if q.ndim >= 2]
    rest = [q for q in m.parameters() if q.ndim < 2]
    lrs = torch.tensor([3e-3, 1e-3])
    groups = [
        {"params": decay, "lr": lrs[0], "weight_decay": 0.05},
        {"params": rest, "lr": lrs[1], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lrs[0], fused=True, betas=(0.8, 0.95), eps=1e-6, **kw)  # type: ignore[arg-type]


def gradients(m: nn.Module, k: int) -> None:
    g = torch.Generator().manual_seed(k)
    for i, q in enumerate(m.parameters()):
        q.grad = None if (i == 5 and k % 3 == 0) else torch.randn(q.shape, generator=g)  # the last bias: no grad


def state(m: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    tensors = [q.detach().clone() for q in m.parameters()]
    for q in m.parameters():
        tensors += [v.clone() for v in opt.state[q].values() if isinstance(v, torch.Tensor)]
    return tensors


def run(fast: bool, skips: set[int], reload_at: int | None = None) -> list[torch.Tensor]:
    m = model()
    opt = adamw(m)
    step = FusedAdamWStep(opt)
    for k in range(STEPS):
        if k == reload_at:  # a resume: the state dict through a copy, loaded back (new state tensors)
            saved = copy.deepcopy(opt.state_dict())
            opt.load_state_dict(saved)
        gradients(m, k)
        found_inf = torch.tensor(1.0 if k in skips else 0.0)
        if fast:
            step(found_inf=found_inf)
        else:
            opt.grad_scale, opt.found_inf = None, found_inf  # type: ignore[attr-defined]
            opt.step()
    return state(m, opt)


@pytest.mark.parametrize("reload_at", [None, 5])
def test_the_direct_kernel_call_is_torch_s_step_bit_for_bit(reload_at: int | None) -> None:
    skips = {2, 3, 7}
    torch_step, ours = run(False, skips, reload_at), run(True, skips, reload_at)
    assert len(ours) == len(torch_step) > 6
    assert all(torch.equal(a, b) for a, b in zip(ours, torch_step, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(run(True, set(), reload_at), ours, strict=True))  # skips count


def test_it_applies_only_where_it_is_torch_s_step() -> None:
    m = model()
    assert FusedAdamWStep.applies(adamw(m))
    assert not FusedAdamWStep.applies(adamw(m, amsgrad=True))
    assert not FusedAdamWStep.applies(torch.optim.AdamW(m.parameters()))  # not fused
    assert not FusedAdamWStep.applies(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, fused=True))
    assert not FusedAdamWStep.applies(torch.optim.Adam(m.parameters(), fused=True))  # Adam's decay is not AdamW's
