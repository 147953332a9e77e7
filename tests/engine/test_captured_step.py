"""train.compile: reduce-overhead on the CPU, where inductor leaves CUDA graphs out and the rest of its code path runs:
it trains as the eager step does (accumulation, a partial last window, a skipped update, EMA), a resumed run continues
bit for bit, gradients leave the graph pool between micro-batches, and what it is not used with is refused or compiled
as `compile: true`, saying why. tests/gpu/test_captured_step.py runs it captured on a GPU.

Compiled runs cost seconds each on two cores (inductor's cache makes the later ones cheaper): four in this file."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_kit import (
    InfGrads,
    Interrupted,
    bitwise_equal,
    crash_after,
    make_trainer,
    mlp,
    record_steps,
    rel,
    table,
    text_data,
    text_model,
    training_state,
)
from torch import nn
from torch._dynamo.utils import counters

from trainflow.core.errors import ParamsError
from trainflow.engine.graphs import fallback_reason
from trainflow.engine.trainer import Trainer
from trainflow.params import TrainParams

# 84 samples in windows of 16 x 2: 32, 32 and a last window of 20 (micro-batches of 16 and 4), 3 updates an epoch.
N = 84
SETTINGS: dict[str, Any] = {"batch_size": 16, "accumulate": 2, "epochs": 2, "lr": 0.01, "ema_decay": 0.9}
BAD = 2  # the update whose gradients become inf: skipped


def run(tmp: Path, compile: bool | str, **overrides: Any) -> tuple[Trainer, list[dict[str, Any]]]:
    """fit() on the device decision path (what a GPU runs), recording the training state around every update."""
    t = make_trainer(tmp, InfGrads({BAD}, accumulate=2), compile=compile, **{**SETTINGS, **overrides})
    t.decide_on_device = True
    steps = record_steps(t)
    t.fit(table(n=N), table(n=N))
    return t, steps


def test_reduce_overhead_trains_as_the_eager_step_on_the_cpu(tmp_path: Path) -> None:
    eager, _ = run(tmp_path / "eager", False)
    skipped_graphs = counters["inductor"]["cudagraph_skips"]
    t, steps = run(tmp_path / "graphed", "reduce-overhead")
    # It went through inductor's reduce-overhead mode, which left CUDA graphs out on the CPU (and said nothing).
    assert t.graphed and counters["inductor"]["cudagraph_skips"] > skipped_graphs
    assert (t.state.updates, t.state.applied) == (eager.state.updates, eager.state.applied) == (6, 5)
    assert bitwise_equal(steps[BAD - 1]["before"], steps[BAD - 1]["after"]) == []  # the skip changed nothing
    # Inductor's generated kernels (GELU fused with its neighbours, the sums over the batch) may round differently
    # from ATen's in the last bits, which AdamW carries on: 1.4e-8 relative here when measured, a few float32 ulps.
    # 1e-5 is the engine tests' bound for "other kernels, same maths" (test_skips). The EMA and the losses likewise.
    assert rel(t.model, eager.model) <= 1e-5
    assert rel(mlp(), eager.model) > 1e-2  # it did train
    assert t.ema is not None and eager.ema is not None
    for mine, theirs in zip(t.ema.shadow, eager.ema.shadow, strict=True):
        assert torch.allclose(mine, theirs, rtol=0, atol=1e-6)
    for row, same in zip(t.state.history, eager.state.history, strict=True):
        assert row.keys() == same.keys()
        assert all(math.isclose(row[k], same[k], rel_tol=1e-5) for k in row)


def resumable(tmp: Path, stop_after: int | None = None, resumed: bool = False) -> Trainer:
    """A compiled run with dropout (only a restored random stream continues it), a skipped update and checkpoints at
    updates 3, 4, 6, 8, ...; with stop_after, an exception ends it after that many updates, as a crash would."""
    model = InfGrads(set() if resumed else {BAD}, accumulate=2)  # the skip is before the checkpoint resumed from
    model.net.net[2].p = 0.2  # type: ignore[union-attr]  # its Dropout
    settings = {**SETTINGS, "epochs": 4, "checkpoint_every": 4, "resume": "auto", "deterministic": True}
    t = make_trainer(tmp, model, compile="reduce-overhead", **settings)
    t.decide_on_device = True
    if stop_after is not None:
        crash_after(t, stop_after)
    with contextlib.suppress(Interrupted):
        t.fit(table(n=N), table(n=N))
    return t


def test_a_resumed_reduce_overhead_run_continues_bit_for_bit(tmp_path: Path, backends: None) -> None:
    whole = resumable(tmp_path / "whole")
    crashed = resumable(tmp_path / "resumed", stop_after=5)
    assert crashed.state.updates == 5
    resumed = resumable(tmp_path / "resumed", resumed=True)
    assert resumed.resumed_from == 4  # mid-epoch, before the epoch's partial window: its graph is compiled anew
    assert whole.state.applied == resumed.state.applied == 11  # 12 updates, one skipped
    assert bitwise_equal(training_state(resumed), training_state(whole)) == []
    assert resumed.state.history == whole.state.history
    assert bitwise_equal(training_state(crashed), training_state(whole))  # the crash did cut the run short


class PoolStandIn:
    """What a CUDA graph pool does to a replay's outputs, on the CPU: the next forward overwrites them. Each tensor
    that autograd handed to a parameter as its .grad (rather than adding into the .grad it had) is filled with NaN at
    the next forward, as the next replay would overwrite that memory."""

    def __init__(self, module: nn.Module, params: list[nn.Parameter]) -> None:
        self.module, self.params = module, params
        self.had: dict[int, torch.Tensor | None] = {}
        self.handed: list[torch.Tensor] = []
        for q in params:
            q.register_post_accumulate_grad_hook(self.accumulated)

    def accumulated(self, q: torch.Tensor) -> None:
        if q.grad is not self.had.get(id(q)):
            assert q.grad is not None
            self.handed.append(q.grad)

    def __call__(self, **inputs: torch.Tensor) -> torch.Tensor:
        for g in self.handed:
            g.fill_(math.nan)
        self.handed = []
        self.had = {id(q): q.grad for q in self.params}
        out: torch.Tensor = self.module(**inputs)
        return out


def test_gradients_leave_the_graph_pool_before_the_next_micro_batch(tmp_path: Path) -> None:
    """Accumulating into a gradient that the next replay overwrites would make every window of two micro-batches
    non-finite (skipped); copied out, the step is the eager one, bit for bit."""
    eager, _ = run(tmp_path / "eager", False)
    t = make_trainer(tmp_path / "pool", InfGrads({BAD}, accumulate=2), compile="reduce-overhead", **SETTINGS)
    t.decide_on_device = True
    t.forward = PoolStandIn(t.wrapped, t.params)  # eager, with the pool's overwrites: no compilation
    t.fit(table(n=N), table(n=N))
    assert t.graphed
    assert bitwise_equal(training_state(t), training_state(eager)) == []
    assert t.state.history == eager.state.history


def test_reduce_overhead_with_a_profile_is_refused(tmp_path: Path) -> None:
    profile = {"start": 2, "updates": 1}
    with pytest.raises(ParamsError) as err:
        make_trainer(tmp_path, mlp(), compile="reduce-overhead", profile=profile)
    [(field, why)] = err.value.problems
    assert field == "train.compile" and "profiler" in why and "train.compile: true" in why
    assert make_trainer(tmp_path, mlp(), compile=True, profile=profile).forward is not None  # true profiles


def test_compile_takes_true_false_and_reduce_overhead_only() -> None:
    values = [True, False, "reduce-overhead"]  # params.yaml's true and false are YAML booleans, as before
    assert [TrainParams(compile=v).compile for v in values] == values
    with pytest.raises(ValueError, match="False, True or 'reduce-overhead'"):
        TrainParams(compile="max-autotune")


def test_ranks_and_text_of_many_shapes_compile_as_true_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert fallback_reason(1, table()) is None
    assert "2 ranks" in str(fallback_reason(2, table()))
    varied = text_data()
    assert "padded to their longest" in str(fallback_reason(1, varied))
    one_length = varied.subset(torch.nonzero(varied.lengths == varied.lengths[0]).flatten())
    assert len(one_length) > 1 and fallback_reason(1, one_length) is None
    one_length.pack_width = 0  # packed: rows of a width that varies
    assert fallback_reason(1, one_length) is not None

    t = make_trainer(tmp_path, text_model("token"), compile="reduce-overhead", batch_size=8)
    capsys.readouterr()
    t.prepare(varied)
    assert not t.graphed and isinstance(t.forward, torch._dynamo.eval_frame.OptimizedModule)
    assert capsys.readouterr().err == (
        "train: train.compile reduce-overhead: text batches are padded to their longest sequence (or packed), so "
        "nearly every batch has a shape of its own, and each shape would compile and record a graph; compiling as "
        "compile: true\n"
    )
    t.prepare(varied)  # again (a resumed run plans twice): nothing more said
    assert capsys.readouterr().err == ""
