"""The engine against plain PyTorch (fp32, CPU): accumulation, skipped updates, schedules, evaluation, retention;
and its records pinned whole: every logged metric and history row, the checkpoint files (meta.json, best.json,
preempted.json) and the messages the trainer prints, each against a hand-written loop or numbers worked by hand on a
two-feature linear model (tests/support/linear_run.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_kit import make_trainer, mlp, reference, rel, table, text_data, text_model
from support.linear_run import RUN, VX, VY, Lin, X, Y, data, fit, linear
from torch import nn
from torch.nn import functional as F

from trainflow.core.errors import UserError
from trainflow.engine import flops
from trainflow.engine.checkpoint import CheckpointError, CheckpointStore, load_checkpoint, save_checkpoint
from trainflow.engine.loaders import IGNORE_INDEX, Batch, TensorData, TextData, epoch_order
from trainflow.engine.objective import Objective
from trainflow.engine.schedule import Plateau, lr_at
from trainflow.models import MLP, build_model
from trainflow.models.text import TextTransformer


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_accumulation_matches_plain_pytorch_with_a_partial_window(tmp_path: Path, optimizer: str) -> None:
    data = table()  # 203 samples in windows of 32: each epoch ends with a partial window of 11
    kw = {"optimizer": optimizer, "lr": 0.05 if optimizer == "sgd" else 2e-3}
    big = make_trainer(tmp_path / "a", mlp(), batch_size=32, accumulate=1, **kw)
    big.fit(data, data)
    small = make_trainer(tmp_path / "b", mlp(), batch_size=8, accumulate=4, **kw)
    small.fit(data, data)
    assert big.state.updates == small.state.updates == 3 * 7 >= 20

    def mean_loss(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(data.x[idx]), data.y[idx])

    ref = reference(mlp(), len(data), mean_loss, big.p)
    assert rel(small.model, big.model) <= 1e-5
    assert rel(small.model, ref) <= 1e-5
    assert rel(mlp(), ref) > 1e-2  # it did train


@pytest.mark.parametrize("head", ["token", "sequence"])
def test_accumulation_of_padded_variable_length_text_matches_plain_pytorch(tmp_path: Path, head: str) -> None:
    data = text_data(per_token=head == "token")  # 45 sequences in windows of 8: the last window holds 5
    kw = {"epochs": 4, "lr": 1e-3}
    big = make_trainer(tmp_path / "a", text_model(head), batch_size=8, accumulate=1, **kw)
    big.fit(data, data)
    small = make_trainer(tmp_path / "b", text_model(head), batch_size=2, accumulate=4, **kw)
    small.fit(data, data)
    assert big.state.updates == 4 * 6 >= 20

    def mean_loss(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
        # The whole window padded as one batch; the mean over its real (labelled) tokens.
        b = data.batch(idx)
        out = model(**b.inputs)
        return F.cross_entropy(out.reshape(-1, 4), b.target.reshape(-1), ignore_index=IGNORE_INDEX)

    ref = reference(text_model(head), len(data), mean_loss, big.p, orders=data.epoch_order)
    assert rel(small.model, big.model) <= 1e-5
    assert rel(small.model, ref) <= 1e-5
    if head == "token":
        # A per-micro-batch mean (what Lightning and HF before 4.46 did) gives other weights.
        def biased(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
            parts = [mean_loss(model, i) for i in idx.split(2)]
            return torch.stack(parts).mean()

        wrong = reference(text_model(head), len(data), biased, big.p, orders=data.epoch_order)
        assert rel(wrong, ref) > 1e-4


def test_schedules() -> None:
    peak, floor = 1e-2, 1e-4
    assert [round(lr_at("cosine", k, 100, 10, peak, floor), 6) for k in (0, 9)] == [0.001, 0.01]
    assert math.isclose(lr_at("cosine", 100, 100, 10, peak, floor), floor)
    assert math.isclose(lr_at("linear", 55, 100, 10, peak, floor), (peak + floor) / 2)
    assert lr_at("constant", 80, 100, 10, peak, floor) == peak
    assert math.isclose(lr_at("one_cycle", 0, 100, 30, peak, floor), peak / 25)
    assert math.isclose(lr_at("one_cycle", 30, 100, 30, peak, floor), peak)
    assert math.isclose(lr_at("one_cycle", 99, 100, 30, peak, floor), floor)
    plateau = Plateau(factor=0.5, patience=2, floor_scale=0.3)
    seen = [plateau.observe(improved) for improved in (True, False, False, False, False, False, False)]
    assert seen == [False, False, True, False, True, False, False] and plateau.scale == 0.3


def test_plateau_lowers_the_rate_when_the_monitor_stalls(tmp_path: Path) -> None:
    data = table(n=64)
    t = make_trainer(
        tmp_path, mlp(), batch_size=32, epochs=6, schedule="plateau", warmup_fraction=0.0, lr=0.1, min_lr=0.01,
        min_delta=100.0, plateau_patience=2, plateau_factor=0.5,
    )  # fmt: skip
    t.fit(data, data)  # nothing beats the first evaluation by 100: every later one is a bad one
    assert [round(r["lr"], 6) for r in t.state.history] == [0.1, 0.1, 0.1, 0.05, 0.05, 0.025]


def test_eval_every_early_stopping_in_evaluations_and_retention(tmp_path: Path) -> None:
    train, val = table(n=203), table(n=203, seed=1)  # unrelated labels: val_loss stops improving as train is learnt
    kw: dict[str, Any] = {"batch_size": 8, "epochs": 5, "eval_every": 10, "checkpoint_every": 3, "keep_last": 2}
    t = make_trainer(tmp_path, mlp(), patience=3, min_delta=0.02, **kw)
    t.fit(train, val)
    planned = 5 * 26  # epochs * ceil(203 / 8)
    history = t.state.history
    updates = [int(r["update"]) for r in history]
    assert updates == list(range(10, 10 * len(updates) + 1, 10))  # every 10 updates, counted in evaluations
    # The rule by hand: an evaluation improves if val_loss < best - 0.02; stop at the 3rd one in a row that does not.
    best, bad, stop = math.inf, 0, None
    for i, r in enumerate(history):
        if r["val_loss"] < best - 0.02:
            best, bad = r["val_loss"], 0
        else:
            bad += 1
            if bad == 3:
                stop = i
                break
    assert stop == len(history) - 1 and t.state.stopped_early and t.state.updates < planned
    assert t.state.best_metric == min(r["val_loss"] for r in history[: stop - 2])
    assert updates[-1] - t.state.best_update == 30 and t.state.bad_evals == 3
    # Without the patience rule the same run goes the whole way.
    full = make_trainer(tmp_path / "full", mlp(), patience=1000, min_delta=0.02, **kw)
    full.fit(train, val)
    assert full.state.updates == planned and not full.state.stopped_early

    store = CheckpointStore(tmp_path, 2)
    steps = [p.name for p in store.steps()]
    best_step = store.best()
    assert best_step is not None and best_step.name == f"step-{t.state.best_update:09d}"
    assert best_step.name in steps  # retention never deletes the best ...
    assert steps[-1] == f"step-{t.state.updates:09d}"  # ... or the last
    assert len(set(steps) - {best_step.name}) == 2  # and keeps k periodic ones
    exported = load_checkpoint(best_step).tensors["model"]
    assert all(torch.equal(exported[k], v) for k, v in t.model.state_dict().items())  # fit() leaves the best weights


def test_smoke_run_aids(tmp_path: Path) -> None:
    data = table(n=203)
    t = make_trainer(tmp_path / "a", mlp(), batch_size=8, epochs=50, max_steps=7)
    t.fit(data, data)
    assert t.state.updates == 7
    t = make_trainer(tmp_path / "b", mlp(), batch_size=8, epochs=3, limit_batches=2)
    t.fit(data, data)
    assert (t.state.updates, t.state.epoch) == (6, 3)
    torch.manual_seed(0)
    # It gets all 16 right from epoch 20 on; 60 epochs leave room
    t = make_trainer(
        tmp_path / "c", MLP(6, 3, [64], 0.0), batch_size=16, epochs=60, overfit_batches=1, lr=1e-2,
        weight_decay=0.0, warmup_fraction=0.0, schedule="constant",
    )  # fmt: skip
    t.fit(data, data)
    assert t.state.history[-1]["val_accuracy"] == 1.0  # 16 random labels memorised: the pipeline can learn


def test_detect_anomaly_names_the_op(tmp_path: Path) -> None:
    class Sqrt(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(6, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) + (self.lin.weight.sum() - 1e6).sqrt()

    t = make_trainer(tmp_path, Sqrt(), batch_size=8, detect_anomaly=True)
    # Without anomaly mode the NaN would only be skipped, then reported as NonFiniteError; with it autograd stops at
    # the op whose backward produced it and warns with that op's forward traceback.
    with pytest.raises(RuntimeError, match="returned nan values"), pytest.warns(UserWarning, match="forward call"):
        t.fit(table(), table())


def test_regression_objective_reports_in_the_targets_units(tmp_path: Path) -> None:
    from sklearn.metrics import mean_squared_error, r2_score

    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 6, generator=g)
    y = 500.0 + 40.0 * (x @ torch.arange(1.0, 7.0)) + 4.0 * torch.randn(256, generator=g)  # target units
    mean, std = float(y.mean()), float(y.std(correction=0))
    data = TensorData(x, (y - mean) / std)  # what the train stage feeds the engine: standardised targets
    torch.manual_seed(0)
    t = make_trainer(tmp_path, MLP(6, 1, [32], 0.0), task="regression", batch_size=32, epochs=60, lr=1e-2,
                     monitor="val_r2")  # fmt: skip
    t.objective = Objective("regression", target_scale=std)
    t.fit(data, data)
    assert t.p.minimize is False
    with torch.no_grad():
        predicted = (t.model(x).reshape(-1) * std + mean).double().numpy()
    truth = y.double().numpy()
    metrics = t.evaluate(data)
    assert metrics["val_rmse"] == pytest.approx(mean_squared_error(truth, predicted) ** 0.5, rel=1e-4)
    assert metrics["val_loss"] == pytest.approx(mean_squared_error(truth, predicted), rel=1e-4)
    assert metrics["val_r2"] == pytest.approx(r2_score(truth, predicted), abs=1e-5)
    assert metrics["val_r2"] > 0.98 and metrics["val_rmse"] < 0.15 * std  # it learned the linear rule
    # The train loss is in the same units as val_loss: comparable on one plot.
    last = t.state.history[-1]
    assert 0.2 < last["train_loss"] / last["val_loss"] < 5
    bad = make_trainer(tmp_path / "x", MLP(6, 1, [4], 0.0), task="regression", monitor="val_accuracy")
    with pytest.raises(UserError, match="train.monitor"):
        bad.fit(data, data)


def test_user_models_by_import_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "usermodels.py").write_text(
        "import torch\n"
        "class Tiny(torch.nn.Module):\n"
        "    def __init__(self, in_features, out_features, width=4):\n"
        "        super().__init__()\n"
        "        self.net = torch.nn.Sequential(\n"
        "            torch.nn.Linear(in_features, width), torch.nn.Linear(width, out_features)\n"
        "        )\n"
        "    def forward(self, x):\n"
        "        return self.net(x)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    model = build_model({"name": "usermodels:Tiny", "in_features": 6, "out_features": 3, "vocab_size": 9, "width": 5})
    assert model.net[0].out_features == 5  # type: ignore[index]
    with pytest.raises(UserError, match="widht"):
        build_model({"name": "usermodels:Tiny", "in_features": 6, "out_features": 3, "widht": 5})
    with pytest.raises(UserError, match="cannot import"):
        build_model({"name": "nosuchpackage.models:Net"})


def test_checkpoints_refuse_pickles_and_truncated_tensors(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    save_checkpoint(ckpt, {"model": {"w": torch.arange(1000.0)}}, {"epoch": 1})
    assert torch.equal(load_checkpoint(ckpt).tensors["model"]["w"], torch.arange(1000.0))
    (ckpt / "extra.pkl").write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(CheckpointError, match="extra.pkl"):
        load_checkpoint(ckpt)
    (ckpt / "extra.pkl").unlink()
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(ckpt)


def test_resume_refuses_a_corrupt_newest_checkpoint(tmp_path: Path) -> None:
    data = table(n=64)
    make_trainer(tmp_path, mlp(), batch_size=32, epochs=2).fit(data, data)
    newest = CheckpointStore(tmp_path, 2).latest()
    assert newest is not None
    (newest / "optimizer.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(CheckpointError, match="optimizer.safetensors"):
        make_trainer(tmp_path, mlp(), batch_size=32, epochs=3, resume="auto").fit(data, data)
    with pytest.raises(UserError, match="train.resume"):
        make_trainer(tmp_path, mlp(), batch_size=32, resume=str(tmp_path / "nope")).fit(data, data)


def test_length_bucketing_cuts_padding_and_keeps_a_seeded_permutation() -> None:
    g = torch.Generator().manual_seed(0)
    seqs = [torch.ones(int(k), dtype=torch.long) for k in torch.randint(1, 200, (4000,), generator=g)]
    bucketed = TextData(seqs, torch.zeros(4000, dtype=torch.long))
    plain = TextData(seqs, torch.zeros(4000, dtype=torch.long), bucket=0)
    order = bucketed.epoch_order(seed=3, epoch=1)
    assert sorted(order.tolist()) == list(range(4000)) and torch.equal(order, bucketed.epoch_order(3, 1))

    def padded(data: TextData, o: torch.Tensor) -> int:
        return sum(data.batch(i).inputs["tokens"].numel() for i in o.split(32))

    assert padded(bucketed, order) < 0.6 * padded(plain, plain.epoch_order(3, 1))


def test_batch_counts_are_host_ints() -> None:
    data = text_data()
    b: Batch = data.batch(torch.arange(5))
    assert isinstance(b.count, int) and b.count == int((b.target != IGNORE_INDEX).sum())
    assert data.tokens(torch.arange(5)) == int(b.inputs["mask"].sum())


@pytest.mark.slow  # torch.compile's first compile (~25 s on 2 cores)
def test_compile_trains_like_eager_and_saves_the_plain_model(tmp_path: Path) -> None:
    data = table(n=96)
    eager = make_trainer(tmp_path / "a", mlp(), batch_size=32, epochs=2)
    eager.fit(data, data)
    compiled = make_trainer(tmp_path / "b", mlp(), batch_size=32, epochs=2, compile=True)
    compiled.fit(data, data)
    assert compiled.forward is not compiled.model  # it trained through the compiled wrapper
    assert rel(compiled.model, eager.model) <= 1e-4  # inductor may fuse ops: not bitwise, but the same training
    saved = load_checkpoint(CheckpointStore(tmp_path / "b", 2).latest()).tensors["model"]  # type: ignore[arg-type]
    assert sorted(saved) == sorted(mlp().state_dict())  # no "_orig_mod." prefixes


def measured_flops(model: nn.Module, batch: Batch) -> int:
    """FLOPs of one forward and backward pass, counted by torch (FlopCounterMode), not by our formula."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        model(**batch.inputs).float().sum().backward()
    return int(counter.get_total_flops())


def test_throughput_and_mfu_are_logged(tmp_path: Path) -> None:
    records: list[dict[str, float]] = []

    class Keep:
        def log(self, metrics: dict[str, float], step: int) -> None:
            if "samples_per_s" in metrics:
                records.append(metrics)

        def close(self) -> None:
            pass

    # Text: one log per epoch, so tokens/s over samples/s is the mean real length of all sequences.
    data = text_data(per_token=False)  # 45 sequences in windows of 8: 6 updates per epoch
    t = make_trainer(tmp_path / "text", text_model("sequence"), batch_size=8, log_every=6)
    t.logger, t.peak_flops = Keep(), 1e12  # a pretend peak: MFU is only reported where the peak is known
    t.fit(data, data)
    assert len(records) == 3
    mean_length = float(data.lengths.double().mean())
    assert all(r["tokens_per_s"] / r["samples_per_s"] == pytest.approx(mean_length, rel=1e-9) for r in records)
    # The FLOPs estimate of a batch (6 x parameters per token, plus attention) against torch's own count, on a model
    # wide enough for matmuls to dominate (the estimate counts LayerNorm and bias parameters as matmul weights).
    wide = TextTransformer(vocab_size=30, out_features=4, d_model=64, n_heads=4, n_layers=2, dropout=0.0)
    b = data.batch(torch.arange(8))
    estimate = flops.flops_per_batch(wide)
    assert estimate is not None and estimate(b) == pytest.approx(measured_flops(wide, b), rel=0.2)

    # Tables: every sample costs the same, so MFU x peak / (samples/s) is the FLOPs of one sample — torch's count.
    records.clear()
    table_data = table(n=256)
    t = make_trainer(tmp_path / "mlp", MLP(6, 3, [64, 64], 0.0), batch_size=32, log_every=4)
    t.logger, t.peak_flops = Keep(), 1e12
    t.fit(table_data, table_data)
    per_sample = measured_flops(MLP(6, 3, [64, 64], 0.0), table_data.batch(torch.arange(32))) / 32
    assert len(records) == 6 and all(0 < r["mfu"] < 1 for r in records)
    assert all(r["mfu"] * 1e12 / r["samples_per_s"] == pytest.approx(per_sample, rel=0.25) for r in records)


# linear, 4 updates, warmup round(0.25 * 4) = 1: 0.5 * 1/1; then 0.5 + (0.05 - 0.5) * k/3 for k = 0, 1, 2.
RATES = [0.5, 0.5, 0.35, 0.2]


class Keep:
    """A logger that keeps every (step, metrics) it is given."""

    def __init__(self) -> None:
        self.records: list[tuple[int, dict[str, float]]] = []
        self.closed = False

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.records.append((step, dict(metrics)))

    def close(self) -> None:
        self.closed = True


def val_metrics(w: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """Cross-entropy, accuracy and 15-bin ECE of the val set, by hand."""
    logits = VX @ w.T + b
    p = logits.double().softmax(-1)
    loss = float(-p[torch.arange(len(VY)), VY].log().mean())
    conf, pred = p.max(-1)
    correct = (pred == VY).double()
    ece = 0.0
    for k in range(15):
        lo, hi = k / 15, (k + 1) / 15
        inside = [(c, r) for c, r in zip(conf.tolist(), correct.tolist(), strict=True) if lo < c <= hi]
        ece += abs(sum(r for _, r in inside) - sum(c for c, _ in inside)) / len(VY)
    return {"val_loss": loss, "val_accuracy": float(correct.mean()), "val_ece": ece}


def hand_run(
    rates: list[float] = RATES, epochs: int = 2, skip: tuple[int, ...] = (), bias_scale: float = 1.0
) -> tuple[list[dict[str, float]], list[tuple[torch.Tensor, torch.Tensor]]]:
    """The run in plain tensor maths: per update its mean loss, gradient norm and rate; the weights after each.
    Updates in `skip` (1-based) change nothing, and the schedule (`rates`, by applied update) does not advance."""
    w = torch.tensor([[0.5, -0.25], [0.125, 0.75]])
    b = torch.tensor([0.1, -0.2])
    steps: list[dict[str, float]] = []
    weights = []
    applied = 0
    for epoch in range(epochs):
        order = epoch_order(6, 7, epoch)
        for start in (0, 4):
            idx = order[start : start + 4]
            if len(steps) + 1 in skip:
                steps.append({"loss": math.nan, "grad_norm": math.nan, "lr": math.nan, "n": len(idx)})
                weights.append((w.clone(), b.clone()))
                continue
            wq, bq = w.clone().requires_grad_(), b.clone().requires_grad_()
            loss = F.cross_entropy(X[idx] @ wq.T + bq, Y[idx])
            loss.backward()
            assert wq.grad is not None and bq.grad is not None
            norm = float(torch.cat([wq.grad.flatten(), bq.grad.flatten()]).norm())
            coef = min(1.0, 0.5 / (norm + 1e-6))
            lr = rates[applied]
            applied += 1
            w = w - lr * (wq.grad * coef + 0.1 * w)  # SGD's weight decay: added to the gradient, on matrices only
            b = b - lr * bias_scale * (bq.grad * coef)
            steps.append({"loss": loss.item(), "grad_norm": norm, "lr": lr, "n": len(idx)})
            weights.append((w.clone(), b.clone()))
    return steps, weights


@pytest.mark.parametrize("on_device", [False, True], ids=["host", "device"])
def test_every_logged_record_and_history_row_matches_a_hand_written_loop(tmp_path: Path, on_device: bool) -> None:
    """log_every 1 logs each update's mean loss, rate, unclipped gradient norm and skips; each epoch's evaluation
    logs the val metrics and appends a history row with the epoch, the mean train loss since the last evaluation and
    the rate of the last update. The same whether the step decides on the host or (as on a GPU) on the device."""
    steps, weights = hand_run()
    t = make_trainer(tmp_path, linear(), **RUN)
    t.decide_on_device = on_device
    keep = Keep()
    t.logger = keep
    train, val = data()
    state = t.fit(train, val)
    logged = [(s, r) for s, r in keep.records if "train_loss" in r]
    assert [s for s, _ in logged] == [1, 2, 3, 4]
    for (_, r), ref in zip(logged, steps, strict=True):
        assert sorted(r) == ["grad_norm", "lr", "samples_per_s", "skipped_updates", "train_loss"]
        assert r["train_loss"] == pytest.approx(ref["loss"], rel=1e-6)
        assert r["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-6)
        assert r["lr"] == pytest.approx(ref["lr"], rel=1e-6)
        assert r["skipped_updates"] == 0.0 and r["samples_per_s"] > 0
    evals = [(s, r) for s, r in keep.records if "train_loss" not in r]
    v1, v2 = val_metrics(*weights[1]), val_metrics(*weights[3])
    assert [s for s, _ in evals] == [2, 4]
    for (_, r), ref in zip(evals, [v1, v2], strict=True):
        assert r == pytest.approx(ref, rel=1e-5, abs=1e-7)
    mean1 = (steps[0]["loss"] * 4 + steps[1]["loss"] * 2) / 6
    mean2 = (steps[2]["loss"] * 4 + steps[3]["loss"] * 2) / 6
    expected = [
        {"update": 2.0, "epoch": 1.0, "train_loss": mean1, **v1, "lr": 0.5},
        {"update": 4.0, "epoch": 2.0, "train_loss": mean2, **v2, "lr": 0.2},
    ]
    assert [list(r) for r in state.history] == [list(e) for e in expected]  # the keys, in order
    assert state.history == [pytest.approx(e, rel=1e-5, abs=1e-7) for e in expected]
    # The second evaluation is worse (0.8003 > 0.7883): the best is update 2, and fit() leaves its weights.
    assert v2["val_loss"] > v1["val_loss"]
    assert (state.best_update, state.best_metric) == (2, pytest.approx(v1["val_loss"], rel=1e-6))
    w, b = weights[1]
    assert torch.allclose(t.model.weight, w, atol=1e-6) and torch.allclose(t.model.bias, b, atol=1e-6)
    assert t.final_weights is not None and sorted(t.final_weights) == ["bias", "weight"]
    assert torch.equal(t.final_weights["weight"], t.model.weight.detach())
    counts = (state.updates, state.applied, state.epoch, state.position, state.samples, state.tokens)
    assert counts == (4, 4, 2, 0, 12, 0)
    assert (state.loss_terms, state.bad_evals, state.stopped_early, state.consecutive_nonfinite) == (12, 1, False, 0)
    assert (state.last_eval_update, state.checkpoint_update, t.resumed_from) == (4, 4, None)


def test_each_epoch_end_writes_a_whole_checkpoint_and_best_json_names_the_best(tmp_path: Path) -> None:
    """meta.json holds the fingerprint, the whole TrainState, the optimizer's groups and parameter names, the params,
    and which step is best; model.safetensors the weights of that update; best.json names the best step."""
    steps, weights = hand_run()
    t = make_trainer(tmp_path, linear(), **RUN)
    train, val = data()
    t.fit(train, val)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.json", "step-000000002", "step-000000004"]
    assert json.loads((tmp_path / "best.json").read_text()) == {"step": "step-000000002"}
    v1, v2 = val_metrics(*weights[1]), val_metrics(*weights[3])
    sums = [steps[0]["loss"] * 4 + steps[1]["loss"] * 2, steps[2]["loss"] * 4 + steps[3]["loss"] * 2]
    rows = [
        {"epoch": 1.0, "lr": 0.5, "train_loss": sums[0] / 6, "update": 2.0, **v1},
        {"epoch": 2.0, "lr": 0.2, "train_loss": sums[1] / 6, "update": 4.0, **v2},
    ]
    for update, bad in ((2, 0), (4, 1)):
        ckpt = tmp_path / f"step-{update:09d}"
        assert sorted(p.name for p in ckpt.iterdir()) == [
            "meta.json", "model.safetensors", "optimizer.safetensors", "rng.safetensors"
        ]  # fmt: skip
        meta = json.loads((ckpt / "meta.json").read_text())
        assert sorted(meta) == [
            "best_step", "fingerprint", "flops", "optimizer", "params", "plateau", "position_unit", "rng",
            "rng_ranks", "scaler", "state", "tensor_groups", "world_size",
        ]  # fmt: skip
        loss = sum(sums[: update // 2])
        state = meta["state"]
        assert state.pop("history") == [pytest.approx(r, rel=1e-5) for r in rows[: update // 2]]
        assert state == pytest.approx(
            {
                "epoch": update // 2, "position": 0, "updates": update, "applied": update,
                "consecutive_nonfinite": 0, "samples": 3 * update, "tokens": 0, "loss_terms": 3 * update,
                "best_metric": v1["val_loss"], "best_update": 2, "bad_evals": bad, "last_eval_update": update,
                "checkpoint_update": update, "stopped_early": False, "planned_epochs": 2,
                "loss_sum": loss, "loss_at_log": loss, "terms_at_log": 3 * update, "loss_at_eval": loss,
                "terms_at_eval": 3 * update,
            },
            rel=1e-5,
        )  # fmt: skip
        assert meta["best_step"] == "step-000000002" and meta["fingerprint"] == "test" and meta["flops"] == 0.0
        assert (meta["plateau"], meta["position_unit"], meta["rng_ranks"], meta["scaler"]) == (None, "samples", [], {})
        assert (meta["tensor_groups"], meta["world_size"]) == (["model", "optimizer", "rng"], 1)
        assert meta["params"] == t.p.model_dump() and meta["params"]["lr"] == 0.5
        assert sorted(meta["rng"]) == ["numpy", "python"]
        rate = RATES[update - 1]
        group = {
            "dampening": 0, "differentiable": False, "foreach": None, "fused": True, "lr": pytest.approx(rate),
            "lr_scale": 1.0, "maximize": False, "momentum": 0.0, "nesterov": False,
        }  # fmt: skip
        assert meta["optimizer"] == {
            "param_groups": [
                {**group, "name": "decay", "params": [0], "weight_decay": 0.1},
                {**group, "name": "no_decay", "params": [1], "weight_decay": 0.0},
            ],
            "param_names": ["weight", "bias"],
            "scalars": {},
        }
        from safetensors.torch import load_file

        model = load_file(str(ckpt / "model.safetensors"))
        w, b = weights[update - 1]
        assert sorted(model) == ["bias", "weight"]
        assert torch.allclose(model["weight"], w, atol=1e-6) and torch.allclose(model["bias"], b, atol=1e-6)


def test_resume_auto_continues_from_the_last_checkpoint_and_says_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run of 3 epochs after one of 2 continues at update 4 and trains the third epoch with the rates of a
    6-update schedule (planned from the position, not from zero); a 2-epoch rerun has nothing left to do."""
    fit(tmp_path)
    capsys.readouterr()
    t = fit(tmp_path, epochs=2, resume="auto")
    said = f"train: resumed from {tmp_path / 'step-000000004'} at update 4 (epoch 2, sample 0 of its order)\n"
    assert capsys.readouterr() == ("", said)
    assert (t.resumed_from, t.state.updates, t.plan.total) == (4, 4, 4)
    longer = fit(tmp_path, epochs=3, resume="auto", checkpoint_every=1)
    err = capsys.readouterr().err
    assert err == f"train: resumed from {tmp_path / 'step-000000004'} at update 4 (epoch 2, sample 0 of its order)\n"
    assert (longer.resumed_from, longer.state.updates, longer.plan.total, longer.state.epoch) == (4, 6, 6, 3)
    assert [r["update"] for r in longer.state.history] == [2.0, 4.0, 6.0]
    kept = ["best.json", "step-000000002", "step-000000005", "step-000000006"]  # the last 2 periodic ones, the best
    assert sorted(p.name for p in tmp_path.iterdir()) == kept


def test_resume_never_and_another_fingerprint_start_fresh_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fit(tmp_path)
    capsys.readouterr()
    again = fit(tmp_path, resume="never")
    assert capsys.readouterr() == ("", "train: train.resume is never; removed 2 earlier checkpoint(s)\n")
    assert again.resumed_from is None and again.state.updates == 4
    t = make_trainer(tmp_path, linear(), **{**RUN, "resume": "auto"})
    t.fingerprint = "other"
    t.fit(*data())
    assert capsys.readouterr() == (
        "",
        f"train: the 2 checkpoint(s) in {tmp_path} are from other training params, code or data; starting fresh\n",
    )
    assert t.resumed_from is None and t.state.updates == 4
    empty = tmp_path / "empty"
    fit(empty, resume="never")
    fit(tmp_path / "fresh", resume="auto")
    assert capsys.readouterr() == ("", "")  # nothing to remove, nothing to resume: nothing said


def test_resume_from_a_path_written_with_other_params_names_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fit(tmp_path / "a", epochs=1)
    step = tmp_path / "a" / "step-000000002"
    capsys.readouterr()
    t = make_trainer(tmp_path / "b", linear(), **{**RUN, "lr": 0.25, "log_every": 2, "resume": str(tmp_path / "a")})
    t.fingerprint = "other"
    t.fit(*data())
    assert capsys.readouterr().err == (
        f"train: continuing from {step}, written with other params or data (train.epochs, train.lr, train.resume, "
        "train.log_every among them): its weights, optimizer moments and progress continue under the current params\n"
        f"train: resumed from {step} at update 2 (epoch 1, sample 0 of its order)\n"
    )
    assert (t.resumed_from, t.state.updates) == (2, 4)
    same = make_trainer(tmp_path / "c", linear(), **{**RUN, "resume": str(step)})
    same.fit(*data())
    assert capsys.readouterr().err == f"train: resumed from {step} at update 2 (epoch 1, sample 0 of its order)\n"
    # The best so far (update 2) is a checkpoint of the folder resumed from, not of this run's: it is what is
    # exported (it used to say "the best checkpoint c/step-000000002 is gone" and export the last weights).
    from safetensors.torch import load_file

    best = load_file(str(step / "model.safetensors"))["weight"]
    last = load_file(str(tmp_path / "c" / "step-000000004" / "model.safetensors"))["weight"]
    assert same.state.best_update == 2 and same.final_weights is not None and not torch.equal(best, last)
    assert torch.equal(same.final_weights["weight"], best) and torch.equal(same.model.weight.detach(), best)
    assert t.final_weights is not None and torch.equal(t.final_weights["weight"], best)


def test_early_stopping_stops_at_the_first_evaluation_short_of_min_delta_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """3 epochs, patience 1, min_delta 10: the second evaluation cannot beat the first by 10, so the run stops there,
    at update 4 of 6, and names the rule and the best."""
    # linear over 6 updates, warmup round(0.25 * 6) = 2: 0.5 * 1/2, 0.5 * 2/2, then 0.5 - 0.45 * k/4.
    rates = [0.25, 0.5, 0.5, 0.3875, 0.275, 0.1625]
    steps, weights = hand_run(rates, epochs=3)
    v1 = val_metrics(*weights[1])
    t = fit(tmp_path, epochs=3, patience=1, min_delta=10.0)
    assert (t.state.updates, t.state.epoch, t.state.stopped_early, t.state.bad_evals) == (4, 2, True, 1)
    assert (t.state.best_update, t.state.best_metric) == (2, pytest.approx(v1["val_loss"], rel=1e-6))
    assert capsys.readouterr().err == (
        f"train: stopped early at update 4 (epoch 2): val_loss did not improve by more than 10 in 1 evaluations; "
        f"best {v1['val_loss']:.4g} at update 2\n"
    )
    assert [r["lr"] for r in t.state.history] == [pytest.approx(0.5), pytest.approx(0.3875)]
    w, b = weights[1]  # fit() leaves the best weights
    assert torch.allclose(t.model.weight, w, atol=1e-6) and torch.allclose(t.model.bias, b, atol=1e-6)
    # maximising a metric: higher by more than min_delta improves; val_accuracy 0.6 twice is no improvement.
    t = fit(tmp_path / "max", epochs=3, patience=1, monitor="val_accuracy", resume="never")
    assert (t.state.updates, t.state.stopped_early, t.state.best_update, t.state.best_metric) == (4, True, 2, 0.6)
    assert capsys.readouterr().err == (
        "train: stopped early at update 4 (epoch 2): val_accuracy did not improve by more than 0 in 1 evaluations; "
        "best 0.6 at update 2\n"
    )
    # minimising it: an equal value is no improvement either.
    t = fit(tmp_path / "min", epochs=3, patience=1, monitor="val_accuracy", mode="min", resume="never")
    assert (t.state.updates, t.state.stopped_early, t.state.best_update, t.state.bad_evals) == (4, True, 2, 1)
    capsys.readouterr()


class Poisoned(Lin):
    """A linear model whose outputs are inf while `poison` is set: the loss and every gradient are non-finite."""

    poison = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        out = super().forward(x)
        return out * math.inf if self.poison else out


def poisoned() -> Poisoned:
    m = Poisoned(2, 2)
    m.load_state_dict(linear().state_dict())
    return m


@pytest.mark.parametrize("on_device", [False, True], ids=["host", "device"])
def test_a_skipped_update_is_logged_and_holds_the_weights_and_the_schedule(tmp_path: Path, on_device: bool) -> None:
    """Update 2's gradients are non-finite: it is counted as skipped, adds nothing to the train loss, and the next
    update gets the rate update 2 would have had."""
    model = poisoned()

    class Poison(Keep):
        def log(self, metrics: dict[str, float], step: int) -> None:
            super().log(metrics, step)
            if "train_loss" in metrics:
                model.poison = step == 1  # the update after the first log runs poisoned

    t = make_trainer(tmp_path, model, **RUN)
    t.decide_on_device = on_device
    keep = Poison()
    t.logger = keep
    t.fit(*data())
    steps, weights = hand_run(skip=(2,))
    logged = [r for _, r in keep.records if "train_loss" in r]
    assert [r["skipped_updates"] for r in logged] == [0.0, 1.0, 1.0, 1.0]
    assert logged[1]["train_loss"] == 0.0 and math.isnan(logged[1]["grad_norm"])
    assert [r["lr"] for r in logged] == [pytest.approx(x) for x in (0.5, 0.5, 0.5, 0.35)]
    for i in (0, 2, 3):
        assert logged[i]["train_loss"] == pytest.approx(steps[i]["loss"], rel=1e-6)
        assert logged[i]["grad_norm"] == pytest.approx(steps[i]["grad_norm"], rel=1e-6)
    assert (t.state.updates, t.state.applied, t.state.loss_terms, t.state.consecutive_nonfinite) == (4, 3, 10, 0)
    assert [r["train_loss"] for r in t.state.history] == [
        pytest.approx(steps[0]["loss"], rel=1e-6),
        pytest.approx((steps[2]["loss"] * 4 + steps[3]["loss"] * 2) / 6, rel=1e-6),
    ]
    best = 2 if val_metrics(*weights[1])["val_loss"] <= val_metrics(*weights[3])["val_loss"] else 4
    w, b = weights[best - 1]
    assert torch.allclose(t.model.weight, w, atol=1e-6) and torch.allclose(t.model.bias, b, atol=1e-6)


@pytest.mark.parametrize("on_device", [False, True], ids=["host", "device"])
def test_too_many_non_finite_updates_in_a_row_stop_with_what_to_do(tmp_path: Path, on_device: bool) -> None:
    model = poisoned()
    model.poison = True
    t = make_trainer(tmp_path, model, **{**RUN, "max_nonfinite": 2})
    t.decide_on_device = on_device
    from trainflow.engine.trainer import NonFiniteError

    with pytest.raises(NonFiniteError) as caught:
        t.fit(*data())
    assert str(caught.value) == (
        "train: 2 consecutive updates had a non-finite loss or gradient (by update 2, epoch 1); lower train.lr, set "
        "train.max_grad_norm, or use fp32 (train.detect_anomaly: true names the op that produced it). "
        f"The last good checkpoint is kept in {tmp_path}."
    )
    assert (t.state.updates, t.state.applied, t.state.consecutive_nonfinite) == (2, 0, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # never a checkpoint of a diverged run
    # One fewer in a row is tolerated: max_nonfinite 3 sees runs of 2 (updates 1-2) and then trains on.
    model = poisoned()

    class Heal(Keep):
        def log(self, metrics: dict[str, float], step: int) -> None:
            model.poison = step < 2

    model.poison = True
    ok = make_trainer(tmp_path / "ok", model, **{**RUN, "max_nonfinite": 3})
    ok.decide_on_device = on_device
    ok.logger = Heal()
    ok.fit(*data())
    assert (ok.state.updates, ok.state.applied) == (4, 2)


def test_a_signal_stops_after_the_update_with_a_checkpoint_and_a_mark_and_the_rerun_finishes_the_same(
    tmp_path: Path,
) -> None:
    """SIGUSR1 during update 1's log: fit() checkpoints update 1, writes preempted.json and raises Preempted (exit
    code 75) naming the checkpoint; a rerun resumes there, removes the mark, and ends with the uninterrupted weights."""
    import os
    import signal
    import time

    from trainflow.core.errors import Preempted

    class Signal(Keep):
        def log(self, metrics: dict[str, float], step: int) -> None:
            if step == 1:
                os.kill(os.getpid(), signal.SIGUSR1)

    before = signal.getsignal(signal.SIGUSR1)
    t = make_trainer(tmp_path, linear(), **{**RUN, "preempt_signals": ["SIGUSR1"], "resume": "auto"})
    t.preemptible, t.logger = True, Signal()
    start = time.time()
    with pytest.raises(Preempted) as caught:
        t.fit(*data())
    assert signal.getsignal(signal.SIGUSR1) == before  # the handler is put back
    assert str(caught.value) == (
        f"train: SIGUSR1 received: stopped after update 1 of 4 (epoch 0) with a checkpoint in "
        f"{tmp_path / 'step-000000001'}; rerun to resume from it (exit code 75: preempted, resumable)"
    )
    assert caught.value.exit_code == 75
    mark = json.loads((tmp_path / "preempted.json").read_text())
    assert sorted(mark) == ["at", "update", "why"] and start <= mark.pop("at") <= time.time()
    assert mark == {"update": 1, "why": "SIGUSR1 received"}
    meta = json.loads((tmp_path / "step-000000001" / "meta.json").read_text())
    assert (meta["state"]["updates"], meta["state"]["position"], meta["state"]["epoch"]) == (1, 4, 0)
    again = make_trainer(tmp_path, linear(), **{**RUN, "preempt_signals": ["SIGUSR1"], "resume": "auto"})
    again.preemptible = True
    again.fit(*data())
    assert again.resumed_from == 1 and not (tmp_path / "preempted.json").exists()
    _, weights = hand_run()
    w, b = weights[1]  # the best, as in the uninterrupted run
    assert torch.allclose(again.model.weight, w, atol=1e-6) and torch.allclose(again.model.bias, b, atol=1e-6)


def test_the_time_budget_stops_after_the_first_update_past_it(tmp_path: Path) -> None:
    from trainflow.core.errors import Preempted

    t = make_trainer(tmp_path, linear(), **{**RUN, "max_time": 1e-9, "checkpoint_every": 1})
    t.preemptible = True
    with pytest.raises(Preempted) as caught:
        t.fit(*data())
    said = str(caught.value)
    head = "train: train.max_time (1e-09 s) reached after "
    assert said.startswith(head)
    seconds = said[len(head) :].split(" s: ")[0]
    assert float(seconds) >= 0 and seconds == f"{float(seconds):.1f}"
    assert said == (
        f"{head}{seconds} s: stopped after update 1 of 4 (epoch 0) with a checkpoint in "
        f"{tmp_path / 'step-000000001'}; rerun to resume from it (exit code 75: preempted, resumable)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["preempted.json", "step-000000001"]
    # Not preemptible (a sweep's trial): the same params train to the end.
    whole = make_trainer(tmp_path / "whole", linear(), **{**RUN, "max_time": 1e-9})
    whole.fit(*data())
    assert whole.state.updates == 4 and not (tmp_path / "whole" / "preempted.json").exists()


def test_plain_progress_prints_a_line_each_tenth_of_the_way_and_at_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import io
    import types

    from trainflow.core import progress as progress_module
    from trainflow.core.progress import PlainProgress, progress

    now = [0.0]
    monkeypatch.setattr(progress_module, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    out = io.StringIO()
    bar = PlainProgress(25, desc="train", unit="upd", stream=out)
    for n in range(1, 26):
        now[0] = n * 0.5  # 2 updates a second
        bar.update(1)
        if n == 4:
            bar.set_postfix({"loss": "0.5000"}, lr="1.00e-03", refresh=False)
    bar.close()
    lines = [f"train: {n}/25 upd ({100 * n / 25:.0f}%), 2 upd/s" for n in (3, 6, 9, 12, 15, 18, 21, 24, 25)]
    lines = lines[:1] + [line + ", loss=0.5000, lr=1.00e-03" for line in lines[1:]]
    assert out.getvalue() == "".join(f"{line}\n" for line in lines)
    bar.close()
    assert out.getvalue().count("\n") == 9  # the end was said: close says nothing more
    # Resumed at 4 of 10: a line per update (a tenth is 1), its rate from where it resumed.
    out = io.StringIO()
    now[0] = 0.0
    bar = PlainProgress(10, desc="d", unit="it", initial=4, stream=out)
    bar.close()
    assert out.getvalue() == ""  # nothing done since the start: nothing to say
    now[0] = 4.0
    bar.update(2)
    bar.close()
    assert out.getvalue() == "d: 6/10 it (60%), 0.5 it/s\n"
    # An unknown total (0): no percentages, no lines on the way, one at the end.
    out = io.StringIO()
    bar = PlainProgress(0, desc="d", unit="it", stream=out)
    bar.update(3)
    assert out.getvalue() == ""
    bar.close()
    assert out.getvalue() == "d: 3/0 it\n"  # no time passed: no rate
    # progress(): plain lines on a stderr that is not a terminal; silent when disabled.
    buf = io.StringIO()
    monkeypatch.setattr("sys.stderr", buf)
    now[0] = 0.0
    on = progress(2, desc="x", unit="u")
    assert isinstance(on, PlainProgress) and (on.total, on.desc, on.unit, on.n) == (2, "x", "u", 0)
    on.update(1)
    off = progress(2, desc="x", unit="u", initial=1, enabled=False)
    off.update(1)
    off.close()
    assert buf.getvalue() == "x: 1/2 u (50%)\n" and off.n == 2


def test_progress_is_a_tqdm_bar_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from tqdm.auto import tqdm

    from trainflow.core.progress import PlainProgress, progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stderr", Terminal())
    bar = progress(7, desc="train", unit="upd", initial=2)
    assert isinstance(bar, tqdm) and (bar.total, bar.n, bar.desc, bar.unit) == (7, 2, "train", "upd")
    assert callable(bar.dynamic_ncols)  # its width follows the terminal's (tqdm keeps a measuring function)
    bar.close()
    assert isinstance(progress(7, desc="train", unit="upd", enabled=False), PlainProgress)
    monkeypatch.setattr("sys.stderr", object())  # no isatty at all: not a terminal
    assert isinstance(progress(7, desc="train", unit="upd"), PlainProgress)


def test_a_group_with_its_own_rate_learns_at_it_and_logs_it(tmp_path: Path) -> None:
    """param_groups: bias at half the rate. Each log adds lr/<group> for every group, after lr."""
    steps, weights = hand_run(bias_scale=0.5)
    t = make_trainer(tmp_path, linear(), **{**RUN, "param_groups": [{"match": "bias", "lr_scale": 0.5}]})
    keep = Keep()
    t.logger = keep
    t.fit(*data())
    logged = [r for _, r in keep.records if "train_loss" in r]
    for r, ref in zip(logged, steps, strict=True):
        assert list(r) == [
            "train_loss", "lr", "lr/decay", "lr/rule0.no_decay", "grad_norm", "skipped_updates", "samples_per_s"
        ]  # fmt: skip
        assert (r["lr"], r["lr/decay"], r["lr/rule0.no_decay"]) == pytest.approx((ref["lr"], ref["lr"], ref["lr"] / 2))
        assert r["train_loss"] == pytest.approx(ref["loss"], rel=1e-6)
    from safetensors.torch import load_file

    last = load_file(str(tmp_path / "step-000000004" / "model.safetensors"))
    w, b = weights[3]
    assert torch.allclose(last["weight"], w, atol=1e-6) and torch.allclose(last["bias"], b, atol=1e-6)
    meta = json.loads((tmp_path / "step-000000004" / "meta.json").read_text())
    groups = meta["optimizer"]["param_groups"]
    assert [(g["name"], g["lr_scale"], g["weight_decay"], g["params"]) for g in groups] == [
        ("decay", 1.0, 0.1, [0]), ("rule0.no_decay", 0.5, 0.0, [1])
    ]  # fmt: skip
    assert [g["lr"] for g in groups] == pytest.approx([0.2, 0.1])


def test_plateau_halves_the_rate_after_a_bad_evaluation_and_a_resume_keeps_its_scale(tmp_path: Path) -> None:
    """plateau, patience 1, factor 0.5, floor min_lr / lr = 0.1: every evaluation after the first is bad (min_delta
    10), so the rate halves after each; the scale travels in meta.json and a resumed run continues from it."""
    kw = {"schedule": "plateau", "warmup_fraction": 0.0, "plateau_patience": 1, "min_delta": 10.0}
    t = fit(tmp_path, epochs=3, **kw)
    assert [r["lr"] for r in t.state.history] == [0.5, 0.5, 0.25]
    _, weights = hand_run([0.5, 0.5, 0.5, 0.5, 0.25, 0.25], epochs=3)
    from safetensors.torch import load_file

    last = load_file(str(tmp_path / "step-000000006" / "model.safetensors"))
    assert torch.allclose(last["weight"], weights[5][0], atol=1e-6)
    plateau = {"factor": 0.5, "patience": 1, "floor_scale": pytest.approx(0.1), "bad_evals": 0}
    for step, scale in ((2, 1.0), (4, 0.5), (6, 0.25)):
        meta = json.loads((tmp_path / f"step-{step:09d}" / "meta.json").read_text())
        assert meta["plateau"] == {**plateau, "scale": scale}
    more = fit(tmp_path, epochs=5, resume="auto", **kw)
    assert more.resumed_from == 6
    assert [r["lr"] for r in more.state.history] == [0.5, 0.5, 0.25, 0.125, 0.0625]
    assert more.plateau is not None and more.plateau.scale == pytest.approx(0.1)  # 0.0625 / 2 is below the floor


def test_limit_batches_max_steps_and_overfit_batches_plan_the_run(tmp_path: Path) -> None:
    """limit_batches 1: one window (4 samples) an epoch, 2 updates in all; max_steps 3: the run ends after update 3
    with a final evaluation at 2/3 of epoch 2; overfit_batches 1: train and validate on the first window's samples."""
    short = fit(tmp_path / "limit", limit_batches=1)
    assert (short.plan.window, short.plan.per_epoch, short.plan.total, short.plan.epoch_samples) == (4, 1, 2, 4)
    assert [(r["update"], r["epoch"]) for r in short.state.history] == [(1.0, 1.0), (2.0, 2.0)]
    assert (short.state.samples, short.state.epoch) == (8, 2)
    # Evaluation too stops after limit_batches batches: here the first 2 val samples.
    w, b = short.model.weight.detach(), short.model.bias.detach()
    logits = VX[:2] @ w.T + b
    got = short.evaluate(TensorData(VX, VY), batch_size=2)
    assert got["val_loss"] == pytest.approx(float(F.cross_entropy(logits, VY[:2])), rel=1e-5)
    assert got["val_accuracy"] == float((logits.argmax(-1) == VY[:2]).double().mean())

    capped = fit(tmp_path / "steps", max_steps=3, log_every=2)
    assert (capped.plan.total, capped.state.updates, capped.state.epoch, capped.state.position) == (3, 3, 1, 4)
    assert [(r["update"], r["epoch"]) for r in capped.state.history] == [(2.0, 1.0), (3.0, pytest.approx(5 / 3))]
    assert sorted(p.name for p in (tmp_path / "steps").iterdir()) == ["best.json", "step-000000002", "step-000000003"]

    over = fit(tmp_path / "over", overfit_batches=1, epochs=3)
    assert (over.plan.per_epoch, over.plan.total, over.state.samples) == (1, 3, 12)
    keep = epoch_order(6, 7, 0)[:4]
    w, b = over.model.weight.detach(), over.model.bias.detach()
    best = next(r for r in over.state.history if r["update"] == over.state.best_update)
    assert best["val_loss"] == pytest.approx(float(F.cross_entropy(X[keep] @ w.T + b, Y[keep])), rel=1e-5)


def test_a_resume_past_the_end_of_a_shorter_epoch_starts_the_next_one_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fit(tmp_path, max_steps=1, checkpoint_every=1)  # stopped at sample 4 of epoch 0
    capsys.readouterr()
    t = fit(tmp_path, limit_batches=1, resume="auto")  # an epoch is now 4 samples: epoch 0 is over
    assert capsys.readouterr().err == (
        f"train: resumed from {tmp_path / 'step-000000001'} at update 1 (epoch 0, sample 4 of its order)\n"
        "train: resumed at sample 4 of epoch 0, past the 4 samples an epoch now takes in windows of 4 "
        "(train.limit_batches, train.overfit_batches); the next epoch starts\n"
    )
    assert (t.plan.total, t.state.updates, t.state.epoch, t.state.position) == (2, 2, 2, 0)
    assert [r["update"] for r in t.state.history] == [1.0, 2.0]


def test_a_checkpoint_of_another_optimizer_or_model_is_refused_with_what_to_do(tmp_path: Path) -> None:
    from trainflow.engine.checkpoint import CheckpointError

    fit(tmp_path / "a", epochs=1)
    step = tmp_path / "a" / "step-000000002"
    adam = make_trainer(tmp_path / "b", linear(), **{**RUN, "optimizer": "adamw", "resume": str(step)})
    with pytest.raises(CheckpointError) as caught:
        adam.fit(*data())
    assert str(caught.value) == (
        f"checkpoint {step} holds the state of sgd, but train.optimizer is adamw: one optimizer's moments cannot "
        "continue another's; set train.optimizer: sgd to continue it, or start fresh with train.resume: never"
    )
    wider = make_trainer(tmp_path / "c", Lin(2, 3), **{**RUN, "resume": str(step)})
    with pytest.raises(CheckpointError) as caught:
        wider.fit(*data())
    said = str(caught.value)
    assert said.startswith(f"checkpoint {step} does not fit this model and trainer (RuntimeError: ")
    assert said.endswith(
        f"); delete it (`rm -r {step}`: training resumes from the checkpoint before it, if there is one) or start "
        "fresh with train.resume: never"
    )
    missing = make_trainer(tmp_path / "d", linear(), **{**RUN, "resume": str(tmp_path / "nowhere")})
    with pytest.raises(UserError) as caught:
        missing.fit(*data())
    assert str(caught.value) == (
        f"params.yaml: 1 invalid parameter:\n  train.resume: checkpoint directory {tmp_path / 'nowhere'} does not "
        "exist\nFix params.yaml or the -S override, then rerun (`trainflow params schema` lists every field)."
    )


def test_a_final_evaluation_that_finds_the_last_checkpoint_best_rewrites_its_meta_to_say_so(tmp_path: Path) -> None:
    """max_steps 3 with a checkpoint every update: step 3 is written before the final evaluation; that evaluation
    finds it best (mode max of val_loss: it rose), so its meta.json takes the state after the evaluation and
    names itself best, best.json names it, and fit() leaves its weights."""
    steps, weights = hand_run([0.5, 0.5, 0.275, 0.05])  # 3 updates planned: warmup 1, then 0.5 - 0.45 * k/2
    v1, v3 = val_metrics(*weights[1]), val_metrics(*weights[2])
    assert v3["val_loss"] > v1["val_loss"]
    t = fit(tmp_path, max_steps=3, checkpoint_every=1, mode="max")
    assert (t.state.best_update, t.state.best_metric) == (3, pytest.approx(v3["val_loss"], rel=1e-6))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.json", "step-000000002", "step-000000003"]
    assert json.loads((tmp_path / "best.json").read_text()) == {"step": "step-000000003"}
    meta = json.loads((tmp_path / "step-000000003" / "meta.json").read_text())
    assert (meta["best_step"], meta["plateau"], meta["fingerprint"]) == ("step-000000003", None, "test")
    state = meta["state"]
    assert [r["update"] for r in state.pop("history")] == [2.0, 3.0]
    loss = steps[0]["loss"] * 4 + steps[1]["loss"] * 2 + steps[2]["loss"] * 4
    assert state == pytest.approx(
        {
            "epoch": 1, "position": 4, "updates": 3, "applied": 3, "consecutive_nonfinite": 0, "samples": 10,
            "tokens": 0, "loss_terms": 10, "best_metric": v3["val_loss"], "best_update": 3, "bad_evals": 0,
            "last_eval_update": 3, "checkpoint_update": 3, "stopped_early": False, "planned_epochs": 2,
            "loss_sum": loss,
            "loss_at_log": loss, "terms_at_log": 10, "loss_at_eval": loss, "terms_at_eval": 10,
        },
        rel=1e-5,
    )  # fmt: skip
    w, b = weights[2]
    assert torch.allclose(t.model.weight, w, atol=1e-6) and torch.allclose(t.model.bias, b, atol=1e-6)
    assert t.final_weights is not None and torch.equal(t.final_weights["bias"], t.model.bias.detach())


def test_progress_lines_in_a_log_show_the_count_and_the_last_logged_loss_and_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """train.progress on a stderr that is not a terminal: one line a tenth of the way (here each of the 4 updates),
    with the loss and rate of the last log (written after the count moved, so a line shows the update before)."""
    steps, _ = hand_run()
    fit(tmp_path, progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 4
    for n, line in enumerate(lines, start=1):
        parts = line.split(", ")
        assert parts[0] == f"train: {n}/4 upd ({25 * n}%)" and parts[1].endswith(" upd/s")
        float(parts[1].removesuffix(" upd/s"))
        shown = [] if n == 1 else [f"loss={steps[n - 2]['loss']:.4f}", f"lr={RATES[n - 2]:.2e}"]
        assert parts[2:] == shown


def test_fsdp_refuses_the_weight_average_and_sgd_naming_the_fix(tmp_path: Path) -> None:
    from trainflow.engine.distributed import Group

    tail = "\nFix params.yaml or the -S override, then rerun (`trainflow params schema` lists every field)."
    with pytest.raises(UserError) as caught:
        fsdp = Group(world_size=2, strategy="fsdp")
        make_trainer(tmp_path, linear(), group=fsdp, **{**RUN, "optimizer": "adamw", "ema_decay": 0.9})
    assert str(caught.value) == (
        "params.yaml: 1 invalid parameter:\n  train.ema_decay: the weight average is not sharded; use strategy ddp "
        f"with it{tail}"
    )
    with pytest.raises(UserError) as caught:
        make_trainer(tmp_path, linear(), group=Group(world_size=2, strategy="fsdp"), **RUN)
    assert str(caught.value) == (
        "params.yaml: 1 invalid parameter:\n  train.strategy: fsdp trains with adamw in fp32 or bf16; for fp16 (a "
        "GradScaler over shards) or sgd (torch has no sharded fused SGD with a tensor learning rate) use strategy "
        f"ddp{tail}"
    )
