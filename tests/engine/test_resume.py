"""Resume in one process: a run interrupted after k updates and resumed from its checkpoints ends bit-identical to an
uninterrupted one; resume rules (auto, never, a path); the checkpoint format's parts round-trip. (Killing the process
with SIGKILL is test_crash_resume.py; this file runs in-process so the mutation tests can see it.)"""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from engine_kit import make_trainer, mlp, table
from support.linear_run import RUN, data, fit, linear

from trainflow.core.errors import UserError
from trainflow.engine.checkpoint import (
    CheckpointStore,
    capture_rng,
    flatten_optimizer,
    load_checkpoint,
    restore_rng,
    unflatten_optimizer,
)
from trainflow.engine.loaders import epoch_order
from trainflow.engine.trainer import Trainer
from trainflow.models import MLP

SETTINGS: dict[str, Any] = {"epochs": 4, "batch_size": 8, "accumulate": 2, "checkpoint_every": 3, "eval_every": 5,
                            "log_every": 4, "keep_last": 2, "resume": "auto"}  # fmt: skip


class Interrupted(Exception):
    pass


def model() -> MLP:
    torch.manual_seed(5)
    return MLP(6, 3, [32], dropout=0.2)  # dropout: only a restored RNG state reproduces the run


def run(tmp: Path, precision: str, stop_after: int | None = None, **overrides: Any) -> Trainer:
    """fit() in a fresh Trainer; with stop_after, an exception ends it after that many updates, as a crash would."""
    t = make_trainer(tmp, model(), precision=precision, **{**SETTINGS, **overrides})
    if precision == "fp16":
        t.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**22, growth_interval=3)
    if stop_after is not None:
        step = t.train_step

        def crash(micro: list[Any], count: int) -> None:
            if t.state.updates == stop_after:
                raise Interrupted
            step(micro, count)

        t.train_step = crash  # type: ignore[method-assign]
    data = table(n=203)
    with contextlib.suppress(Interrupted):
        t.fit(data, data)
    return t


def fingerprint_of(t: Trainer) -> dict[str, Any]:
    return {
        "weights": {k: v.clone() for k, v in t.model.state_dict().items()},
        "history": t.state.history,
        "applied": t.state.applied,
        "scale": t.scaler.state_dict() if t.scaler.is_enabled() else None,
    }


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    weights = a["weights"].keys() == b["weights"].keys() and all(
        a["weights"][k].view(torch.int32).equal(b["weights"][k].view(torch.int32)) for k in a["weights"]
    )
    return weights and a["history"] == b["history"] and a["applied"] == b["applied"] and a["scale"] == b["scale"]


@pytest.fixture(scope="module")
def whole_fp32(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted fp32 run under SETTINGS, which several tests' resumed runs must end as: trained once."""
    return fingerprint_of(run(tmp_path_factory.mktemp("whole"), "fp32"))


PLATEAU = {"schedule": "plateau", "plateau_patience": 1, "plateau_factor": 0.5, "eval_every": 3, "lr": 0.05}


@pytest.mark.parametrize(
    ("precision", "seed", "overrides"),
    [
        ("fp32", 0, {}),
        ("fp32", 1, {}),
        ("fp16", 2, {}),
        ("fp32", 3, PLATEAU),
        ("fp32", 4, {"ema_decay": 0.8}),
        ("fp16", 5, {"ema_decay": 0.8, "layer_decay": None, "param_groups": [{"match": "net.3.*", "lr_scale": 2.0}]}),
    ],
)  # plateau, EMA: their states are restored too; groups: each keeps its rate
def test_an_interrupted_run_resumes_bit_identically(
    whole_fp32: dict[str, Any], tmp_path: Path, precision: str, seed: int, overrides: dict[str, Any]
) -> None:
    if (precision, overrides) == ("fp32", {}):
        whole = whole_fp32
    else:
        whole_run = run(tmp_path / "whole", precision, **overrides)
        whole = fingerprint_of(whole_run)
        if overrides.get("schedule") == "plateau":
            assert whole_run.plateau is not None and whole_run.plateau.scale < 1  # the rate was lowered on the way
    stop = random.Random(seed).randint(4, 4 * 13 - 2)
    crashed = run(tmp_path / "resumed", precision, stop_after=stop, **overrides)
    assert crashed.state.updates == stop
    resumed = run(tmp_path / "resumed", precision, **overrides)
    assert resumed.resumed_from is not None and 0 < resumed.resumed_from <= stop
    assert same(fingerprint_of(resumed), whole)
    assert not same(fingerprint_of(crashed), whole)  # the interruption did cut the run short


def test_resume_never_starts_fresh_and_a_path_continues_from_it(
    whole_fp32: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run(tmp_path / "a", "fp32", stop_after=20)
    capsys.readouterr()
    fresh = run(tmp_path / "a", "fp32", resume="never")
    assert fresh.resumed_from is None
    said = capsys.readouterr()
    assert "train: train.resume is never; removed " in said.err and "resume is never" not in said.out  # a note
    whole = whole_fp32
    assert same(fingerprint_of(fresh), whole)
    # A path (a checkpoint directory, or a folder of them) continues from it whatever wrote it.
    run(tmp_path / "b", "fp32", stop_after=20)
    step = CheckpointStore(tmp_path / "b", 2).latest()
    assert step is not None
    for where in (step, tmp_path / "b"):
        continued = run(tmp_path / "c", "fp32", resume=str(where))
        assert continued.resumed_from == int(step.name.removeprefix("step-"))
        assert same(fingerprint_of(continued), whole)
    with pytest.raises(UserError, match="train.resume"):
        run(tmp_path / "d", "fp32", resume=str(tmp_path / "nowhere"))


def test_auto_resume_refuses_checkpoints_of_another_fingerprint(tmp_path: Path) -> None:
    run(tmp_path, "fp32", stop_after=20)
    t = make_trainer(tmp_path, model(), **SETTINGS)
    t.fingerprint = "other params"
    data = table(n=203)
    t.fit(data, data)
    assert t.resumed_from is None and t.state.updates == 4 * 13


def test_checkpoint_parts_round_trip(tmp_path: Path) -> None:
    t = run(tmp_path, "fp32", stop_after=9)
    tensors, meta = flatten_optimizer(t.optimizer.state_dict())
    back = unflatten_optimizer(tensors, meta)
    original = t.optimizer.state_dict()
    assert back["param_groups"] == [{**g, "lr": float(g["lr"])} for g in original["param_groups"]]
    for pid, state in original["state"].items():
        assert set(back["state"][pid]) == set(state)
        assert all(torch.equal(back["state"][pid][k], v) for k, v in state.items())
    # RNG: capture, draw, restore, draw again: the same numbers from python, numpy and torch.
    rng_tensors, rng_meta = capture_rng()
    first = (random.random(), np.random.rand(), torch.rand(3))
    restore_rng(rng_tensors, rng_meta, reseed=0)
    second = (random.random(), np.random.rand(), torch.rand(3))
    assert first[:2] == second[:2] and torch.equal(first[2], second[2])
    # The checkpoint on disk holds what the trainer had.
    latest = CheckpointStore(tmp_path, 2).latest()
    assert latest is not None
    saved = load_checkpoint(latest)
    assert saved.meta["state"]["updates"] == int(latest.name.removeprefix("step-"))
    assert saved.meta["fingerprint"] == "test" and saved.meta["params"]["batch_size"] == 8


def test_the_resume_says_where_it_continues(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(tmp_path, "fp32", stop_after=20)
    latest = CheckpointStore(tmp_path, 2).latest()
    assert latest is not None
    saved = load_checkpoint(latest).meta["state"]
    capsys.readouterr()
    run(tmp_path, "fp32")
    err = capsys.readouterr().err
    assert (
        f"train: resumed from {latest} at update {saved['updates']} (epoch {saved['epoch']}, "
        f"sample {saved['position']} of its order)"
    ) in err


def test_a_checkpoint_of_the_old_format_resumes_at_the_same_sample(whole_fp32: dict[str, Any], tmp_path: Path) -> None:
    """trainflow 0.1 kept the data position in windows of one process and the non-finite run outside the state."""
    import json

    run(tmp_path / "new", "fp32", stop_after=20)
    whole = whole_fp32
    latest = CheckpointStore(tmp_path / "new", 2).latest()
    assert latest is not None
    meta = json.loads((latest / "meta.json").read_text())
    window = meta["params"]["batch_size"] * meta["params"]["accumulate"]
    assert meta["state"]["position"] % window == 0 and meta["state"]["position"] > 0
    meta["state"]["position"] //= window  # windows
    del meta["position_unit"]
    meta["consecutive_nonfinite"] = meta["state"].pop("consecutive_nonfinite")
    (latest / "meta.json").write_text(json.dumps(meta))
    resumed = run(tmp_path / "new", "fp32")
    assert resumed.resumed_from == meta["state"]["updates"]
    assert same(fingerprint_of(resumed), whole)


def test_a_checkpoint_of_another_model_is_refused_with_the_way_out(tmp_path: Path) -> None:
    run(tmp_path, "fp32", stop_after=20)
    t = make_trainer(tmp_path, MLP(6, 3, [8], dropout=0.0), **{**SETTINGS, "resume": str(tmp_path)})
    data = table(n=203)
    refused = (
        r"(?s)does not fit this model and trainer \(RuntimeError: .*size mismatch.*start fresh with train.resume: never"
    )
    with pytest.raises(UserError, match=refused):
        t.fit(data, data)


# --- CUDA random states, on a simulated torch.cuda (no GPU here) ------------------------------------------------------


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Any:
    """`install(n)`: torch.cuda with n devices whose default generators are CPU generators, so torch's own
    get_rng_state/set_rng_state/manual_seed code runs against them (as the audit simulated it). Returns them."""
    import torch.cuda.random as cuda_random

    def install(n: int) -> tuple[torch.Generator, ...]:
        generators = tuple(torch.Generator().manual_seed(1000 + i) for i in range(n))
        for module in (torch.cuda, cuda_random):
            monkeypatch.setattr(module, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "init", lambda: None)
        monkeypatch.setattr(torch.cuda, "default_generators", generators)
        monkeypatch.setattr(cuda_random, "_lazy_init", lambda: None)
        monkeypatch.setattr(cuda_random, "is_initialized", lambda: True)
        monkeypatch.setattr(cuda_random, "_lazy_call", lambda cb, **_: cb())
        monkeypatch.setattr(cuda_random, "current_device", lambda: 0)
        return generators

    return install


def states(generators: tuple[torch.Generator, ...]) -> list[bytes]:
    return [g.get_state().numpy().tobytes() for g in generators]


def test_each_gpu_gets_its_own_random_state_back_on_a_node_of_twelve(fake_cuda: Any) -> None:
    generators = fake_cuda(12)
    for i, g in enumerate(generators):
        torch.rand(i + 1, generator=g)  # every device somewhere else in its stream
    captured = states(generators)
    tensors, meta = capture_rng()
    assert sorted(k for k in tensors if k != "torch") == sorted(f"cuda{i}" for i in range(12))
    for g in generators:
        torch.rand(5, generator=g)
    assert restore_rng(tensors, meta, reseed=0) == []
    assert states(generators) == captured  # device 10 got cuda10's state, not the third in text order (cuda10)


def test_a_checkpoint_of_two_gpus_resumes_on_one_and_one_of_one_on_two(
    whole_fp32: dict[str, Any], tmp_path: Path, fake_cuda: Any
) -> None:
    whole = whole_fp32
    two = fake_cuda(2)
    run(tmp_path / "a", "fp32", stop_after=20)
    latest = CheckpointStore(tmp_path / "a", 2).latest()
    assert latest is not None
    checkpoint = load_checkpoint(latest)  # read now: the resumed run's retention deletes it
    saved = checkpoint.tensors["rng"]
    assert [saved[f"cuda{i}"].numpy().tobytes() for i in range(2)] == states(two)  # every GPU's state is kept
    one = fake_cuda(1)
    torch.rand(3, generator=one[0])
    resumed = run(tmp_path / "a", "fp32")  # was: a raw IndexError from set_rng_state_all
    assert resumed.resumed_from is not None and same(fingerprint_of(resumed), whole)
    assert states(one) == [saved["cuda0"].numpy().tobytes()]
    # The other way: a GPU the checkpoint has no state for starts from (seed, rank, update), the same every time.
    tensors, meta = dict(saved), checkpoint.meta["rng"]
    del tensors["cuda1"]
    three = fake_cuda(3)
    assert restore_rng(tensors, meta, reseed=41) == [1, 2]
    expected = [torch.Generator().manual_seed(41 + i).get_state().numpy().tobytes() for i in (1, 2)]
    assert states(three) == [saved["cuda0"].numpy().tobytes(), *expected]


def test_a_resume_that_reseeds_the_gpu_it_trains_on_says_so(
    tmp_path: Path, fake_cuda: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_cuda(1)
    t = run(tmp_path, "fp32", stop_after=20)
    latest = CheckpointStore(tmp_path, 2).latest()
    assert latest is not None
    fake_cuda(2)
    t.device = torch.device("cuda", 1)  # rank 0 of a run resumed on GPU 1 (only the message reads the device)
    capsys.readouterr()
    t._restore_rng(load_checkpoint(latest))
    err = capsys.readouterr().err
    assert "holds the random state of 1 GPU(s), none for cuda:1 (rank 0)" in err and "differ" in err
    t.device = torch.device("cuda", 0)
    t._restore_rng(load_checkpoint(latest))
    assert capsys.readouterr().err == ""


# --- resume: <path> under other params: the checkpoint's state, the current settings ---------------------------------

CONSTANT = {"schedule": "constant", "warmup_fraction": 0.0, "lr": 0.01, "eval_every": None}


def interrupted_run(tmp: Path, optimizer: str) -> Path:
    """A run of engine_kit's MLP (no dropout) stopped after 20 updates; its latest checkpoint."""
    t = make_trainer(tmp, mlp(), **{**SETTINGS, **CONSTANT, "optimizer": optimizer})
    step = t.train_step

    def crash(micro: list[Any], count: int) -> None:
        if t.state.updates == 20:
            raise Interrupted
        step(micro, count)

    t.train_step = crash  # type: ignore[method-assign]
    data = table(n=203)
    with contextlib.suppress(Interrupted):
        t.fit(data, data)
    latest = CheckpointStore(tmp, 2).latest()
    assert latest is not None
    return latest


def next_update_by_hand(step: Path, optimizer: str, weight_decay: float, momentum: float) -> dict[str, torch.Tensor]:
    """The update after checkpoint `step`, in plain PyTorch: its weights and optimizer moments (found by name in the
    checkpoint's own layout: the matrices' decay group, then the vectors'), the given settings, the next window."""
    ckpt = load_checkpoint(step)
    net = mlp()
    net.load_state_dict(ckpt.tensors["model"])
    named = dict(net.named_parameters())
    matrices = [n for n, q in named.items() if q.ndim >= 2]
    vectors = [n for n, q in named.items() if q.ndim < 2]
    groups = [{"params": [named[n] for n in matrices], "weight_decay": weight_decay},
              {"params": [named[n] for n in vectors], "weight_decay": 0.0}]  # fmt: skip
    opt = (
        torch.optim.SGD(groups, lr=0.01, momentum=momentum)
        if optimizer == "sgd"
        else torch.optim.AdamW(groups, lr=0.01)
    )
    saved = ckpt.tensors["optimizer"]
    for i, name in enumerate(matrices + vectors):
        opt.state[named[name]] = {k.split("/", 1)[1]: v.clone() for k, v in saved.items() if k.startswith(f"{i}/")}
    data, state = table(n=203), ckpt.meta["state"]
    idx = epoch_order(203, 7, state["epoch"])[state["position"] : state["position"] + 16]
    torch.nn.functional.cross_entropy(net(data.x[idx]), data.y[idx]).backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    opt.step()
    return {n: q.detach().clone() for n, q in named.items()}


@pytest.mark.parametrize(
    ("optimizer", "weight_decay", "momentum"),
    [("adamw", 0.3, 0.9), ("adamw", 0.0, 0.9), ("sgd", 0.01, 0.5)],
)  # 0.0: one parameter group where the checkpoint has two (decay, no_decay); sgd: another momentum
def test_a_resume_from_a_path_trains_with_the_settings_it_says_it_uses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], optimizer: str, weight_decay: float, momentum: float
) -> None:
    """Was: the checkpoint's weight decay and momentum won (loaded with the optimizer state) while the trainer printed
    that it used the current params; a weight decay of 0 made the resume refuse the checkpoint."""
    step = interrupted_run(tmp_path / "a", optimizer)
    at = int(step.name.removeprefix("step-"))
    expected = next_update_by_hand(step, optimizer, weight_decay, momentum)
    settings = {**SETTINGS, **CONSTANT, "optimizer": optimizer, "resume": str(step), "max_steps": at + 1,
                "weight_decay": weight_decay, "momentum": momentum}  # fmt: skip
    t = make_trainer(tmp_path / "b", mlp(), **settings)
    t.fingerprint = "another run"
    capsys.readouterr()
    data = table(n=203)
    t.fit(data, data)
    assert t.resumed_from == at
    after = load_checkpoint(CheckpointStore(tmp_path / "b", 2).path(at + 1)).tensors["model"]
    for name, value in expected.items():
        torch.testing.assert_close(after[name], value, rtol=1e-5, atol=1e-6, msg=name)
    changed = "train.weight_decay" if weight_decay != 0.01 else "train.momentum"
    assert f"written with other params or data ({changed}" in capsys.readouterr().err
    decays = {g["name"]: g["weight_decay"] for g in t.optimizer.param_groups}
    assert decays == ({"decay": weight_decay, "no_decay": 0.0} if weight_decay else {"no_decay": 0.0})


def test_a_resume_under_another_optimizer_is_refused_with_the_way_out(tmp_path: Path) -> None:
    step = interrupted_run(tmp_path / "a", "adamw")
    t = make_trainer(tmp_path / "b", mlp(), **{**SETTINGS, **CONSTANT, "optimizer": "sgd", "resume": str(step)})
    data = table(n=203)
    with pytest.raises(UserError) as refused:
        t.fit(data, data)
    assert str(refused.value) == (
        f"checkpoint {step} holds the state of adamw, but train.optimizer is sgd: one optimizer's moments cannot "
        "continue another's; set train.optimizer: adamw to continue it, or start fresh with train.resume: never"
    )


# --- the best checkpoint when the final evaluation finds it --------------------------------------------------------

BEST_LAST = {**SETTINGS, **CONSTANT, "lr": 0.02, "epochs": 1, "max_steps": 12, "checkpoint_every": 4, "eval_every": 5,
             "keep_last": 1}  # fmt: skip  # evaluations at 5, 10 and (the final one) 12; checkpoints at 4, 8, 12


def test_best_json_names_the_update_the_final_evaluation_found_best(tmp_path: Path) -> None:
    """Checkpoint 12 is written before the final evaluation finds update 12 the best (val_loss still falling): best.json
    and that checkpoint's meta must name step 12 (was: step 10, whose weights were then exported)."""
    data = table(n=203)
    t = make_trainer(tmp_path, mlp(), **BEST_LAST)
    t.fit(data, data)
    losses = {int(r["update"]): r["val_loss"] for r in t.state.history}
    assert list(losses) == [5, 10, 12] and losses[12] < losses[10] < losses[5]  # the premise: 12 is the best
    store = CheckpointStore(tmp_path, 1)
    step12 = store.path(12)
    assert store.best() == step12
    meta = load_checkpoint(step12).meta
    assert meta["best_step"] == step12.name and meta["state"]["best_update"] == 12
    assert meta["state"]["best_metric"] == losses[12]
    assert not (tmp_path / store.path(10).name).exists()  # retention keeps the last (and best) one only
    weights = load_checkpoint(step12).tensors["model"]
    assert all(torch.equal(weights[k], v) for k, v in t.model.state_dict().items())  # what fit() leaves to export


def test_a_run_killed_before_its_final_evaluation_names_the_best_when_it_resumes(tmp_path: Path) -> None:
    data = table(n=203)
    t = make_trainer(tmp_path, mlp(), **{**BEST_LAST, "resume": "auto"})
    evaluate = t._evaluate

    def killed_at_12(val: Any) -> None:
        if t.state.updates == 12:
            raise Interrupted  # after checkpoint 12 is on disk, before its evaluation
        evaluate(val)

    t._evaluate = killed_at_12  # type: ignore[method-assign]
    with contextlib.suppress(Interrupted):
        t.fit(data, data)
    assert CheckpointStore(tmp_path, 1).best() == CheckpointStore(tmp_path, 1).path(10)
    resumed = make_trainer(tmp_path, mlp(), **{**BEST_LAST, "resume": "auto"})
    resumed.fit(data, data)
    assert resumed.resumed_from == 12 and resumed.state.best_update == 12
    store = CheckpointStore(tmp_path, 1)
    assert store.best() == store.path(12) and load_checkpoint(store.path(12)).meta["best_step"] == "step-000000012"


# --- no input hangs training ------------------------------------------------------------------------------------------


def fit_within(t: Trainer, seconds: float) -> None:
    """fit() in a thread that must end within `seconds`: a hang fails the test instead of stalling the test run."""
    import threading

    data, errors = table(n=203), []

    def target() -> None:
        try:
            t.fit(data, data)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"fit() still running after {seconds} s: it hangs"
    if errors:
        raise errors[0]


@pytest.mark.parametrize(("batch_size", "accumulate"), [(4, 2), (3, 2), (8, 1)])
def test_limit_batches_resumed_with_a_smaller_window_ends_its_epoch_instead_of_hanging(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], batch_size: int, accumulate: int
) -> None:
    """3 epochs of 2 windows of 16; killed after 3 updates (16 samples into epoch 1), resumed with windows of 8, 6 or 8:
    an epoch now takes 16, 12 or 16 samples, so epoch 1 is over and epoch 2 has its 2 windows (was: fit() forever)."""
    limited = {**SETTINGS, "epochs": 3, "limit_batches": 2, "checkpoint_every": 1}
    t = make_trainer(tmp_path, mlp(), **limited)
    step = t.train_step

    def crash(micro: list[Any], count: int) -> None:
        if t.state.updates == 3:
            raise Interrupted
        step(micro, count)

    t.train_step = crash  # type: ignore[method-assign]
    with contextlib.suppress(Interrupted):
        fit_within(t, 60)
    resumed = make_trainer(tmp_path, mlp(), **{**limited, "resume": str(tmp_path), "batch_size": batch_size,
                                               "accumulate": accumulate})  # fmt: skip
    capsys.readouterr()
    fit_within(resumed, 60)
    assert resumed.resumed_from == 3
    assert (resumed.state.epoch, resumed.state.updates) == (3, 3 + 2) == (3, resumed.plan.total)
    assert "resumed at sample 16 of epoch 1, past the" in capsys.readouterr().err


def test_a_checkpoint_written_without_fp16_resumes_under_fp16_and_finishes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An fp32 run of 1 epoch (2 updates of the 6-sample linear run) leaves step-000000002, whose GradScaler state is
    empty (the scaler was disabled). A 2-epoch run under precision fp16 with train.resume at that checkpoint starts its
    scaler afresh (nothing to load), resumes at update 2 and finishes the second epoch's 2 updates: 4 in all. (Loading
    the empty state into the enabled scaler raises, which made the resume fail with a CheckpointError.)"""
    first = fit(tmp_path / "a", epochs=1)
    step = tmp_path / "a" / "step-000000002"
    assert first.state.updates == 2 and step.is_dir()
    meta = json.loads((step / "meta.json").read_text())
    assert meta["scaler"] == {}  # written without fp16: nothing to restore
    capsys.readouterr()

    t = make_trainer(tmp_path / "b", linear(), precision="fp16", **{**RUN, "resume": str(step)})
    assert t.scaler.is_enabled()
    t.fit(*data())
    assert f"train: resumed from {step} at update 2 (epoch 1, sample 0 of its order)\n" in capsys.readouterr().err
    assert (t.resumed_from, t.state.updates, t.state.epoch) == (2, 4, 2)
    assert [row["update"] for row in t.state.history] == [2.0, 4.0]  # the first epoch's row came with the checkpoint
    latest = CheckpointStore(tmp_path / "b", 2).latest()
    assert latest is not None and latest.name == "step-000000004"
    assert json.loads((latest / "meta.json").read_text())["scaler"]  # this run's fp16 scaler state, saved
