"""fp16 + GradScaler on CPU: overflowing updates are skipped and change nothing, the scale backs off and grows once
per update (not per micro-batch), the schedule only counts applied updates; `precision: auto` never picks emulated
bf16."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from engine_kit import bitwise_equal, make_trainer, mlp, table, training_state

from trainflow.engine.loaders import TensorData
from trainflow.engine.precision import resolve_precision


@pytest.mark.parametrize("on_device", [True, False])
def test_overflows_are_skipped_and_the_scale_backs_off_and_grows_once_per_update(
    tmp_path: Path, on_device: bool
) -> None:
    t = make_trainer(tmp_path, mlp(), precision="fp16", batch_size=8, accumulate=4, epochs=6, max_nonfinite=100)
    t.decide_on_device = on_device
    # Too high a start, so the first updates overflow; growth every 3 finite updates, so it overflows again later.
    t.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24, growth_interval=3)
    seen: list[dict[str, Any]] = []
    step = t.train_step

    def recorded(micro: list[Any], count: int) -> None:
        before = training_state(t)
        scale = t.scaler.get_scale() if seen else 2.0**24  # the scale tensor is created on the first step
        lr_index = before["applied"].item()
        step(micro, count)
        after = training_state(t)
        seen.append(
            {
                "scale": scale,
                "skipped": int(after["applied"]) == lr_index,
                "unchanged": not bitwise_equal(before, after),
                "lr": float(t.lrs[0]),  # the rate the optimizer stepped with (one group, scale 1)
                "rate": t._rates[lr_index],
            }
        )

    t.train_step = recorded  # type: ignore[method-assign]
    t.fit(table(n=192), table(n=192))

    skipped = [s["skipped"] for s in seen]
    assert len(seen) == 36 and 3 <= sum(skipped) <= 20 and skipped[:2] == [True, True]
    assert not all(skipped[-10:])  # it recovered and trains
    # A skipped update changes nothing (weights, optimizer state, applied count); an applied one does.
    assert all(s["unchanged"] == s["skipped"] for s in seen)
    # Applied updates use the schedule's rate at their own index: skips do not advance the schedule.
    assert all(s["lr"] == pytest.approx(s["rate"], rel=1e-6) for s in seen if not s["skipped"])
    # The scale follows GradScaler's rule applied once per update (4 micro-batches each), computed here by hand:
    # halve after an overflow; double after 3 finite updates in a row.
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
    grew = sum(b["scale"] > a["scale"] for a, b in zip(seen, seen[1:]))
    assert grew >= 2  # growth happened, and then overflowed again: both directions exercised


def test_fp16_trains_on_cpu_like_fp32(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 6, generator=g)
    data = TensorData(x, (x @ torch.randn(6, 3, generator=g)).argmax(1))  # a linear rule: learnable
    runs = {}
    for precision in ("fp32", "fp16"):
        t = make_trainer(tmp_path / precision, mlp(), precision=precision, batch_size=32, epochs=15, lr=1e-2)
        t.fit(data, data)
        runs[precision] = t.evaluate(data)["val_loss"]
    assert runs["fp16"] == pytest.approx(runs["fp32"], rel=0.02)
    assert runs["fp32"] < 0.3  # it learned (chance is ln 3 = 1.10)


def cuda_like(monkeypatch: pytest.MonkeyPatch, major: int, emulates_bf16: bool) -> None:
    """Pretend a CUDA GPU of compute capability `major`.x is visible, whose driver can emulate bf16 tensors."""
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: SimpleNamespace(major=major, minor=0))
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda _: emulates_bf16)


@pytest.mark.parametrize(("major", "expected"), [(7, "fp32"), (8, "bf16"), (9, "bf16")])
def test_auto_precision_picks_bf16_only_where_it_is_native(
    monkeypatch: pytest.MonkeyPatch, major: int, expected: str
) -> None:
    cuda_like(monkeypatch, major, emulates_bf16=True)  # V100/T4 (7.x) accept bf16 tensors, computing them slowly
    assert resolve_precision("auto", torch.device("cuda")).name == expected
    assert resolve_precision("auto", torch.device("cpu")).name == "fp32"


def test_fp16_is_allowed_on_cpu() -> None:
    p = resolve_precision("fp16", torch.device("cpu"))
    assert (p.name, p.uses_scaler, p.dtype) == ("fp16", True, torch.float16)
