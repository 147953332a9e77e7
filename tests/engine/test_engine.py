"""The engine against plain PyTorch (fp32, CPU): accumulation, skipped updates, schedules, evaluation, retention."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from trainflow.engine.checkpoint import CheckpointError, CheckpointStore, load_checkpoint, save_checkpoint
from trainflow.engine.data import IGNORE_INDEX, Batch, TensorData, TextData, epoch_order
from trainflow.engine.objective import Objective
from trainflow.engine.precision import Precision
from trainflow.engine.schedule import Plateau, lr_at
from trainflow.engine.trainer import NonFiniteError, Trainer
from trainflow.errors import UserError
from trainflow.models import MLP, build_model
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


def make_trainer(tmp: Path, model: nn.Module, task: str = "classification", **kw: Any) -> Trainer:
    p = TrainParams.model_validate({**BASE, **kw})
    return Trainer(
        model,
        p,
        seed=7,
        device=torch.device("cpu"),
        precision=Precision("fp32", "cpu"),
        objective=Objective(task),  # type: ignore[arg-type]
        checkpoint_dir=tmp,
        fingerprint="test",
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
            idx = order[start : start + window]
            attempted += 1
            if attempted in skip:
                continue  # the engine sees non-finite gradients here: no update, no schedule step
            opt.zero_grad()
            window_loss(model, idx).backward()
            if p.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), p.max_grad_norm)
            for g in opt.param_groups:
                g["lr"] = lr_at(p.schedule, applied, total, warmup, p.lr, p.min_lr)
            opt.step()
            applied += 1
    return model


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


class InfGrads(nn.Module):
    """An MLP whose gradients become inf on chosen attempts (its hook counts backward passes per update)."""

    def __init__(self, bad: set[int], accumulate: int) -> None:
        super().__init__()
        self.net = mlp()
        self.bad, self.accumulate, self.calls = bad, accumulate, 0

        def hook(grad: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            attempt = (self.calls - 1) // self.accumulate + 1
            return grad * math.inf if attempt in self.bad else grad

        self.net.net[0].weight.register_hook(hook)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


def test_skipped_updates_leave_weights_and_schedule_alone(tmp_path: Path) -> None:
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


def test_device_and_host_decisions_are_bit_identical(tmp_path: Path) -> None:
    data = table(n=192)
    runs = []
    for on_device in (True, False):
        model = InfGrads({3, 4, 9}, accumulate=2)
        t = make_trainer(tmp_path / str(on_device), model, batch_size=16, accumulate=2, epochs=4, log_every=3)
        t.decide_on_device = on_device
        t.fit(data, data)
        runs.append((model.net.state_dict(), t.state.history, t.state.applied))
    (w1, h1, a1), (w2, h2, a2) = runs
    assert a1 == a2 == 21 and h1 == h2
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


def test_too_many_non_finite_updates_stop_with_the_last_good_checkpoint_kept(tmp_path: Path) -> None:
    data = table(n=192)
    model = InfGrads(set(range(9, 100)), accumulate=1)
    t = make_trainer(tmp_path, model, batch_size=32, max_nonfinite=3, checkpoint_every=4, log_every=1)
    with pytest.raises(NonFiniteError, match="3 consecutive updates had a non-finite") as err:
        t.fit(data, data)
    assert str(tmp_path) in str(err.value)
    store = CheckpointStore(tmp_path, keep_last=5)
    latest = store.latest()
    assert latest is not None and latest.name == "step-000000008"
    weights = load_checkpoint(latest).tensors["model"]
    assert all(torch.equal(weights[k], v) for k, v in model.net.state_dict().items() if k in weights) or all(
        torch.equal(weights[f"net.{k}"], v) for k, v in model.net.state_dict().items()
    )


def test_the_hot_loop_never_reads_the_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = table()
    t = make_trainer(tmp_path, mlp(), batch_size=8, accumulate=4)
    t.decide_on_device = True  # what runs on a GPU (on CPU the trainer may read values: there is no device)
    t.prepare(data)
    micro = [data.batch(i) for i in torch.arange(32).split(8)]

    def forbidden(*_: Any, **__: Any) -> Any:
        raise AssertionError("host-device sync in train_step")

    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    for _ in range(3):
        t.train_step(micro)
    monkeypatch.undo()
    assert int(t.applied) == 3  # they were applied, on the device


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
    data = table(n=203)
    t = make_trainer(
        tmp_path, mlp(), batch_size=8, epochs=5, eval_every=10, checkpoint_every=3, keep_last=2, patience=3,
        min_delta=0.02,
    )  # fmt: skip
    t.fit(data, data)
    updates = [int(r["update"]) for r in t.state.history]
    assert updates == list(range(10, 10 * len(updates) + 1, 10))
    if t.state.stopped_early:
        assert t.state.bad_evals == 3 and updates[-1] - t.state.best_update == 30
    store = CheckpointStore(tmp_path, 2)
    steps = [p.name for p in store.steps()]
    best = store.best()
    assert best is not None and best.name == f"step-{t.state.best_update:09d}"
    assert best.name in steps  # retention never deletes the best ...
    assert steps[-1] == f"step-{t.state.updates:09d}"  # ... or the last
    assert len(set(steps) - {best.name}) == 2  # and keeps k periodic ones
    exported = load_checkpoint(best).tensors["model"]
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
    t = make_trainer(
        tmp_path / "c", MLP(6, 3, [64], 0.0), batch_size=16, epochs=150, overfit_batches=1, lr=1e-2,
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


def test_regression_objective(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 6, generator=g)
    data = TensorData(x, x @ torch.arange(1.0, 7.0) + 0.1 * torch.randn(256, generator=g))
    torch.manual_seed(0)
    t = make_trainer(tmp_path, MLP(6, 1, [32], 0.0), task="regression", batch_size=32, epochs=60, lr=1e-2,
                     monitor="val_r2")  # fmt: skip
    t.fit(data, data)
    assert t.p.minimize is False and t.state.best_metric is not None and t.state.best_metric > 0.95
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
    assert b.tokens == int(b.inputs["mask"].sum())


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


def test_throughput_and_mfu_are_logged(tmp_path: Path) -> None:
    records: list[dict[str, float]] = []

    class Keep:
        def log(self, metrics: dict[str, float], step: int) -> None:
            records.append(metrics)

        def close(self) -> None:
            pass

    data = text_data(per_token=False)
    t = make_trainer(tmp_path, text_model("sequence"), batch_size=8, log_every=2)
    t.logger, t.peak_flops = Keep(), 1e12  # a pretend peak: MFU is only reported where the peak is known
    t.fit(data, data)
    train = [r for r in records if "samples_per_s" in r]
    assert len(train) == math.ceil(t.state.updates / 2)
    assert all(r["samples_per_s"] > 0 and r["tokens_per_s"] > r["samples_per_s"] and 0 < r["mfu"] < 1 for r in train)
    model = text_model("sequence")
    b = data.batch(torch.arange(8))
    width = b.inputs["tokens"].shape[1]
    assert t.flops_per_batch is not None and t.flops_per_batch(b) == model.flops_per_token(width) * width * 8
