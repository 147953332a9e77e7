"""train.compile: reduce-overhead on a real GPU, where the model's forward and backward are replayed as CUDA graphs:
it trains as the eager step does (accumulation 2 with a partial last window, a skipped update, EMA), a resumed run
continues bit for bit under train.deterministic, and the updates after warm-up replay graphs (none skipped by
inductor) without a host sync. tests/engine/test_captured_step.py runs the same code path on the CPU, capture off.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_kit import InfGrads, Interrupted, bitwise_equal, crash_after, mlp, record_steps, rel, table, training_state
from support.host_sync import windows
from torch._dynamo.utils import counters

from trainflow.engine.trainer import Trainer

from .gpu_kit import CUDA, cuda_trainer, on_host

N = 84  # windows of 16 x 2: 32, 32, then 20 (micro-batches of 16 and 4): 3 updates an epoch
SETTINGS: dict[str, Any] = {"batch_size": 16, "accumulate": 2, "epochs": 2, "lr": 0.01, "ema_decay": 0.9}
BAD = 2  # the update whose gradients become inf: skipped


@pytest.fixture
def replays(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times any CUDA graph was replayed (inductor's CUDA graph trees replay torch.cuda.CUDAGraph's)."""
    count = [0]
    replay = torch.cuda.CUDAGraph.replay

    def counted(self: torch.cuda.CUDAGraph) -> None:
        count[0] += 1
        replay(self)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", counted)
    return count


@contextlib.contextmanager
def no_host_sync() -> Iterator[None]:
    """Any CUDA call in the block that makes the host wait for the GPU raises a RuntimeError (as in
    test_no_host_sync.py)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def run(tmp: Path, compile: bool | str) -> tuple[Trainer, list[dict[str, Any]]]:
    """fit() on the GPU, recording the training state (read to the host) around every update."""
    t = cuda_trainer(tmp, InfGrads({BAD}, accumulate=2), compile=compile, **SETTINGS)
    steps = record_steps(t, lambda t: on_host(training_state(t)))
    data = table(n=N)
    data.to(CUDA)
    t.fit(data, data)
    return t, steps


def test_the_captured_step_trains_as_the_eager_step_on_the_gpu(tmp_path: Path, replays: list[int]) -> None:
    eager, _ = run(tmp_path / "eager", False)
    assert replays[0] == 0
    skipped_graphs = counters["inductor"]["cudagraph_skips"]
    t, steps = run(tmp_path / "graphed", "reduce-overhead")
    assert t.graphed and t.decide_on_device
    assert counters["inductor"]["cudagraph_skips"] == skipped_graphs  # inductor captured every graph
    assert replays[0] > 0
    assert (t.state.updates, t.state.applied) == (eager.state.updates, eager.state.applied) == (6, 5)
    assert bitwise_equal(steps[BAD - 1]["before"], steps[BAD - 1]["after"]) == []  # the skip changed nothing
    # Inductor's fused kernels (GELU, the bias gradients' sums) round differently from ATen's in the last bits,
    # which AdamW carries on: the bound of tests/engine/test_engine.py's compile test.
    assert rel(t.model, eager.model) <= 1e-4
    assert rel(mlp().to(CUDA), eager.model) > 1e-2  # it did train


def resumable(tmp: Path, stop_after: int | None = None, resumed: bool = False) -> Trainer:
    """Dropout (a restored random stream continues it), a skipped update before the checkpoint resumed from (4)."""
    model = InfGrads(set() if resumed else {BAD}, accumulate=2)
    model.net.net[2].p = 0.2  # type: ignore[union-attr]  # its Dropout
    settings = {**SETTINGS, "epochs": 4, "checkpoint_every": 4, "resume": "auto", "deterministic": True}
    t = cuda_trainer(tmp, model, compile="reduce-overhead", **settings)
    if stop_after is not None:
        crash_after(t, stop_after)
    data = table(n=N)
    data.to(CUDA)
    with contextlib.suppress(Interrupted):
        t.fit(data, data)
    return t


def test_a_resumed_captured_run_continues_bit_for_bit_on_the_gpu(tmp_path: Path, backends: None) -> None:
    whole = resumable(tmp_path / "whole")
    crashed = resumable(tmp_path / "resumed", stop_after=5)
    resumed = resumable(tmp_path / "resumed", resumed=True)
    assert resumed.resumed_from == 4 and whole.state.applied == resumed.state.applied == 11
    assert bitwise_equal(on_host(training_state(resumed)), on_host(training_state(whole))) == []
    assert resumed.state.history == whole.state.history
    assert bitwise_equal(on_host(training_state(crashed)), on_host(training_state(whole)))


WARM_UP, GUARDED = 3, 4  # windows: the first compile, warm up and record the graphs; the guarded ones replay them


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_captured_updates_replay_graphs_without_a_host_sync(tmp_path: Path, replays: list[int], precision: str) -> None:
    """Accumulation 2 (gradients copied out of the graph pool between micro-batches), autocast, EMA, and a poisoned
    window among the guarded ones, skipped on the device."""
    data = table(n=16 * 2 * (WARM_UP + GUARDED))
    data.to(CUDA)
    model = InfGrads({WARM_UP + 2}, accumulate=2)
    t = cuda_trainer(tmp_path, model, precision=precision, batch_size=16, accumulate=2, ema_decay=0.9,
                     compile="reduce-overhead")  # fmt: skip
    t.prepare(data)
    assert t.graphed
    skipped_graphs = counters["inductor"]["cudagraph_skips"]
    steps = windows(data, 16, 2, WARM_UP + GUARDED)  # batching is data preparation: before the guard
    for micro in steps[:WARM_UP]:
        t.train_step(micro)
    before = replays[0]
    with no_host_sync():
        for micro in steps[WARM_UP:]:
            t.train_step(micro)
    # At least a forward and a backward graph per micro-batch were replayed, none recorded (recording syncs).
    assert replays[0] - before >= 2 * 2 * GUARDED
    assert counters["inductor"]["cudagraph_skips"] == skipped_graphs
    assert t.counters.applied == WARM_UP + GUARDED - 1  # the poisoned window skipped, decided on the device
