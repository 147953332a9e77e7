"""train.epochs auto: a number of epochs planned from the updates an epoch takes (at least AUTO_UPDATES updates, at
least AUTO_EPOCHS epochs), the schedule planned over them, train.max_steps still the cap, and a resumed run keeping
the number its checkpoint planned, bit for bit, even where planning afresh would give another."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import pytest
import torch
from engine_kit import make_trainer, mlp, table

from trainflow.engine import trainer as engine
from trainflow.engine.trainer import Trainer, planned_epochs

ROWS, BATCH = 20, 8  # 3 updates an epoch (8 + 8 + 4 rows)


def test_auto_is_enough_epochs_for_the_updates_and_never_fewer_than_the_minimum() -> None:
    assert (engine.AUTO_UPDATES, engine.AUTO_EPOCHS) == (1000, 40)
    assert planned_epochs(3, 1) == 3  # a number is itself, whatever an epoch takes
    assert [planned_epochs("auto", per_epoch) for per_epoch in (1, 3, 7, 25, 26, 20, 500)] == [
        1000, 334, 143, 40, 40, 50, 40]  # fmt: skip
    for per_epoch in range(1, 60):
        epochs = planned_epochs("auto", per_epoch)
        assert epochs >= 40 and epochs * per_epoch >= 1000
        assert epochs == 40 or (epochs - 1) * per_epoch < 1000  # no more than needed


def test_the_schedule_runs_over_the_planned_updates_and_max_steps_still_caps_them(tmp_path: Path) -> None:
    t = make_trainer(tmp_path / "a", mlp(), epochs="auto", batch_size=BATCH, warmup_fraction=0.1)
    t.prepare(table(n=ROWS))
    assert (t.plan.per_epoch, t.plan.epochs, t.plan.total) == (3, 334, 1002)
    # cosine over the 1,002 updates (and one rate past the end): warmed up by update 100, at min_lr at the end
    assert len(t._rates) == 1003 and t._rates[98] < t._rates[99] == pytest.approx(t.p.lr, rel=1e-6)
    assert t._rates[-1] == pytest.approx(t.p.min_lr, rel=1e-6)
    capped = make_trainer(tmp_path / "b", mlp(), epochs="auto", batch_size=BATCH, max_steps=5)
    state = capped.fit(table(n=ROWS), table(n=ROWS))
    assert (state.updates, state.epoch, state.planned_epochs, capped.plan.total) == (5, 1, 334, 5)


def run(tmp: Path, stop_after: int | None = None) -> Trainer:
    t = make_trainer(tmp, mlp(), epochs="auto", batch_size=BATCH, resume="auto", checkpoint_every=1, eval_every=2)
    if stop_after is not None:
        step = t.train_step

        def crash(micro: list[object], count: int) -> None:
            if t.state.updates == stop_after:
                raise KeyboardInterrupt
            step(micro, count)  # type: ignore[arg-type]

        t.train_step = crash  # type: ignore[method-assign]
    with contextlib.suppress(KeyboardInterrupt):
        t.fit(table(n=ROWS), table(n=ROWS))
    return t


def test_a_resumed_run_keeps_the_epochs_its_checkpoint_planned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planned with 12 updates (4 epochs of 3), interrupted at update 5, resumed where auto would now plan 10 epochs
    (as another number of processes, with other windows, could): it still trains the 4 epochs, to the same bits."""
    monkeypatch.setattr(engine, "AUTO_EPOCHS", 1)
    monkeypatch.setattr(engine, "AUTO_UPDATES", 12)
    whole = run(tmp_path / "whole")
    assert (whole.state.updates, whole.state.planned_epochs) == (12, 4)
    run(tmp_path / "cut", stop_after=5)
    monkeypatch.setattr(engine, "AUTO_UPDATES", 30)
    resumed = run(tmp_path / "cut")
    assert resumed.resumed_from == 5
    assert (resumed.state.updates, resumed.state.epoch, resumed.state.planned_epochs) == (12, 4, 4)
    assert resumed.plan.total == 12
    assert whole.final_weights is not None and resumed.final_weights is not None
    for name, weights in whole.final_weights.items():
        assert torch.equal(resumed.final_weights[name], weights), name
    fresh = run(tmp_path / "fresh")  # planned afresh, the new number holds
    assert (fresh.state.planned_epochs, fresh.state.updates) == (10, 30) == (math.ceil(30 / 3), 30)
