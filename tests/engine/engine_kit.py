"""What the engine tests share: tiny data and models, a trainer factory, a plain PyTorch reference loop, and ways to
force non-finite updates and to compare states bit for bit."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainflow.engine.checkpoint import flatten_optimizer
from trainflow.engine.distributed import Group
from trainflow.engine.loaders import IGNORE_INDEX, TensorData, TextData, epoch_order
from trainflow.engine.objective import Objective
from trainflow.engine.precision import Precision
from trainflow.engine.schedule import lr_at
from trainflow.engine.trainer import Trainer
from trainflow.models import MLP
from trainflow.models.text import TextTransformer
from trainflow.params import TrainParams

BASE: dict[str, Any] = {
    "epochs": 3,
    "progress": False,
    "resume": "never",
    "patience": 1000,
    "log_every": 5,
    "weight_decay": 0.01,
    "max_grad_norm": 1.0,
    "warmup_fraction": 0.2,
}


def table(n: int = 203, features: int = 6, classes: int = 3, seed: int = 0) -> TensorData:
    g = torch.Generator().manual_seed(seed)
    return TensorData(torch.randn(n, features, generator=g), torch.randint(0, classes, (n,), generator=g))


def make_trainer(
    tmp: Path,
    model: nn.Module,
    task: str = "classification",
    precision: str = "fp32",
    group: Group | None = None,
    **kw: Any,
) -> Trainer:
    p = TrainParams.model_validate({**BASE, **kw})
    return Trainer(
        model,
        p,
        seed=7,
        device=torch.device("cpu"),
        precision=Precision(precision, "cpu"),
        objective=Objective(task),  # type: ignore[arg-type]
        checkpoint_dir=tmp,
        fingerprint="test",
        group=group,
    )


def mlp() -> MLP:
    torch.manual_seed(1)
    return MLP(6, 3, [16], dropout=0.0)


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def rel(a: nn.Module, b: nn.Module) -> float:
    return float((flat(a) - flat(b)).norm() / flat(b).norm())


def reference(
    model: nn.Module,
    n: int,
    window_loss: Any,
    p: TrainParams,
    *,
    seed: int = 7,
    skip: set[int] = frozenset(),  # type: ignore[assignment]
    orders: Any = None,  # a dataset's own epoch_order (text: length-bucketed)
    stop_after: int | None = None,  # attempted windows, skipped ones included
    losses: dict[int, float] | None = None,  # filled with each applied attempt's mean loss
) -> nn.Module:
    """A plain PyTorch loop: per window, the mean loss over the window's loss terms; unfused optimizer."""
    decay = [q for q in model.parameters() if q.ndim >= 2]
    no_decay = [q for q in model.parameters() if q.ndim < 2]
    groups = [{"params": decay, "weight_decay": p.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if p.optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(groups, lr=p.lr, momentum=p.momentum)
    else:
        opt = torch.optim.AdamW(groups, lr=p.lr)
    window = p.batch_size * p.accumulate
    per_epoch = math.ceil(n / window)
    total = per_epoch * p.epochs
    warmup = round(p.warmup_fraction * total)
    applied = attempted = 0
    for epoch in range(p.epochs):
        order = orders(seed, epoch) if orders else epoch_order(n, seed, epoch)
        for start in range(0, n, window):
            if attempted == stop_after:
                return model
            idx = order[start : start + window]
            attempted += 1
            if attempted in skip:
                continue  # the engine sees non-finite gradients here: no update, no schedule step
            opt.zero_grad()
            loss = window_loss(model, idx)
            if losses is not None:
                losses[attempted] = loss.item()
            loss.backward()
            if p.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), p.max_grad_norm)
            for g in opt.param_groups:
                g["lr"] = lr_at(p.schedule, applied, total, warmup, p.lr, p.min_lr)
            opt.step()
            applied += 1
    return model


def text_data(n: int = 45, vocab: int = 30, per_token: bool = True) -> TextData:
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(2, 19, (n,), generator=g).tolist()
    seqs = [torch.randint(1, vocab, (k,), generator=g) for k in lengths]
    if not per_token:
        return TextData(seqs, torch.randint(0, 4, (n,), generator=g))
    targets = [torch.randint(0, 4, (k,), generator=g) for k in lengths]
    for t in targets:
        t[torch.rand(len(t), generator=g) < 0.2] = IGNORE_INDEX  # unlabelled tokens carry no loss
    return TextData(seqs, targets)


def text_model(head: str) -> TextTransformer:
    torch.manual_seed(2)
    return TextTransformer(vocab_size=30, out_features=4, d_model=16, n_heads=2, n_layers=1, dropout=0.0, head=head)


class InfGrads(nn.Module):
    """An MLP whose gradients become inf on chosen attempts (1-based; its hook counts backward passes per update)."""

    def __init__(self, bad: set[int], accumulate: int, value: float = math.inf) -> None:
        super().__init__()
        self.net = mlp()
        self.bad, self.accumulate, self.calls = bad, accumulate, 0

        def hook(grad: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            attempt = (self.calls - 1) // self.accumulate + 1
            return grad * value if attempt in self.bad else grad

        self.net.net[0].weight.register_hook(hook)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


def training_state(t: Trainer) -> dict[str, torch.Tensor]:
    """Everything an update may change: weights, every optimizer state tensor (step counts included), the number of
    applied updates and the learning rate. Read on the host; for comparisons only."""
    tensors, meta = flatten_optimizer(t.optimizer.state_dict())
    applied = t.counters.applied
    out = {f"model/{k}": v.detach().clone() for k, v in t.model.state_dict().items()}
    out |= {f"optimizer/{k}": v.detach().clone() for k, v in tensors.items()}
    out |= {f"optimizer/{pid}/{k}": torch.tensor(v) for pid, kv in meta["scalars"].items() for k, v in kv.items()}
    out["applied"] = torch.tensor(applied)
    return out


def record_steps(
    t: Trainer, read: Callable[[Trainer], dict[str, torch.Tensor]] = training_state
) -> list[dict[str, dict[str, torch.Tensor]]]:
    """The training state (`read` of the trainer) before and after each update `t` runs from now on, in a list that
    grows as it trains."""
    steps: list[dict[str, dict[str, torch.Tensor]]] = []
    step = t.train_step

    def recorded(micro: list[Any], count: int | None = None) -> None:
        before = read(t)
        step(micro, count)
        steps.append({"before": before, "after": read(t)})

    t.train_step = recorded  # type: ignore[method-assign]
    return steps


class Interrupted(Exception):
    """What `crash_after` raises: a crash at an update boundary."""


def crash_after(t: Trainer, updates: int) -> None:
    """Make `t` raise Interrupted before the update after `updates` (fit() ends as a crash would end it there)."""
    step = t.train_step

    def crash(micro: list[Any], count: int | None = None) -> None:
        if t.state.updates == updates:
            raise Interrupted
        step(micro, count)

    t.train_step = crash  # type: ignore[method-assign]


def bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """The keys whose tensors differ in any bit (-0.0 vs 0.0 and NaN payloads count), or exist on one side only."""
    differ = sorted(set(a) ^ set(b))
    for k in sorted(set(a) & set(b)):
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape or x.numpy().tobytes() != y.numpy().tobytes():
            differ.append(k)
    return differ
