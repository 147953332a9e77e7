"""Resume in one process: a run interrupted after k updates and resumed from its checkpoints ends bit-identical to an
uninterrupted one; resume rules (auto, never, a path); the checkpoint format's parts round-trip. (Killing the process
with SIGKILL is test_crash_resume.py; this file runs in-process so the mutation tests can see it.)"""

from __future__ import annotations

import contextlib
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from engine_kit import make_trainer, table

from trainflow.engine.checkpoint import (
    CheckpointStore,
    capture_rng,
    flatten_optimizer,
    load_checkpoint,
    restore_rng,
    unflatten_optimizer,
)
from trainflow.engine.trainer import Trainer
from trainflow.errors import UserError
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
    tmp_path: Path, precision: str, seed: int, overrides: dict[str, Any]
) -> None:
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


def test_resume_never_starts_fresh_and_a_path_continues_from_it(tmp_path: Path) -> None:
    run(tmp_path / "a", "fp32", stop_after=20)
    fresh = run(tmp_path / "a", "fp32", resume="never")
    assert fresh.resumed_from is None
    whole = fingerprint_of(run(tmp_path / "whole", "fp32"))
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
    restore_rng(rng_tensors, rng_meta)
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


def test_a_checkpoint_of_the_old_format_resumes_at_the_same_sample(tmp_path: Path) -> None:
    """trainflow 0.1 kept the data position in windows of one process and the non-finite run outside the state."""
    import json

    run(tmp_path / "new", "fp32", stop_after=20)
    whole = fingerprint_of(run(tmp_path / "whole", "fp32"))
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
