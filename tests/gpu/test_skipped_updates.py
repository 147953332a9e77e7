"""Skipped (non-finite) updates on the GPU's decision path: weights, every optimizer state tensor and the schedule
(the applied count, and the rate each applied update uses) are bitwise what they were, whether the skipped update is
the first, the second or a later one, for adamw and sgd; and the run ends where a plain PyTorch loop that never
attempts those updates ends. tests/engine/test_skips.py runs the same on the CPU, the device path forced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from engine_kit import InfGrads, bitwise_equal, mlp, reference, rel, table, training_state
from support.skips import BAD, LR, OPTIMIZERS
from torch import nn
from torch.nn import functional as F

from trainflow.engine.schedule import lr_at
from trainflow.engine.trainer import Trainer

from .gpu_kit import CUDA, cuda_trainer, on_host


def run_recording(tmp: Path, optimizer: str) -> tuple[Trainer, InfGrads, list[dict[str, Any]]]:
    """fit() on the GPU, recording before and after every update: the training state (read to the host) and the
    rate the update used."""
    model = InfGrads(BAD, accumulate=2)
    t = cuda_trainer(tmp, model, optimizer=optimizer, lr=LR[optimizer], batch_size=16, accumulate=2, epochs=4)
    steps: list[dict[str, Any]] = []
    step = t.train_step

    def recorded(micro: list[Any], count: int | None = None) -> None:
        before = on_host(training_state(t))
        step(micro, count)
        steps.append({"before": before, "after": on_host(training_state(t)), "lr": t.lr.item()})

    t.train_step = recorded  # type: ignore[method-assign,assignment]
    data = table(n=96)
    data.to(CUDA)
    t.fit(data, data)
    return t, model, steps


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_skipped_updates_change_nothing_on_the_gpu(tmp_path: Path, optimizer: str) -> None:
    t, model, steps = run_recording(tmp_path, optimizer)
    assert t.decide_on_device  # the path a GPU takes, not the host one
    assert len(steps) == 12 and t.state.applied == 12 - len(BAD)
    p = t.p
    total, warmup = t.plan.total, round(p.warmup_fraction * t.plan.total)
    for k, s in enumerate(steps, start=1):
        if k in BAD:  # weights, every optimizer state tensor, step counts and the applied count: not one bit
            assert bitwise_equal(s["before"], s["after"]) == [], k
        else:
            assert bitwise_equal(s["before"], s["after"]), k  # an applied update changes things
            # The schedule: an applied update uses the rate of its place among the *applied* updates.
            applied = int(s["before"]["applied"])
            assert s["lr"] == float(t._table[applied]), k
            assert s["lr"] == pytest.approx(lr_at(p.schedule, applied, total, warmup, p.lr, p.min_lr), rel=1e-6), k

    # The same windows in a plain PyTorch loop on the CPU (unfused optimizer) that never attempts those updates.
    data = table(n=96)

    def mean_loss(m: nn.Module, idx: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(m(data.x[idx]), data.y[idx])

    ref = reference(mlp(), len(data), mean_loss, p, skip=BAD)
    assert rel(model.net.cpu(), ref) <= 1e-5
    assert rel(mlp(), ref) > 1e-2  # it did train


def test_fp16_overflows_are_skipped_and_the_scale_follows_the_gradscalers_rule(tmp_path: Path) -> None:
    """fp16 with CUDA's GradScaler, started too high (the first updates overflow) and growing every 3 finite updates
    (so it overflows again later): a skipped update changes nothing, applied ones use the schedule's rate at their
    own index, and the scale halves or doubles once per update (4 micro-batches each), as computed here by hand.
    tests/engine/test_fp16.py runs the same with the CPU's GradScaler."""
    t = cuda_trainer(tmp_path, mlp(), precision="fp16", batch_size=8, accumulate=4, epochs=6, max_nonfinite=100)
    t.scaler = torch.amp.GradScaler("cuda", init_scale=2.0**24, growth_interval=3)
    seen: list[dict[str, Any]] = []
    step = t.train_step

    def recorded(micro: list[Any], count: int | None = None) -> None:
        before = on_host(training_state(t))
        scale = t.scaler.get_scale() if seen else 2.0**24  # the scale tensor is created on the first step
        index = int(before["applied"])
        step(micro, count)
        after = on_host(training_state(t))
        skipped = int(after["applied"]) == index
        seen.append({"scale": scale, "skipped": skipped, "unchanged": not bitwise_equal(before, after),
                     "lr": t.lr.item(), "rate": float(t._table[index])})  # fmt: skip

    t.train_step = recorded  # type: ignore[method-assign,assignment]
    data = table(n=192)
    data.to(CUDA)
    t.fit(data, data)

    skipped = [s["skipped"] for s in seen]
    assert len(seen) == 36 and 3 <= sum(skipped) <= 20 and skipped[:2] == [True, True]
    assert not all(skipped[-10:])  # it recovered and trains
    assert all(s["unchanged"] == s["skipped"] for s in seen)
    assert all(s["lr"] == s["rate"] for s in seen if not s["skipped"])
    scale, streak = 2.0**24, 0
    for s in seen:
        assert s["scale"] == scale
        if s["skipped"]:
            scale, streak = scale / 2, 0
        else:
            streak += 1
            if streak == 3:
                scale, streak = scale * 2, 0
    assert t.scaler.get_scale() == scale
    assert sum(b["scale"] > a["scale"] for a, b in zip(seen, seen[1:])) >= 2  # it grew, and overflowed again
