"""The engine against plain PyTorch (fp32, CPU): accumulation, skipped updates, schedules, evaluation, retention."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_kit import make_trainer, mlp, reference, rel, table, text_data, text_model
from torch import nn
from torch.nn import functional as F

from trainflow.core.errors import UserError
from trainflow.engine import flops
from trainflow.engine.checkpoint import CheckpointError, CheckpointStore, load_checkpoint, save_checkpoint
from trainflow.engine.loaders import IGNORE_INDEX, Batch, TensorData, TextData
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
