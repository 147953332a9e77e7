"""Optimizer groups (train.layer_decay, train.param_groups), label smoothing, class weights and the weight EMA, each
against an independent computation: numpy or sklearn for the losses, a plain PyTorch loop with hand-made groups, a
float64 EMA of the recorded weights."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from engine_kit import InfGrads, make_trainer, mlp, table, text_data
from support.stages import training
from torch.nn import functional as F

from trainflow.core.errors import ParamsError
from trainflow.engine.loaders import IGNORE_INDEX
from trainflow.engine.objective import Objective
from trainflow.engine.optim import plan_groups
from trainflow.engine.schedule import lr_at
from trainflow.models.text import TextTransformer
from trainflow.params import TrainParams
from trainflow.stages.train import class_weights


class Recorder:
    def __init__(self) -> None:
        self.points: list[tuple[int, dict[str, float]]] = []

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.points.append((step, dict(metrics)))

    def close(self) -> None:
        pass


def layered_model() -> TextTransformer:
    torch.manual_seed(2)
    return TextTransformer(
        vocab_size=30, out_features=4, d_model=16, n_heads=2, n_layers=3, dropout=0.0, head="sequence"
    )


def test_layer_decay_gives_each_layer_its_rate_and_logs_them_exactly(tmp_path: Path) -> None:
    lr, decay, layers = 3e-3, 0.8, 3
    logger = Recorder()
    t = make_trainer(tmp_path, layered_model(), layer_decay=decay, lr=lr, schedule="constant", warmup_fraction=0.0,
                     log_every=1, epochs=1, batch_size=8)  # fmt: skip
    t.logger = logger
    data = text_data(per_token=False)
    t.fit(data, data)
    # Which group each parameter landed in: the embeddings layer 0, block i layer i + 1, the rest (norm, head) L + 1.
    group_of = {id(q): g["name"] for g in t.optimizer.param_groups for q in g["params"]}
    for name, q in t.model.named_parameters():
        layer = 0 if "emb" in name else int(name.split(".")[1]) + 1 if name.startswith("blocks.") else layers + 1
        assert group_of[id(q)] == f"layer{layer}.{'decay' if q.ndim >= 2 else 'no_decay'}", name
    # Logged at an update: each group's rate, the float32 of lr * decay**(L + 1 - l), bit for bit.
    step, record = logger.points[0]
    rates = {k.removeprefix("lr/"): v for k, v in record.items() if k.startswith("lr/")}
    assert len(rates) == 1 + 2 * layers + 2  # layer 0: the embeddings (matrices only); blocks and top: both kinds
    for name, rate in rates.items():
        layer = int(name.split(".")[0].removeprefix("layer"))
        expected = torch.tensor(lr, dtype=torch.float32) * torch.tensor(decay ** (layers + 1 - layer))
        assert rate == expected.item(), name
    assert record["lr"] == torch.tensor(lr, dtype=torch.float32).item()


def test_param_groups_train_like_a_plain_loop_with_those_groups(tmp_path: Path) -> None:
    """One schedule, a fixed scale per group: the engine equals torch's AdamW with hand-made groups whose rates are
    set to lr_at(...) * scale before each step."""
    rules = [{"match": "net.0.*", "lr_scale": 0.25, "weight_decay": 0.0}, {"match": "net.3.weight", "lr_scale": 3.0}]
    settings: dict[str, Any] = {"param_groups": rules, "epochs": 2, "batch_size": 16, "lr": 0.01, "schedule": "cosine"}
    t = make_trainer(tmp_path, mlp(), **settings)
    data = table(n=96)
    t.fit(data, data)

    p = TrainParams.model_validate({**t.p.model_dump()})
    model = mlp()
    first, last = model.net[0], model.net[3]
    groups = [
        {"params": [first.weight, first.bias], "weight_decay": 0.0, "scale": 0.25},
        {"params": [last.weight], "weight_decay": p.weight_decay, "scale": 3.0},
        {"params": [last.bias], "weight_decay": 0.0, "scale": 1.0},
    ]
    opt = torch.optim.AdamW([{k: v for k, v in g.items() if k != "scale"} for g in groups], lr=p.lr)
    per_epoch = math.ceil(96 / 16)
    total, warmup = per_epoch * 2, round(p.warmup_fraction * per_epoch * 2)
    step = 0
    from trainflow.engine.loaders import epoch_order

    for epoch in range(2):
        order = epoch_order(96, 7, epoch)
        for start in range(0, 96, 16):
            idx = order[start : start + 16]
            opt.zero_grad()
            F.cross_entropy(model(data.x[idx]), data.y[idx]).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), p.max_grad_norm)
            for g, spec in zip(opt.param_groups, groups, strict=True):
                g["lr"] = lr_at(p.schedule, step, total, warmup, p.lr, p.min_lr) * spec["scale"]
            opt.step()
            step += 1
    ours = torch.cat([q.detach().flatten() for q in t.model.parameters()])
    ref = torch.cat([q.detach().flatten() for q in model.parameters()])
    assert float((ours - ref).norm() / ref.norm()) <= 1e-5
    same_rate = make_trainer(tmp_path / "plain", mlp(), **{**settings, "param_groups": []})
    same_rate.fit(data, data)
    plain = torch.cat([q.detach().flatten() for q in same_rate.model.parameters()])
    assert float((plain - ref).norm() / ref.norm()) > 1e-3  # the groups did change the training


def test_group_rules_that_cannot_apply_are_errors_naming_the_field() -> None:
    p = TrainParams.model_validate({"param_groups": [{"match": "encoder.*"}]})
    with pytest.raises(ParamsError) as err:
        plan_groups(mlp(), p)
    assert "train.param_groups[0].match" in str(err.value) and "net.0.weight" in str(err.value)
    with pytest.raises(ParamsError, match="train.layer_decay"):
        plan_groups(mlp(), TrainParams(layer_decay=0.8))


def test_balanced_class_weights_are_sklearns() -> None:
    from sklearn.utils.class_weight import compute_class_weight

    labels = np.array([0] * 95 + [1] * 5 + [2] * 20)
    expected = compute_class_weight("balanced", classes=np.arange(3), y=labels)
    assert np.allclose(class_weights(labels, 3), expected, rtol=0, atol=1e-12)
    assert class_weights(np.array([0, 0, 2]), 3)[1] == 1.0  # a class absent from train weighs 1


def test_smoothed_weighted_training_loss_matches_its_formula() -> None:
    g = torch.Generator().manual_seed(0)
    logits, target = torch.randn(9, 4, generator=g), torch.randint(0, 4, (9,), generator=g)
    w, eps = torch.tensor([0.5, 2.0, 1.0, 3.0]), 0.1
    logp = torch.log_softmax(logits.double(), -1).numpy()
    y, wn = target.numpy(), w.double().numpy()
    # torch's definition: (1 - eps) * w[y] * -log p_y + eps / C * sum_c w[c] * -log p_c, summed over samples
    expected = sum((1 - eps) * wn[y[i]] * -logp[i, y[i]] + eps / 4 * float((wn * -logp[i]).sum()) for i in range(9))
    got = Objective("classification", label_smoothing=eps, class_weights=w).train_loss_sum(logits, target)
    assert got.item() == pytest.approx(expected, rel=1e-6)
    plain = sum(-logp[i, y[i]] for i in range(9))
    objective = Objective("classification", label_smoothing=eps, class_weights=w)
    assert objective.eval_sums(logits, target, 9)[0].item() == pytest.approx(plain, rel=1e-6)  # val: plain CE


def smoothed_by_hand(logits: torch.Tensor, target: torch.Tensor, eps: float) -> float:
    """Label-smoothed cross-entropy summed over the labelled rows, in numpy: (1 - eps) * -log p_y + eps / C * sum_c
    -log p_c (the smoothed target puts 1 - eps + eps / C on y and eps / C on every other class)."""
    logp = torch.log_softmax(logits.double(), -1).reshape(-1, logits.shape[-1]).numpy()
    y, classes = target.reshape(-1).numpy(), logits.shape[-1]
    rows = [i for i in range(len(y)) if y[i] != IGNORE_INDEX]
    return sum((1 - eps) * -logp[i, y[i]] + eps / classes * float(-logp[i].sum()) for i in rows)


def test_label_smoothing_alone_matches_its_formula_per_sample_and_per_token() -> None:
    """Without class weights (the earlier test only ever smoothed together with them): per sample, and per token
    with unlabelled tokens, which carry no loss. Validation stays the plain cross-entropy."""
    g = torch.Generator().manual_seed(1)
    logits, target = torch.randn(9, 4, generator=g), torch.randint(0, 4, (9,), generator=g)
    smoothed = Objective("classification", label_smoothing=0.2)
    assert smoothed.train_loss_sum(logits, target).item() == pytest.approx(smoothed_by_hand(logits, target, 0.2))
    plain = smoothed_by_hand(logits, target, 0.0)
    assert smoothed_by_hand(logits, target, 0.2) != pytest.approx(plain)  # the premise: smoothing changes the loss
    assert smoothed.eval_sums(logits, target, 9)[0].item() == pytest.approx(plain, rel=1e-6)
    tokens, labels = torch.randn(3, 5, 4, generator=g), torch.randint(0, 4, (3, 5), generator=g)
    labels[0, 3:] = labels[2, 1] = IGNORE_INDEX
    got = smoothed.train_loss_sum(tokens, labels).item()
    assert got == pytest.approx(smoothed_by_hand(tokens, labels, 0.2), rel=1e-6)


def test_the_train_stage_hands_label_smoothing_to_the_objective(tmp_path: Path) -> None:
    """train.label_smoothing in params.yaml reaches the loss the trainer minimises (the train stage builds it)."""
    from support.projects import make_project

    from trainflow.core.paths import Paths
    from trainflow.engine.distributed import Group
    from trainflow.params import load_params
    from trainflow.stages import run_stage
    from trainflow.stages.train import setup

    root = make_project(tmp_path / "p", {"data.source": "builtin:iris", "train.label_smoothing": 0.2,
                                         "train.progress": "false"})  # fmt: skip
    paths = Paths(root)
    for stage in ("ingest", "split"):
        run_stage(stage, load_params(paths.params), paths)
    built = setup(training(load_params(paths.params)), paths, torch.device("cpu"), Group(), tmp_path / "ckpt")
    batch = built.train.batch(torch.arange(16))
    logits = built.trainer.model(**batch.inputs).detach()
    got = built.trainer.objective.train_loss_sum(logits, batch.target).item()
    assert got == pytest.approx(smoothed_by_hand(logits, batch.target, 0.2), rel=1e-6)
    assert built.trainer.objective.class_weights is None


@pytest.mark.parametrize("on_device", [False, True])
def test_ema_averages_the_weights_of_applied_updates_only(tmp_path: Path, on_device: bool) -> None:
    decay, bad = 0.7, {3}
    t = make_trainer(tmp_path, InfGrads(bad, accumulate=1), ema_decay=decay, epochs=1, batch_size=16)
    t.decide_on_device = on_device
    t.prepare(table(n=96))
    data = table(n=96)
    history = [{n: q.detach().double().clone() for n, q in t.model.named_parameters()}]
    for start in range(0, 96, 16):
        t.train_step([data.batch(torch.arange(start, start + 16))])
        history.append({n: q.detach().double().clone() for n, q in t.model.named_parameters()})
    ema = dict(history[0])
    for attempt, weights in enumerate(history[1:], start=1):
        if attempt in bad:
            assert all(torch.equal(weights[n], history[attempt - 1][n]) for n in weights)  # it was skipped
            continue
        ema = {n: decay * ema[n] + (1 - decay) * weights[n] for n in ema}
    assert t.ema is not None
    for name, average in zip(t.ema.names, t.ema.shadow, strict=True):
        torch.testing.assert_close(average.double(), ema[name], rtol=0, atol=1e-6)
    # Had the skipped update counted, the average would differ: the test can tell.
    with_skip = dict(history[0])
    for weights in history[1:]:
        with_skip = {n: decay * with_skip[n] + (1 - decay) * weights[n] for n in with_skip}
    assert max(float((with_skip[n] - ema[n]).abs().max()) for n in ema) > 1e-4


def test_ema_weights_are_validated_and_exported(tmp_path: Path) -> None:
    from trainflow.engine.checkpoint import load_checkpoint

    t = make_trainer(tmp_path, mlp(), ema_decay=0.9, epochs=3, batch_size=16, lr=0.05, patience=1000)
    data = table(n=96)
    t.fit(data, data)
    assert t.ema is not None and t.final_weights is not None
    # Exported: the best checkpoint's averaged parameters (its buffers: the model's own).
    best = load_checkpoint(t.store.path(t.state.best_update)).tensors
    for name, value in best["ema"].items():
        assert torch.equal(t.final_weights[name], value), name
    # Validated: the val_loss logged at the last evaluation is that of the averaged weights, not of the raw ones.
    last = load_checkpoint(t.store.path(t.state.updates)).tensors
    logged = t.state.history[-1]["val_loss"]
    scores = {}
    for kind in ("ema", "model"):
        t.model.load_state_dict({**last["model"], **last[kind]})
        scores[kind] = t.evaluate(data)["val_loss"]
    assert scores["ema"] == pytest.approx(logged, rel=1e-6)
    assert scores["model"] != pytest.approx(logged, rel=1e-4)


def test_layer_decay_on_a_model_without_numbered_layers_names_params_yaml_and_the_fix() -> None:
    from torch import nn

    from trainflow.core.errors import ParamsError
    from trainflow.engine.optim import plan_groups
    from trainflow.params import TrainParams

    with pytest.raises(ParamsError) as exc:
        plan_groups(nn.Linear(2, 1), TrainParams(layer_decay=0.8))
    assert str(exc.value) == (
        "params.yaml: 1 invalid parameter:\n"
        "  train.layer_decay: Linear has no numbered layers to decay (text_transformer and hf: models have); set it "
        "to null, or give layers their own rates with train.param_groups\n"
        "Fix params.yaml or the -S override, then rerun (`trainflow params schema` lists every field)."
    )
