"""Skipped (non-finite) updates: nothing an update may change moves, on either decision path, for every optimizer,
whether the skipped update is the first, the second or a later one."""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_kit import InfGrads, bitwise_equal, make_trainer, mlp, record_steps, reference, rel, table
from support.skips import BAD, LR, OPTIMIZERS
from torch import nn
from torch.nn import functional as F

from trainflow.engine.checkpoint import CheckpointStore, load_checkpoint
from trainflow.engine.optim import build_optimizer, plan_groups
from trainflow.engine.schedule import lr_at
from trainflow.engine.trainer import NonFiniteError, Trainer
from trainflow.params import TrainParams


def run_recording(tmp: Path, optimizer: str, on_device: bool) -> tuple[Trainer, InfGrads, list[dict[str, Any]]]:
    """fit() with the decision path forced, recording the training state before and after every update."""
    model = InfGrads(BAD, accumulate=2)
    t = make_trainer(tmp, model, optimizer=optimizer, lr=LR[optimizer], batch_size=16, accumulate=2, epochs=4)
    t.decide_on_device = on_device
    steps = record_steps(t)
    t.fit(table(n=96), table(n=96))
    return t, model, steps


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_skipped_updates_change_nothing_and_both_paths_agree_bit_for_bit(tmp_path: Path, optimizer: str) -> None:
    runs = {on_device: run_recording(tmp_path / str(on_device), optimizer, on_device) for on_device in (True, False)}
    for on_device, (t, _, steps) in runs.items():
        assert len(steps) == 12 and t.state.applied == 12 - len(BAD)
        for k, s in enumerate(steps, start=1):
            if k in BAD:  # weights, every optimizer state tensor, step counts and the applied count: not one bit
                assert bitwise_equal(s["before"], s["after"]) == [], (on_device, k)
            else:
                assert bitwise_equal(s["before"], s["after"]), (on_device, k)  # an applied update changes things
    # The device path (what runs on a GPU, forced here on the CPU) and the host path agree after every update.
    for k, (dev, host) in enumerate(zip(runs[True][2], runs[False][2]), start=1):
        assert bitwise_equal(dev["after"], host["after"]) == [], k
    assert runs[True][0].state.history == runs[False][0].state.history

    # And both match a plain PyTorch loop (unfused optimizer) that never attempts those updates.
    t, model, _ = runs[True]
    data = table(n=96)

    def mean_loss(m: nn.Module, idx: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(m(data.x[idx]), data.y[idx])

    ref = reference(mlp(), len(data), mean_loss, t.p, skip=BAD)
    assert rel(model.net, ref) <= 1e-5
    assert rel(mlp(), ref) > 1e-2  # it did train


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_every_optimizer_starts_with_the_state_its_first_update_would_create(optimizer: str) -> None:
    """A skipped first update has nothing to allocate only if the state exists beforehand, as the real one would be."""
    p = TrainParams(optimizer=optimizer)
    specs = plan_groups(mlp(), p)
    ours = build_optimizer(specs, p, torch.full((len(specs),), p.lr))
    fresh_model = mlp()
    # The same optimizer, same settings, initialising itself lazily on a real first update.
    accepted = inspect.signature(type(ours)).parameters
    settings = {k: v for k, v in ours.defaults.items() if k in accepted}
    fresh = type(ours)(fresh_model.parameters(), **{**settings, "lr": p.lr})
    F.cross_entropy(fresh_model(torch.randn(4, 6)), torch.tensor([0, 1, 2, 0])).backward()
    fresh.step()
    ours_state = [ours.state[q] for g in ours.param_groups for q in g["params"]]
    fresh_state = [fresh.state[q] for q in fresh_model.parameters()]
    assert len(ours_state) == len(fresh_state) == 4
    for mine, theirs in zip(sorted(ours_state, key=_shape_key), sorted(fresh_state, key=_shape_key)):
        assert set(mine) == set(theirs)
        for key in mine:
            assert (mine[key].shape, mine[key].dtype, mine[key].device) == (
                theirs[key].shape,
                theirs[key].dtype,
                theirs[key].device,
            )
            assert not mine[key].any()  # zero: the first update's starting point


def _shape_key(state: dict[str, torch.Tensor]) -> tuple[int, ...]:
    t = next(v for v in state.values() if v.ndim)
    return tuple(t.shape)


def test_skipped_updates_leave_the_schedule_alone(tmp_path: Path) -> None:
    data = table(n=192)
    bad = {5, 6, 14}
    model = InfGrads(bad, accumulate=1)
    t = make_trainer(tmp_path, model, batch_size=32, accumulate=1, epochs=4, max_nonfinite=3)
    t.fit(data, data)
    assert (t.state.updates, t.state.applied) == (24, 21)

    def mean_loss(m: nn.Module, idx: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(m(data.x[idx]), data.y[idx])

    ref = reference(mlp(), len(data), mean_loss, t.p, skip=bad)
    assert rel(model.net, ref) <= 1e-5
    # The schedule stood still on the skips: the last applied update used the rate of applied update 20.
    assert math.isclose(float(t.lr), lr_at("cosine", 20, 24, round(0.2 * 24), t.p.lr, t.p.min_lr), rel_tol=1e-6)


@pytest.mark.parametrize("on_device", [True, False])
def test_a_nan_loss_is_left_out_of_the_logged_train_loss(tmp_path: Path, on_device: bool) -> None:
    """One NaN window must not turn every later train_loss into NaN: logged losses cover applied updates only."""
    records: list[dict[str, float]] = []

    class Keep:
        def log(self, metrics: dict[str, float], step: int) -> None:
            if "train_loss" in metrics:
                records.append({"step": step, **metrics})

        def close(self) -> None:
            pass

    class NaNLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net, self.calls = mlp(), 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            out: torch.Tensor = self.net(x)
            return out * math.nan if self.calls == 3 else out  # the third window's loss is NaN

    data = table(n=96)
    model = NaNLoss()
    t = make_trainer(tmp_path, model, batch_size=32, epochs=2, log_every=2, eval_every=1000)
    t.decide_on_device = on_device
    t.logger = Keep()
    t.fit(data, data)
    assert [(r["step"], r["skipped_updates"]) for r in records] == [(2, 0), (4, 1), (6, 1)]

    # The same windows in a plain loop that never attempts window 3: each logged value is the mean of the applied
    # windows' losses since the last log (all windows hold 32 samples).
    def mean_loss(m: nn.Module, idx: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(m(data.x[idx]), data.y[idx])

    losses: dict[int, float] = {}
    reference(mlp(), len(data), mean_loss, t.p, skip={3}, losses=losses)
    expected = [(losses[1] + losses[2]) / 2, losses[4], (losses[5] + losses[6]) / 2]
    assert [r["train_loss"] for r in records] == pytest.approx(expected, rel=1e-5)


def test_too_many_non_finite_updates_stop_with_the_last_good_checkpoint_kept(tmp_path: Path) -> None:
    data = table(n=192)
    model = InfGrads(set(range(9, 100)), accumulate=1)
    t = make_trainer(tmp_path, model, batch_size=32, max_nonfinite=3, checkpoint_every=4, log_every=1)
    with pytest.raises(NonFiniteError, match="3 consecutive updates had a non-finite") as err:
        t.fit(data, data)
    assert str(tmp_path) in str(err.value)
    latest = CheckpointStore(tmp_path, keep_last=5).latest()
    assert latest is not None and latest.name == "step-000000008"
    saved = load_checkpoint(latest).tensors["model"]
    live = model.state_dict()
    assert sorted(saved) == sorted(live) and len(saved) == 4
    # The checkpoint holds the weights of 8 applied updates: the skipped 9th-11th changed nothing ...
    assert all(torch.equal(saved[k], live[k]) for k in live)

    # ... and they are what a plain loop reaches after 8 updates (not, say, the initial weights).
    def mean_loss(m: nn.Module, idx: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(m(data.x[idx]), data.y[idx])

    ref = reference(mlp(), len(data), mean_loss, t.p, stop_after=8)
    expected = {f"net.{k}": v for k, v in ref.state_dict().items()}
    for k in expected:
        assert torch.allclose(saved[k], expected[k], rtol=1e-5, atol=1e-6), k
    assert not torch.allclose(saved["net.net.0.weight"], mlp().state_dict()["net.0.weight"])
