"""batch_size auto and the model zoo pinned exactly (issue 24): the sizes the search probes and the one it picks (with
out-of-memory simulated above a threshold), the words of every choice and refusal, the CPU estimate's arithmetic,
the probes' no-trace guarantees; and each built-in model's layers, outputs (against a reference written here),
refusals and FLOP counts, worked out by hand."""

from __future__ import annotations

import hashlib
import math
import sys
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from support.nets import Net
from torch import nn

from trainflow.core.errors import ParamsError, UserError
from trainflow.engine import batch_size as bs
from trainflow.engine.distributed import Group
from trainflow.engine.loaders import Batch, TensorData
from trainflow.engine.objective import Objective
from trainflow.engine.precision import Precision
from trainflow.params import TrainParams

FP32 = Precision("fp32", "cpu")
CPU = torch.device("cpu")
MIB = 2**20


def tiny() -> tuple[Any, TensorData, Objective]:
    """Linear(4, 8) -> ReLU -> Linear(8, 1): 49 float32 parameters (196 bytes); autograd saves 14 floats (56 bytes)
    per sample (input row, ReLU output, output, target), nothing per batch."""
    torch.manual_seed(0)
    model = Net(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    return model, TensorData(torch.randn(64, 4), torch.randn(64)), Objective("regression")


# --- the search -------------------------------------------------------------------------------------------------------


def probes(total: int, limit: int) -> tuple[int | None, list[int]]:
    probed: list[int] = []

    def fits(b: int) -> bool:
        probed.append(b)
        return b <= limit

    return bs.largest_fitting(total, fits), probed


def test_the_search_probes_the_whole_share_first_then_bisects_the_other_divisors() -> None:
    # divisors of 12: 1 2 3 4 6 12. 12 fails; bisect over [1 2 3 4 6]: mid 3 fits, mid 4 fits, mid 6 fails.
    assert probes(12, 5) == (4, [12, 3, 4, 6])
    assert probes(12, 12) == (12, [12])
    assert probes(12, 0) == (None, [12, 3, 1])
    assert probes(12, 2) == (2, [12, 3, 1, 2])
    assert probes(1, 0) == (None, [1])
    assert probes(2, 1) == (1, [2, 1])
    # divisors of 36: 1 2 3 4 6 9 12 18 36; [1 .. 18]: mid 4 fits, mid 9 fits, mid 12 fails.
    assert probes(36, 10) == (9, [36, 4, 9, 12])
    assert bs.divisors(2) == [1, 2] and bs.divisors(16) == [1, 2, 4, 8, 16] and bs.divisors(6) == [1, 2, 3, 6]


def test_memory_estimate_at_a_batch_size() -> None:
    est = bs.MemoryEstimate(state=100, fixed=20.5, per_sample=3.25)
    assert est.at(0) == 120.5 and est.at(4) == 133.5


# --- the choice in words ----------------------------------------------------------------------------------------------


def test_mib_formats_three_significant_digits_below_100_and_whole_numbers_above() -> None:
    assert bs._mib(None) == "?"
    assert bs._mib(0.012345) == "0.0123"
    assert bs._mib(99.94) == "99.9"
    assert bs._mib(99.99) == "100"
    assert bs._mib(100.0) == "100"
    assert bs._mib(100.4) == "100"
    assert bs._mib(1234.6) == "1235"


def test_a_choice_describes_itself_and_its_summary() -> None:
    one = bs.Choice(8, 4, 32, 1, "memory budget 2 MiB", estimate_mb=1.23456)
    assert one.describe() == (
        "train: batch_size auto → 8 x accumulate 4 = global batch 32 (memory budget 2 MiB, estimate 1.23 MiB)"
    )
    assert one.summary() == {
        "batch_size": 8, "accumulate": 4, "global_batch": 32, "limit": "memory budget 2 MiB", "estimate_mb": 1.23456,
        "probe_peak_mb": None,
    }  # fmt: skip
    gpu = bs.Choice(16, 1, 64, 4, "GPU memory 72000 MiB", peak_mb=512.4)
    assert gpu.describe() == (
        "train: batch_size auto → 16 x accumulate 1 per process x 4 processes = global batch 64 "
        "(GPU memory 72000 MiB, probe peak 512 MiB)"
    )
    assert gpu.summary()["probe_peak_mb"] == 512.4 and gpu.summary()["estimate_mb"] is None
    both = bs.Choice(2, 3, 12, 2, "x", estimate_mb=0.5, peak_mb=7.0)
    assert both.describe() == (
        "train: batch_size auto → 2 x accumulate 3 per process x 2 processes = global batch 12 "
        "(x, estimate 0.5 MiB, probe peak 7 MiB)"
    )
    plain = bs.Choice(32, 1, 32, 1, "no memory budget: the whole share at once")
    assert plain.describe() == (
        "train: batch_size auto → 32 x accumulate 1 = global batch 32 (no memory budget: the whole share at once)"
    )
    assert (plain.estimate_mb, plain.peak_mb) == (None, None)


def test_nothing_fits_messages_in_full() -> None:
    cuda = torch.device("cuda")
    oom = bs._nothing_fits(TrainParams(batch_size="auto", global_batch=8, memory_budget_mb=5), cuda, None, None)
    assert type(oom) is UserError
    assert str(oom) == (
        "train: batch_size auto: not even one sample fits in GPU memory (forward+backward ran out of memory); "
        "try precision: bf16, strategy: fsdp with several GPUs, or a smaller model"
    )
    over = bs._nothing_fits(TrainParams(batch_size="auto", global_batch=8, memory_budget_mb=1.5), cuda, None, 3.25)
    assert isinstance(over, ParamsError) and over.source == "params.yaml"
    assert over.problems == [
        ("train.memory_budget_mb", "1.5 MiB is too little for batch_size auto: one sample's probe peaked at 3.25 MiB "
         "(parameters, gradients, optimizer state and activations); raise it, or set it to null for no limit"),
    ]  # fmt: skip
    cpu = bs._nothing_fits(TrainParams(batch_size="auto", global_batch=8, memory_budget_mb=0.25), CPU, 0.5, None)
    assert isinstance(cpu, ParamsError) and cpu.problems == [
        ("train.memory_budget_mb", "0.25 MiB is too little for batch_size auto: one sample needs 0.5 MiB "
         "(parameters, gradients, optimizer state and activations); raise it, or set it to null for no limit"),
    ]  # fmt: skip
    # On the CPU a peak is never measured; whatever is given, "needs" names the estimate when there is no peak.
    cpu_peak = bs._nothing_fits(TrainParams(batch_size="auto", global_batch=8, memory_budget_mb=1), CPU, None, 2.0)
    assert isinstance(cpu_peak, ParamsError) and "one sample's probe peaked at 2 MiB" in cpu_peak.problems[0][1]


# --- resolve on the CPU -----------------------------------------------------------------------------------------------


def test_a_fixed_batch_size_that_agrees_is_returned_as_it_is() -> None:
    model, data, objective = tiny()
    p = TrainParams(batch_size=8, accumulate=4, global_batch=32)
    resolved, choice = bs.resolve(p, model, data, objective, FP32, CPU, Group())
    assert resolved is p and choice is None
    free = TrainParams(batch_size=8)
    assert bs.resolve(free, model, data, objective, FP32, CPU, Group(world_size=3)) == (free, None)


def test_a_fixed_batch_size_that_disagrees_names_the_product() -> None:
    model, data, objective = tiny()
    with pytest.raises(ParamsError) as exc:
        bs.resolve(TrainParams(batch_size=8, accumulate=2, global_batch=16), model, data, objective, FP32, CPU,
                   Group(world_size=3))  # fmt: skip
    assert exc.value.source == "params.yaml"
    assert exc.value.problems == [
        ("train.global_batch", "train.global_batch (16) is not train.batch_size * train.accumulate * world size "
         "(8 * 2 * 3 = 48); make them agree, set global_batch: null, or set batch_size: auto to have batch_size and "
         "accumulate chosen for it"),
    ]  # fmt: skip


def test_an_auto_global_batch_that_does_not_split_names_the_multiple() -> None:
    model, data, objective = tiny()
    with pytest.raises(ParamsError) as exc:
        bs.resolve(TrainParams(batch_size="auto", global_batch=10), model, data, objective, FP32, CPU,
                   Group(world_size=4))  # fmt: skip
    assert exc.value.source == "params.yaml"
    assert exc.value.problems == [
        ("train.global_batch", "10 does not split evenly over 4 processes; make it a multiple of 4"),
    ]


def test_without_a_budget_the_whole_share_at_once() -> None:
    model, data, objective = tiny()
    resolved, choice = bs.resolve(TrainParams(batch_size="auto", global_batch=24), model, data, objective, FP32, CPU,
                                  Group())  # fmt: skip
    assert choice == bs.Choice(24, 1, 24, 1, "no memory budget: the whole share at once", None, None)
    assert (resolved.batch_size, resolved.accumulate, resolved.global_batch) == (24, 1, 24)


def test_a_budget_picks_by_the_estimate_and_reports_it() -> None:
    model, data, objective = tiny()
    budget = (784 + 56 * 10) / MIB  # state 784 bytes (adamw), 56 per sample: 8 fits, 16 does not
    p = TrainParams(batch_size="auto", global_batch=32, memory_budget_mb=budget)
    resolved, choice = bs.resolve(p, model, data, objective, FP32, CPU, Group())
    assert choice == bs.Choice(8, 4, 32, 1, f"memory budget {budget:g} MiB", (784 + 56 * 8) / MIB, None)
    assert (resolved.batch_size, resolved.accumulate) == (8, 4)
    exact = TrainParams(batch_size="auto", global_batch=32, memory_budget_mb=(784 + 56 * 16) / MIB)
    assert bs.resolve(exact, model, data, objective, FP32, CPU, Group())[1] == bs.Choice(
        16, 2, 32, 1, f"memory budget {(784 + 56 * 16) / MIB:g} MiB", (784 + 56 * 16) / MIB, None
    )  # an estimate equal to the budget fits


def test_a_budget_below_one_sample_says_what_one_sample_needs() -> None:
    model, data, objective = tiny()
    budget = 800 / MIB
    with pytest.raises(ParamsError) as exc:
        bs.resolve(TrainParams(batch_size="auto", global_batch=8, memory_budget_mb=budget), model, data, objective,
                   FP32, CPU, Group())  # fmt: skip
    assert exc.value.problems == [
        ("train.memory_budget_mb", f"{budget:g} MiB is too little for batch_size auto: one sample needs "
         f"{(784 + 56) / MIB:.3g} MiB (parameters, gradients, optimizer state and activations); raise it, or set it "
         "to null for no limit"),
    ]  # fmt: skip


@dataclass(frozen=True)
class Ranks(Group):
    """Rank 0 of a (pretend) run of several processes: the other ranks' choices come from `others`."""

    others: tuple[int, ...] = ()

    def gather(self, obj: Any) -> list[Any] | None:
        return [obj, *self.others] if self.rank == 0 else None

    def broadcast(self, obj: Any) -> Any:
        return obj if self.rank == 0 else 2


def test_ranks_take_the_smallest_choice_and_report_its_estimate() -> None:
    model, data, objective = tiny()
    budget = (784 + 56 * 8) / MIB  # per rank: a share of 16, 8 fits
    p = TrainParams(batch_size="auto", global_batch=32, memory_budget_mb=budget)
    group = Ranks(rank=0, world_size=2, others=(4,))
    resolved, choice = bs.resolve(p, model, data, objective, FP32, CPU, group)
    # DDP's gradient buckets: one more copy of the 196 bytes of gradients, so 8 no longer fits: 4 (its own choice)
    assert choice == bs.Choice(4, 4, 32, 2, f"memory budget {budget:g} MiB", (980 + 56 * 4) / MIB, None)
    assert (resolved.batch_size, resolved.accumulate) == (4, 4)
    roomy = TrainParams(batch_size="auto", global_batch=32)
    assert bs.resolve(roomy, model, data, objective, FP32, CPU, Ranks(rank=0, world_size=2, others=(2, 8)))[1] == (
        bs.Choice(2, 8, 32, 2, "no memory budget: the whole share at once", None, None)
    )  # the smallest of 16, 2 and 8; its estimate stays None without a budget


def test_agree_without_several_ranks_and_on_a_rank_that_gathers_nothing() -> None:
    assert bs._agree(Group(), 7) == 7
    assert bs._agree(Ranks(rank=0, world_size=3, others=(5, 9)), 7) == 5
    assert bs._agree(Ranks(rank=0, world_size=2, others=(9,)), 7) == 7
    assert bs._agree(Ranks(rank=1, world_size=2), 7) == 2  # rank 0's answer, broadcast
    assert type(bs._agree(Ranks(rank=0, world_size=2, others=(True,)), 7)) is int


# --- the CPU estimate -------------------------------------------------------------------------------------------------


def test_saved_bytes_counts_the_saved_activations_once_and_clears_the_gradients() -> None:
    model, data, objective = tiny()
    batch = data.batch(torch.arange(5))
    assert bs.saved_bytes(model, batch, objective, FP32) == 5 * 56
    assert all(q.grad is None for q in model.parameters())


def test_saved_bytes_leaves_out_the_parameters_themselves() -> None:
    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * self.w).sum(dim=1)  # mul saves x (3 floats a sample) and w (a parameter)

    data = TensorData(torch.randn(6, 3), torch.randn(6))
    # per sample: x (12 bytes), the output and the target (4 bytes each) for the squared error: 20
    assert bs.saved_bytes(Scale(), data.batch(torch.arange(6)), Objective("regression"), FP32) == 6 * 20


class Sized:
    """A dataset whose batches only say their size; `calls` records them (typed Any: it is a Dataset by duck typing)."""

    index_device = CPU

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, []  # type: ignore[var-annotated]

    def __len__(self) -> int:
        return self.n

    def batch(self, idx: torch.Tensor) -> Batch:
        self.calls.append(idx.tolist())
        return Batch({}, torch.zeros(len(idx)), len(idx))


def sized(n: int) -> Any:
    return Sized(n)


def fake_saved(monkeypatch: pytest.MonkeyPatch, bytes_at: dict[int, int]) -> list[int]:
    sizes: list[int] = []

    def saved(model: Any, batch: Batch, objective: Any, precision: Any) -> int:
        sizes.append(batch.size)
        return bytes_at[batch.size]

    monkeypatch.setattr(bs, "saved_bytes", saved)
    return sizes


@pytest.mark.parametrize(
    ("share", "sizes", "fixed", "per_sample"),
    [(64, [4, 8], 100.0, 7.0), (8, [4, 8], 100.0, 7.0), (7, [3, 7], 100.0, 7.0), (3, [1, 3], 100.0, 7.0),
     (2, [1, 2], 100.0, 7.0)],
)  # fmt: skip
def test_the_estimate_measures_at_two_sizes_within_the_share(
    monkeypatch: pytest.MonkeyPatch, share: int, sizes: list[int], fixed: float, per_sample: float
) -> None:
    seen = fake_saved(monkeypatch, {n: 100 + 7 * n for n in range(1, 9)})
    model, _, objective = tiny()
    est = bs.estimate_memory(model, sized(64), objective, FP32, TrainParams(), share)
    assert seen == sizes
    assert est == bs.MemoryEstimate(784, fixed, per_sample)
    assert type(est.fixed) is float and type(est.per_sample) is float


def test_a_share_of_one_is_one_measurement_all_per_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = fake_saved(monkeypatch, {1: 333})
    model, _, objective = tiny()
    est = bs.estimate_memory(model, sized(64), objective, FP32, TrainParams(), 1)
    assert seen == [1] and est == bs.MemoryEstimate(784, 0.0, 333.0) and type(est.per_sample) is float


def test_the_estimate_never_goes_negative(monkeypatch: pytest.MonkeyPatch) -> None:
    model, _, objective = tiny()
    fake_saved(monkeypatch, {4: 500, 8: 300})  # less at 8 than at 4: nothing per sample
    assert bs.estimate_memory(model, sized(64), objective, FP32, TrainParams(), 64) == bs.MemoryEstimate(784, 500, 0)
    fake_saved(monkeypatch, {4: 10, 8: 110})  # 25 a sample, 10 - 100 per batch: clamped at 0
    assert bs.estimate_memory(model, sized(64), objective, FP32, TrainParams(), 64) == bs.MemoryEstimate(784, 0, 25)


def test_a_real_share_of_one_measures_one_sample() -> None:
    model, data, objective = tiny()
    assert bs.estimate_memory(model, data, objective, FP32, TrainParams(), 1) == bs.MemoryEstimate(784, 0.0, 56.0)
    bf16 = bs.estimate_memory(model, data, objective, Precision("bf16", "cpu"), TrainParams(), 1)
    assert bf16.per_sample != 56.0  # measured under the precision's autocast: other saved tensors


def test_plain_sgd_holds_no_optimizer_state() -> None:
    model, _, _ = tiny()
    assert bs.state_bytes(model, TrainParams(optimizer="sgd", momentum=0.0), Group()) == 0
    assert bs.state_bytes(model, TrainParams(optimizer="sgd", momentum=0.5), Group()) == 196


def test_frozen_parameters_count_as_weights_only() -> None:
    model, data, objective = tiny()
    for q in model[0].parameters():
        q.requires_grad_(False)  # 40 of the 49 parameters frozen: 9 trainable (36 bytes)
    est = bs.estimate_memory(model, data, objective, FP32, TrainParams(), 64)
    assert est.state == 196 + 36 + 2 * 36
    assert bs.state_bytes(model, TrainParams(ema_decay=0.5), Group()) == 3 * 36


def test_probe_batch_takes_the_longest_samples_first_and_repeats() -> None:
    data = sized(5)
    data.lengths = torch.tensor([3, 9, 3, 1, 9])  # type: ignore[attr-defined]
    bs.probe_batch(data, 4)
    bs.probe_batch(data, 12)
    assert data.calls == [[1, 4, 0, 2], [1, 4, 0, 2, 3, 1, 4, 0, 2, 3, 1, 4]]
    plain = sized(3)
    assert bs.probe_batch(plain, 7).size == 7
    bs.probe_batch(plain, 2)
    assert plain.calls == [[0, 1, 2, 0, 1, 2, 0], [0, 1]]
    listed = sized(3)
    listed.lengths = [5, 1, 9]  # type: ignore[attr-defined]  # not a tensor: the first ones
    bs.probe_batch(listed, 2)
    assert listed.calls == [[0, 1]]


def test_probe_batch_hands_the_index_on_the_dataset_s_index_device() -> None:
    class OnMeta:
        index_device = torch.device("meta")  # where batch() wants its index (a GPU's, for data on the GPU)
        devices: list[torch.device] = []

        def __len__(self) -> int:
            return 4

        def batch(self, idx: torch.Tensor) -> Batch:
            self.devices.append(idx.device)
            return Batch({}, torch.zeros(len(idx)), len(idx))

    data: Any = OnMeta()
    assert bs.probe_batch(data, 3).size == 3 and data.devices == [torch.device("meta")]


def test_forward_backward_leaves_the_gradients_of_the_summed_loss() -> None:
    model: Any = Net(nn.Linear(2, 1, bias=False))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0, 2.0]]))
    x, y = torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0.0, 1.0])
    bs.forward_backward(model, Batch({"x": x}, y, 2), Objective("regression"), FP32)
    # out = [1, 2]; summed squared error (1 - 0)^2 + (2 - 1)^2; d/dw = 2 * sum((out - y) * x) = [2, 2]
    assert model[0].weight.grad is not None and model[0].weight.grad.tolist() == [[2.0, 2.0]]


def test_forward_backward_runs_under_the_precision_s_autocast() -> None:
    model: Any = Net(nn.Linear(4, 3))
    seen: list[torch.dtype] = []
    model.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    data = TensorData(torch.randn(4, 4), torch.tensor([0, 1, 2, 0]))
    bs.forward_backward(model, data.batch(torch.arange(4)), Objective("classification"), Precision("bf16", "cpu"))
    assert seen == [torch.bfloat16]


# --- no trace ---------------------------------------------------------------------------------------------------------


def test_untouched_restores_mode_buffers_rng_and_drops_gradients() -> None:
    torch.manual_seed(3)
    model: Any = Net(nn.Linear(2, 3), nn.BatchNorm1d(3)).eval()
    model(torch.randn(4, 2)).sum().backward()  # gradients from before: dropped too (None, not zeros)
    running = model[1].running_mean.clone()
    state = torch.get_rng_state()
    with bs.untouched(model, CPU):
        assert model.training and model[1].training
        model(torch.randn(8, 2) + 5).sum().backward()
        torch.rand(3)
    assert not model.training and not model[1].training
    assert torch.equal(model[1].running_mean, running) and int(model[1].num_batches_tracked) == 0
    assert torch.equal(torch.get_rng_state(), state)
    assert all(q.grad is None for q in model.parameters())
    train = Net(nn.Linear(2, 2)).train()
    with pytest.raises(RuntimeError, match="boom"), bs.untouched(train, CPU):
        train.eval()
        raise RuntimeError("boom")
    assert train.training  # restored on an error too


# --- the CUDA probe, simulated on the CPU -----------------------------------------------------------------------------


class FakeGpu:
    """torch.cuda as CudaProbe reads it, on the CPU: `total` MiB of memory; a model that runs out of memory above
    `capacity` samples and otherwise peaks at `per_sample` MiB a sample."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, capacity: int, total_mib: float = 1000, per_sample: float = 1):
        self.capacity, self.per_sample, self.peak = capacity, per_sample, 0.0
        self.calls: list[str] = []
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: self.calls.append("empty"))
        monkeypatch.setattr(
            torch.cuda, "reset_peak_memory_stats", lambda device=None: self.calls.append(f"reset {device}")
        )
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: self.peak)
        props = type("Props", (), {"total_memory": total_mib * MIB})
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
        monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device=None: torch.zeros(8, dtype=torch.uint8))
        monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device=None: None)

    def model(self) -> nn.Module:
        gpu = self

        class Hungry(nn.Linear):
            def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
                gpu.calls.append(f"forward {len(x)}")
                if len(x) > gpu.capacity:
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
                gpu.peak = len(x) * gpu.per_sample * MIB
                return super().forward(x)

        return Hungry(4, 3)


def data3() -> TensorData:
    return TensorData(torch.randn(64, 4), torch.randint(0, 3, (64,)))


CLS = Objective("classification")


def test_the_probe_limit_is_the_headroom_of_the_gpu_or_a_smaller_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(monkeypatch, capacity=64, total_mib=1000)
    model = gpu.model()
    free = bs.CudaProbe(model, data3(), CLS, FP32, CPU, 8, None)
    assert (free.limit, free.budgeted, free.peaks, free.extra_bytes) == (900 * MIB, False, {}, 8)
    small = bs.CudaProbe(model, data3(), CLS, FP32, CPU, 8, 100.0 * MIB)
    assert (small.limit, small.budgeted) == (100 * MIB, True)
    big = bs.CudaProbe(model, data3(), CLS, FP32, CPU, 8, 2000.0 * MIB)
    assert (big.limit, big.budgeted) == (900 * MIB, False)
    same = bs.CudaProbe(model, data3(), CLS, FP32, CPU, 8, 900.0 * MIB)
    assert (same.limit, same.budgeted) == (900 * MIB, False)


def test_a_probe_empties_the_cache_around_its_run_and_records_its_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(monkeypatch, capacity=10, total_mib=1000, per_sample=2.5)
    model = gpu.model()
    allocated: list[tuple[Any, ...]] = []
    empty = torch.empty

    def recording_empty(*args: Any, **kwargs: Any) -> torch.Tensor:
        allocated.append((args, kwargs))
        return empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", recording_empty)
    probe = bs.CudaProbe(model, data3(), CLS, FP32, CPU, 96, None)
    assert probe.fits(8) is True
    monkeypatch.setattr(torch, "empty", empty)
    assert allocated == [((96,), {"dtype": torch.uint8, "device": CPU})]  # the optimizer state's stand-in
    assert gpu.calls == ["empty", "reset cpu", "forward 8", "empty"]
    assert probe.peaks == {8: 20.0}
    assert all(q.grad is None for q in model.parameters())
    gpu.calls.clear()
    assert probe.fits(16) is False  # out of memory: no peak recorded
    assert gpu.calls == ["empty", "reset cpu", "forward 16", "empty"] and probe.peaks == {8: 20.0}
    assert all(q.grad is None for q in model.parameters())


def test_a_probe_fits_up_to_its_limit_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(monkeypatch, capacity=64, total_mib=1000)
    probe = bs.CudaProbe(gpu.model(), data3(), CLS, FP32, CPU, 8, 6.0 * MIB)
    assert (probe.fits(6), probe.fits(7)) == (True, False)
    assert probe.peaks == {6: 6.0, 7: 7.0}  # the peak of a probe over the limit is recorded too
    assert bs.largest_fitting(48, probe.fits) == 6


REAL_PROBE = bs.CudaProbe


def resolve_on_gpu(monkeypatch: pytest.MonkeyPatch, gpu: FakeGpu, p: TrainParams) -> tuple[TrainParams, Any]:
    class Probe(REAL_PROBE):  # type: ignore[valid-type,misc]  # the real probe, allocating its stand-in on the CPU
        def __init__(self, model: nn.Module, data: Any, objective: Objective, precision: Precision,
                     device: torch.device, extra_bytes: int, budget: float | None) -> None:  # fmt: skip
            assert device.type == "cuda"
            super().__init__(model, data, objective, precision, CPU, extra_bytes, budget)

    monkeypatch.setattr(bs, "CudaProbe", Probe)
    model = gpu.model()
    moved: list[torch.device] = []

    def to(device: torch.device) -> nn.Module:
        moved.append(device)
        return model

    monkeypatch.setattr(model, "to", to)
    out = bs.resolve(p, model, data3(), CLS, FP32, torch.device("cuda"), Group())
    assert moved == [torch.device("cuda")]
    return out


def test_on_a_gpu_the_largest_divisor_that_does_not_run_out_of_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(monkeypatch, capacity=10, total_mib=1000)
    resolved, choice = resolve_on_gpu(monkeypatch, gpu, TrainParams(batch_size="auto", global_batch=48))
    assert choice == bs.Choice(8, 6, 48, 1, "GPU memory 900 MiB", None, 8.0)
    assert (resolved.batch_size, resolved.accumulate) == (8, 6)
    # the probes 48, 6, 12, 8 (divisors 1 2 3 4 6 8 12 16 24 48), then the peak statistics reset for training
    forwards = [c for c in gpu.calls if c.startswith("forward")]
    assert forwards == ["forward 48", "forward 6", "forward 12", "forward 8"]
    assert gpu.calls[-1] == "reset cuda"


def test_on_a_gpu_a_budget_names_itself_as_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(monkeypatch, capacity=64, total_mib=1000, per_sample=0.5)
    p = TrainParams(batch_size="auto", global_batch=48, memory_budget_mb=5.0)
    _, choice = resolve_on_gpu(monkeypatch, gpu, p)
    assert choice == bs.Choice(8, 6, 48, 1, "GPU memory 5 MiB (memory budget)", None, 4.0)


def test_on_a_gpu_nothing_fitting_is_refused_by_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(monkeypatch, capacity=0, total_mib=1000)
    with pytest.raises(UserError) as oom:
        resolve_on_gpu(monkeypatch, gpu, TrainParams(batch_size="auto", global_batch=4, memory_budget_mb=1.0))
    assert str(oom.value).startswith("train: batch_size auto: not even one sample fits in GPU memory")
    assert gpu.calls[-1] == "reset cuda"
    over = FakeGpu(monkeypatch, capacity=64, total_mib=1000, per_sample=3.0)
    with pytest.raises(ParamsError) as budget:
        resolve_on_gpu(monkeypatch, over, TrainParams(batch_size="auto", global_batch=4, memory_budget_mb=2.0))
    assert budget.value.problems[0][1].startswith(
        "2 MiB is too little for batch_size auto: one sample's probe peaked at 3 MiB"
    )  # the peak at 1, the last size probed


# --- models: build_model and the user's models ------------------------------------------------------------------------


def test_the_mlp_is_linear_gelu_dropout_per_hidden_layer_then_a_head() -> None:
    from trainflow.models import MLP

    model = MLP(5, 3, [7, 4], 0.25)
    layers = list(model.net)
    assert [type(m) for m in layers] == [nn.Linear, nn.GELU, nn.Dropout, nn.Linear, nn.GELU, nn.Dropout, nn.Linear]
    shapes = [(m.in_features, m.out_features) for m in layers if isinstance(m, nn.Linear)]
    assert shapes == [(5, 7), (7, 4), (4, 3)]
    assert [m.p for m in layers if isinstance(m, nn.Dropout)] == [0.25, 0.25]
    x = torch.randn(2, 5)
    model.eval()
    l1, l2, l3 = (m for m in layers if isinstance(m, nn.Linear))
    expected = l3(F.gelu(l2(F.gelu(l1(x)))))
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    bare = MLP(3, 2, [], 0.0)
    assert [type(m) for m in bare.net] == [nn.Linear] and (bare.net[0].in_features, bare.net[0].out_features) == (3, 2)


def test_model_class_names_the_built_in_models() -> None:
    from trainflow.models import MLP, model_class
    from trainflow.models.cnn import CNN
    from trainflow.models.hf import HFSequenceModel
    from trainflow.models.text import TextTransformer

    assert model_class("mlp") is MLP
    assert model_class("text_transformer") is TextTransformer
    assert model_class("cnn") is CNN
    assert model_class("hf") is HFSequenceModel
    assert model_class("torch.nn:Linear") is nn.Linear


def test_model_class_refusals_in_full() -> None:
    from trainflow.models import model_class

    with pytest.raises(UserError) as missing:
        model_class("nosuchpackage_xyz.models:Net")
    assert str(missing.value) == (
        "model.name 'nosuchpackage_xyz.models:Net': cannot import it (No module named 'nosuchpackage_xyz'); is the "
        "package installed?"
    )
    assert missing.value.__cause__ is None and missing.value.__suppress_context__
    with pytest.raises(UserError) as no_attr:
        model_class("torch.nn:Nope")
    assert str(no_attr.value) == (
        "model.name 'torch.nn:Nope': cannot import it (module 'torch.nn' has no attribute 'Nope'); is the package "
        "installed?"
    )
    with pytest.raises(UserError) as not_module:
        model_class("collections:OrderedDict")
    assert str(not_module.value) == "model.name 'collections:OrderedDict' is not a torch.nn.Module subclass"
    with pytest.raises(UserError) as not_class:
        model_class("math:pi")
    assert str(not_class.value) == "model.name 'math:pi' is not a torch.nn.Module subclass"


def test_build_model_passes_the_data_sizes_only_to_constructors_that_take_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainflow.models import MLP, build_model

    config = {"name": "mlp", "in_features": 3, "out_features": 2, "hidden_sizes": [4], "dropout": 0.0,
              "vocab_size": 99, "pad_id": 0, "in_channels": 3, "image_size": [8, 8]}  # fmt: skip
    model = build_model(config)
    assert type(model) is MLP and config["name"] == "mlp"  # the config is left as it was
    assert [(m.in_features, m.out_features) for m in model.net if isinstance(m, nn.Linear)] == [(3, 4), (4, 2)]
    pkg = tmp_path / "usermods_exact"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        textwrap.dedent("""
        from torch import nn

        class Loose(nn.Module):
            def __init__(self, **kwargs):
                super().__init__()
                self.kwargs = kwargs

        class Strict(nn.Module):
            def __init__(self, in_features, width):
                super().__init__()
                self.args = (in_features, width)
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    loose = build_model({"name": "usermods_exact:Loose", "in_features": 3, "vocab_size": 9, "x": 1})
    assert loose.kwargs == {"in_features": 3, "vocab_size": 9, "x": 1}  # type: ignore[attr-defined]
    strict = build_model({"name": "usermods_exact:Strict", "in_features": 3, "out_features": 2, "width": 5})
    assert strict.args == (3, 5)  # type: ignore[attr-defined]
    with pytest.raises(UserError) as bad:
        build_model({"name": "usermods_exact:Strict", "in_features": 3, "widht": 5})
    assert str(bad.value) == (
        "model 'usermods_exact:Strict': cannot build it with {'in_features': 3, 'widht': 5} "
        "(Strict.__init__() got an unexpected keyword argument 'widht'); see model.kwargs"
    )
    assert bad.value.__suppress_context__


def write_package(root: Path, name: str) -> Path:
    pkg = root / name
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__pycache__").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "net.py").write_text(
        "from torch import nn\n\n\nclass Net(nn.Linear):\n    def __init__(self):\n        super().__init__(2, 2)\n"
    )
    (pkg / "__pycache__" / "junk.py").write_text("x = 1\n")
    (pkg / "notes.txt").write_text("not python\n")
    return pkg


def by_hand(files: list[Path], base: Path) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(base).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def test_source_files_and_their_hash(tmp_path: Path) -> None:
    from trainflow.models import source_files, source_hash

    pkg = write_package(tmp_path, "pkg_exact")
    files = source_files(pkg)
    assert files == [pkg / "__init__.py", pkg / "sub" / "__init__.py", pkg / "sub" / "net.py"]
    assert source_files(pkg / "notes.txt") == [pkg / "notes.txt"]
    expected = hashlib.sha256(
        b"pkg_exact/__init__.py\0" + b"pkg_exact/sub/__init__.py\0" + b"pkg_exact/sub/net.py\0"
        + (pkg / "sub" / "net.py").read_bytes()
    ).hexdigest()  # fmt: skip
    assert source_hash(files, tmp_path) == expected
    assert source_hash([], tmp_path) == hashlib.sha256().hexdigest()


def test_user_source_of_a_packaged_and_of_a_single_module_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainflow.models import MLP, user_source

    pkg = write_package(tmp_path, "pkg_user_exact")
    (tmp_path / "single_exact.py").write_text(
        "from torch import nn\n\n\nclass One(nn.Linear):\n    def __init__(self):\n        super().__init__(1, 1)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from pkg_user_exact.sub.net import Net as PackagedNet  # type: ignore[import-not-found]
    from single_exact import One  # type: ignore[import-not-found]

    try:
        got = user_source(PackagedNet())
        assert got == {
            "module": "pkg_user_exact.sub.net",
            "source": str(pkg.resolve()),
            "sha256": by_hand([pkg / "__init__.py", pkg / "sub" / "__init__.py", pkg / "sub" / "net.py"], tmp_path),
            "file": str((pkg / "sub" / "net.py").resolve()),
        }
        single = (tmp_path / "single_exact.py").resolve()
        assert user_source(One()) == {
            "module": "single_exact",
            "source": str(single),
            "sha256": by_hand([single], single.parent),
            "file": str(single),
        }
        assert user_source(MLP(1, 1, [], 0.0)) is None
    finally:
        for name in [m for m in sys.modules if m.startswith(("pkg_user_exact", "single_exact"))]:
            del sys.modules[name]


# --- models: cnn ------------------------------------------------------------------------------------------------------


def test_the_cnn_layers_by_hand() -> None:
    from trainflow.models.cnn import CNN, Block

    model: Any = CNN(3, 5, [4, 16], blocks=2, norm="group", image_size=(9, 7))  # type: ignore[arg-type]
    assert model.image_size == [9, 7]
    conv, norm, relu = model.stem
    assert (conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, conv.bias) == (
        3, 4, (3, 3), (1, 1), (1, 1), None
    )  # fmt: skip
    assert type(norm) is nn.GroupNorm and (norm.num_groups, norm.num_channels) == (4, 4) and type(relu) is nn.ReLU
    blocks = list(model.blocks)
    assert all(type(b) is Block for b in blocks) and len(blocks) == 4
    shapes = [(b.conv1.in_channels, b.conv1.out_channels, b.conv1.stride[0]) for b in blocks]
    assert shapes == [(4, 4, 1), (4, 4, 1), (4, 16, 2), (16, 16, 1)]
    for b in blocks:
        assert (b.conv1.kernel_size, b.conv1.padding, b.conv1.bias) == ((3, 3), (1, 1), None)
        assert (b.conv2.kernel_size, b.conv2.stride, b.conv2.padding, b.conv2.bias) == ((3, 3), (1, 1), (1, 1), None)
        assert b.conv2.in_channels == b.conv2.out_channels == b.conv1.out_channels
        assert type(b.norm1) is type(b.norm2) is nn.GroupNorm and type(b.relu) is nn.ReLU
        assert b.norm1.num_groups == min(8, b.conv1.out_channels) and b.norm1.num_channels == b.conv1.out_channels
        assert b.norm2.weight.abs().sum() == 0  # each block starts as the identity
        assert b.norm1.weight.abs().sum() == b.conv1.out_channels  # the first norm as usual: ones
    assert [type(b.skip) for b in blocks] == [nn.Identity, nn.Identity, nn.Sequential, nn.Identity]
    proj, proj_norm = blocks[2].skip
    assert (proj.in_channels, proj.out_channels, proj.kernel_size, proj.stride, proj.bias) == (4, 16, (1, 1), (2, 2),
                                                                                               None)  # fmt: skip
    assert type(proj_norm) is nn.GroupNorm and (proj_norm.num_groups, proj_norm.num_channels) == (8, 16)
    assert (model.head.in_features, model.head.out_features) == (16, 5)
    batch: Any = CNN(1, 2, [8])
    assert type(batch.stem[1]) is nn.BatchNorm2d and batch.stem[1].num_features == 8 and batch.image_size is None
    assert len(batch.blocks) == 1 and type(batch.blocks[0].norm1) is nn.BatchNorm2d
    widen: Any = Block(4, 6, 1, "batch")
    assert type(widen.skip) is nn.Sequential and widen.skip[0].stride == (1, 1)  # a wider block projects its skip


def test_a_block_and_the_cnn_compute_their_function() -> None:
    from trainflow.models.cnn import CNN, Block

    torch.manual_seed(0)
    block: Any = Block(2, 3, 2, "group").eval()
    for q in block.parameters():
        nn.init.normal_(q)
    x = torch.randn(2, 2, 5, 4)
    conv1, conv2, proj = block.conv1.weight, block.conv2.weight, block.skip[0].weight
    n1, n2, n3 = block.norm1, block.norm2, block.skip[1]

    def gn(t: torch.Tensor, norm: Any) -> torch.Tensor:
        return F.group_norm(t, 3, norm.weight, norm.bias, 1e-5)

    out = F.relu(gn(F.conv2d(x, conv1, stride=2, padding=1), n1))
    out = gn(F.conv2d(out, conv2, padding=1), n2)
    expected = F.relu(out + gn(F.conv2d(x, proj, stride=2), n3))
    torch.testing.assert_close(block(x), expected, rtol=1e-5, atol=1e-5)

    model: Any = CNN(2, 3, [3], norm="group").eval()
    for q in model.parameters():
        nn.init.normal_(q)
    stem = F.relu(F.group_norm(F.conv2d(x, model.stem[0].weight, padding=1), 3, model.stem[1].weight,
                               model.stem[1].bias, 1e-5))  # fmt: skip
    pooled = model.blocks(stem).mean(dim=(2, 3))
    torch.testing.assert_close(model(images=x), pooled @ model.head.weight.T + model.head.bias, rtol=1e-5, atol=1e-5)


def test_cnn_flops_by_hand() -> None:
    from trainflow.models.cnn import CNN, _conv_macs

    model = CNN(3, 10, [8, 16], blocks=2, image_size=[31, 30])
    stem = 31 * 30 * 8 * 3 * 9
    first = 2 * (2 * 31 * 30 * 8 * 8 * 9)  # two blocks of two 3x3 convs, 8 -> 8, full size
    down = 16 * 15 * (16 * 8 * 9 + 16 * 16 * 9 + 16 * 8)  # ceil(31 / 2) x ceil(30 / 2); the 1x1 skip
    second = 16 * 15 * 2 * 16 * 16 * 9
    assert model.flops_per_sample() == 6.0 * (stem + first + down + second + 16 * 10)
    assert type(model.flops_per_sample()) is float
    assert CNN(3, 10, [8]).flops_per_sample() is None
    assert _conv_macs(nn.Conv2d(8, 16, 3, groups=4), 5, 6) == 5 * 6 * 16 * 2 * 9
    assert _conv_macs(nn.Conv2d(3, 4, (1, 3)), 2, 2) == 2 * 2 * 4 * 3 * 3


# --- models: text -----------------------------------------------------------------------------------------------------


def text_model(**kwargs: Any) -> Any:
    from trainflow.models.text import TextTransformer

    torch.manual_seed(0)
    config: dict[str, Any] = dict(vocab_size=11, out_features=3, d_model=8, n_heads=2, n_layers=2, ff_mult=2,
                                  max_len=6, dropout=0.0)  # fmt: skip
    return TextTransformer(**{**config, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"head": "pooled"}, "head must be one of ('sequence', 'token'), got 'pooled'"),
        ({"d_model": 10, "n_heads": 4}, "d_model (10) must be a positive multiple of n_heads (4)"),
        ({"n_heads": 0}, "d_model (8) must be a positive multiple of n_heads (0)"),
        ({"n_heads": -2}, "d_model (8) must be a positive multiple of n_heads (-2)"),
        ({"vocab_size": 0, "pad_id": 0}, "vocab_size must be >= 1, got 0"),
        ({"out_features": 0}, "out_features must be >= 1, got 0"),
        ({"d_model": 0}, "d_model must be >= 1, got 0"),
        ({"n_layers": 0}, "n_layers must be >= 1, got 0"),
        ({"ff_mult": 0}, "ff_mult must be >= 1, got 0"),
        ({"max_len": 0}, "max_len must be >= 1, got 0"),
        ({"dropout": 1.0}, "dropout must be in [0, 1), got 1.0"),
        ({"dropout": -0.1}, "dropout must be in [0, 1), got -0.1"),
        ({"pad_id": 11}, "pad_id (11) must be a token id in [0, vocab_size=11)"),
        ({"pad_id": -1}, "pad_id (-1) must be a token id in [0, vocab_size=11)"),
    ],
)
def test_text_transformer_refusals_in_full(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as exc:
        text_model(**kwargs)
    assert str(exc.value) == message


def test_text_transformer_smallest_valid_settings() -> None:
    model = text_model(vocab_size=1, out_features=1, d_model=1, n_heads=1, n_layers=1, ff_mult=1, max_len=1,
                       dropout=0.0, pad_id=0, head="token")  # fmt: skip
    assert model(torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.bool)).shape == (2, 1, 1)
    text_model(dropout=0.99, pad_id=10)


def test_text_transformer_keeps_its_settings_and_layers() -> None:
    model = text_model(pad_id=3, dropout=0.2, head="token")
    assert (model.vocab_size, model.out_features, model.d_model, model.n_heads, model.n_layers, model.max_len,
            model.pad_id, model.head_kind, model.checkpointing, model.num_layers) == (11, 3, 8, 2, 2, 6, 3, "token",
                                                                                    False, 2)  # fmt: skip
    assert model.tok_emb.weight.shape == (11, 8) and model.tok_emb.padding_idx == 3
    assert model.tok_emb.weight[3].abs().sum() == 0
    assert model.pos_emb.weight.shape == (6, 8) and model.emb_dropout.p == 0.2
    assert len(model.blocks) == 2 and model.ln_f.normalized_shape == (8,)
    assert (model.head.in_features, model.head.out_features) == (8, 3)
    block = model.blocks[0]
    assert block.attn.n_heads == 2 and block.attn.dropout == 0.2
    assert (block.attn.qkv.in_features, block.attn.qkv.out_features) == (8, 24)
    assert (block.attn.proj.in_features, block.attn.proj.out_features) == (8, 8)
    fc1, gelu, drop1, fc2, drop2 = block.mlp
    assert (fc1.in_features, fc1.out_features, fc2.in_features, fc2.out_features) == (8, 16, 16, 8)
    assert type(gelu) is nn.GELU and (drop1.p, drop2.p) == (0.2, 0.2)
    assert block.ln1.normalized_shape == block.ln2.normalized_shape == (8,)
    model.activation_checkpointing(True)
    assert model.checkpointing is True
    model.activation_checkpointing(False)
    assert model.checkpointing is False


def test_text_transformer_defaults() -> None:
    from trainflow.models.text import TextTransformer

    model = TextTransformer(vocab_size=5, out_features=2)
    assert (model.d_model, model.n_heads, model.n_layers, model.max_len, model.pad_id, model.head_kind) == (
        128, 4, 2, 256, 0, "sequence"
    )  # fmt: skip
    assert model.blocks[0].mlp[0].out_features == 4 * 128 and model.emb_dropout.p == 0.1
    assert model.blocks[0].attn.dropout == 0.1 and model.tok_emb.padding_idx == 0


def test_cnn_defaults_one_block_a_stage_and_batch_norm() -> None:
    from trainflow.models.cnn import CNN

    model: Any = CNN(3, 2, [4, 8])
    assert len(model.blocks) == 2 and model.image_size is None
    assert type(model.stem[1]) is nn.BatchNorm2d and type(model.blocks[1].norm2) is nn.BatchNorm2d


def reference_forward(model: Any, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The encoder written out with plain tensor ops, from the model's weights (eval: no dropout)."""
    n, length = tokens.shape
    d, heads = model.d_model, model.n_heads
    dh = d // heads
    x = model.tok_emb.weight[tokens] + model.pos_emb.weight[:length][None]
    for block in model.blocks:
        h = F.layer_norm(x, (d,), block.ln1.weight, block.ln1.bias)
        qkv = h @ block.attn.qkv.weight.T + block.attn.qkv.bias
        q, k, v = (qkv[..., i * d : (i + 1) * d].reshape(n, length, heads, dh).transpose(1, 2) for i in range(3))
        scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(n, length, d)
        x = x + attended @ block.attn.proj.weight.T + block.attn.proj.bias
        h = F.layer_norm(x, (d,), block.ln2.weight, block.ln2.bias)
        fc1, _, _, fc2, _ = block.mlp
        x = x + F.gelu(h @ fc1.weight.T + fc1.bias) @ fc2.weight.T + fc2.bias
    x = F.layer_norm(x, (d,), model.ln_f.weight, model.ln_f.bias)
    if model.head_kind == "token":
        return x @ model.head.weight.T + model.head.bias
    pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    return pooled @ model.head.weight.T + model.head.bias


TOKENS = torch.tensor([[4, 7, 1, 9, 0], [2, 2, 0, 0, 0], [10, 3, 5, 6, 8]])
MASK = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)


@pytest.mark.parametrize("head", ["sequence", "token"])
def test_text_transformer_forward_against_a_reference(head: str) -> None:
    model = text_model(head=head, dropout=0.1).eval()
    for name, q in model.named_parameters():
        if "ln" not in name:
            nn.init.normal_(q, std=0.5)
    with torch.no_grad():
        got = model(TOKENS, MASK.long())  # a 0/1 mask works as the booleans
        expected = reference_forward(model, TOKENS, MASK)
    assert got.shape == ((3, 3) if head == "sequence" else (3, 5, 3))
    if head == "token":
        got, expected = got[MASK], expected[MASK]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_text_transformer_input_refusals_in_full() -> None:
    model = text_model()
    with pytest.raises(ValueError) as dims:
        model(torch.zeros(2, 3, 1, dtype=torch.long), torch.ones(2, 3, 1, dtype=torch.bool))
    assert str(dims.value) == "tokens must be [N, L], got shape (2, 3, 1)"
    with pytest.raises(ValueError) as shape:
        model(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 4, dtype=torch.bool))
    assert str(shape.value) == "mask shape (2, 4) must equal tokens shape (2, 3)"
    with pytest.raises(ValueError) as long:
        model(torch.zeros(1, 7, dtype=torch.long), torch.ones(1, 7, dtype=torch.bool))
    assert str(long.value) == "sequence length 7 exceeds max_len=6"
    assert model(torch.zeros(1, 6, dtype=torch.long), torch.ones(1, 6, dtype=torch.bool)).shape == (1, 3)


def test_attention_dropout_only_in_training(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainflow.models import text

    seen: list[float] = []
    real = F.scaled_dot_product_attention

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append(kwargs["dropout_p"])
        return real(*args, **kwargs)

    monkeypatch.setattr(text.F, "scaled_dot_product_attention", spy)
    model = text_model(dropout=0.3, n_layers=1)
    model.train()(TOKENS, MASK)
    model.eval()(TOKENS, MASK)
    assert seen == [0.3, 0.0]


def test_blocks_are_checkpointed_only_when_asked_training_and_with_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainflow.models import text

    calls: list[bool] = []
    real = text.checkpoint

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["use_reentrant"])
        return real(*args, **kwargs)

    monkeypatch.setattr(text, "checkpoint", spy)
    model = text_model()
    plain = model.train()(TOKENS, MASK)
    assert calls == []
    model.activation_checkpointing(True)
    checkpointed = model(TOKENS, MASK)
    assert calls == [False, False]  # each of the 2 blocks, non-reentrant
    torch.testing.assert_close(checkpointed, plain, rtol=0, atol=0)
    with torch.no_grad():
        model(TOKENS, MASK)
    model.eval()(TOKENS, MASK)
    assert calls == [False, False]


def test_layer_of_numbers_embeddings_blocks_and_the_rest() -> None:
    model = text_model(n_layers=3)
    layers = {name: model.layer_of(name) for name, _ in model.named_parameters()}
    assert layers["tok_emb.weight"] == 0 and layers["pos_emb.weight"] == 0
    assert layers["blocks.0.attn.qkv.weight"] == 1 and layers["blocks.2.mlp.3.bias"] == 3
    assert layers["ln_f.weight"] == 4 and layers["head.bias"] == 4
    assert model.layer_of("tok_embx") == 4 and model.layer_of("blocks.10.x") == 11


def test_text_flops_by_hand() -> None:
    # d 8, ff 16, out 3, 2 layers: per block ln 16 + qkv 216 + proj 72 + ln 16 + fc1 144 + fc2 136 = 600;
    # ln_f 16, head 27: 1243 outside the embeddings (11 x 8 tokens, 6 x 8 positions).
    model = text_model()
    assert model.non_embedding_params() == 1243
    assert model.flops_per_token(4) == 6.0 * 1243 + 12 * 2 * 8 * 4
    assert type(model.flops_per_token(4)) is float


# --- models: hf (tiny random configs built here; nothing downloaded) -------------------------------------------------


def bert_config(**kwargs: Any) -> Any:
    from transformers import BertConfig

    settings = dict(vocab_size=20, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16,
                    max_position_embeddings=16)  # fmt: skip
    return BertConfig(**{**settings, **kwargs})


def test_hf_names_and_local_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    from trainflow.models import hf

    assert hf.is_hf("hf:x") and not hf.is_hf("mlp") and not hf.is_hf("xhf:y") and not hf.is_hf("HF:x")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert hf.resolve("hf: m ", tmp_path) == (tmp_path / "m").resolve()
    assert hf.resolve(f"hf:{tmp_path / 'm'}", Path("/nonexistent")) == (tmp_path / "m").resolve()
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hf.resolve("hf:~/m", Path("/nonexistent")) == (tmp_path / "m").resolve()
    (tmp_path / "half").mkdir()
    with pytest.raises(UserError) as half:
        hf.resolve("hf:half", tmp_path)
    assert str(half.value) == (
        f"model.name hf:half: {(tmp_path / 'half').resolve()} has no config.json; give the directory that "
        "save_pretrained(...) wrote (the model and its tokenizer), e.g. model.save_pretrained(dir) and "
        "tokenizer.save_pretrained(dir)"
    )
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(UserError) as missing:
        hf.resolve("hf:org/none", tmp_path)
    assert str(missing.value) == (
        f"model.name hf:org/none: no directory {(tmp_path / 'org/none').resolve()}, and no model 'org/none' in the "
        f"local Hugging Face cache ({tmp_path / 'hub'}); trainflow downloads nothing. On a machine with internet, "
        "save it with `hf download org/none` (into the cache; copy the cache here) or with "
        "AutoModelForSequenceClassification.from_pretrained('org/none').save_pretrained(dir) and "
        "AutoTokenizer.from_pretrained('org/none').save_pretrained(dir), then set model.name: hf:dir"
    )
    assert missing.value.__suppress_context__


def test_the_directory_hash_covers_visible_files_names_and_bytes(tmp_path: Path) -> None:
    from trainflow.models import hf

    d = tmp_path / "model"
    (d / "sub").mkdir(parents=True)
    (d / ".cache").mkdir()
    (d / "b.json").write_bytes(b"{}")
    (d / "a.bin").write_bytes(bytes(range(256)) * 5000)  # over 1 MiB: read in chunks
    (d / "sub" / "c.txt").write_text("c")
    (d / ".hidden").write_text("h")
    (d / ".cache" / "x").write_text("x")
    expected = hashlib.sha256(b"a.bin\0" + bytes(range(256)) * 5000 + b"b.json\0{}" + b"sub/c.txt\0c").hexdigest()
    assert hf.directory_hash(d) == expected
    (d / ".hidden").write_text("changed")
    assert hf.directory_hash(d) == expected
    (d / "sub" / "c.txt").write_text("d")
    assert (
        hf.directory_hash(d)
        == hashlib.sha256(b"a.bin\0" + bytes(range(256)) * 5000 + b"b.json\0{}" + b"sub/c.txt\0d").hexdigest()
    )


def test_quiet_silences_transformers_and_restores_its_level() -> None:
    from transformers.utils import logging

    from trainflow.models import hf

    before = logging.get_verbosity()
    logging.set_verbosity_info()
    try:
        with hf._quiet():
            assert logging.get_verbosity() == logging.ERROR
        assert logging.get_verbosity() == logging.INFO
        with pytest.raises(KeyError), hf._quiet():
            raise KeyError("x")
        assert logging.get_verbosity() == logging.INFO
    finally:
        logging.set_verbosity(before)


def test_the_config_takes_the_task_s_outputs_and_labels(tmp_path: Path) -> None:
    from trainflow.models import hf

    bert_config().save_pretrained(tmp_path)
    got = hf.config(tmp_path, ["neg", "pos", "mixed"], 3, 16)["hf_config"]
    assert got["id2label"] == {"0": "neg", "1": "pos", "2": "mixed"}
    assert got["label2id"] == {"neg": 0, "pos": 1, "mixed": 2}
    assert got["hidden_size"] == 8 and got["num_hidden_layers"] == 2 and got["model_type"] == "bert"
    regression = hf.config(tmp_path, [], 1, 5)["hf_config"]
    assert regression["id2label"] == {"0": "value"} and regression["label2id"] == {"value": 0}
    with pytest.raises(UserError) as long:
        hf.config(tmp_path, ["a", "b"], 2, 17)
    assert str(long.value) == (
        f"features.max_length is 17 but {tmp_path} takes at most 16 tokens per sequence (max_position_embeddings); "
        "set features.max_length <= 16"
    )


def test_the_tokenizer_truncates_pads_nothing_and_names_its_pad_id(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from trainflow.models import hf

    vocab = {w: i for i, w in enumerate(["a", "b", "c", "<unk>", "<pad>"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>").save_pretrained(tmp_path / "p")
    bert_config().save_pretrained(tmp_path / "p")
    encoder, pad = hf.tokenizer(tmp_path / "p", 3)
    assert pad == 4
    assert encoder.encode("a b c a b").ids == [0, 1, 2]
    assert encoder.encode("b").ids == [1] and encoder.padding is None
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(tmp_path / "n")
    bert_config().save_pretrained(tmp_path / "n")
    assert hf.tokenizer(tmp_path / "n", 8)[1] == 0  # no pad token: 0


def test_a_model_from_its_config_alone_knows_its_kind() -> None:
    from transformers import GPT2Config, masking_utils

    from trainflow.models import hf

    bert = hf.HFSequenceModel(3, bert_config().to_dict())
    assert (bert.out_features, bert.num_layers, bert.hidden_size, bert.decoder, bert.sliding_window) == (
        3, 2, 8, False, None
    )  # fmt: skip
    assert bert.mask_function is masking_utils.bidirectional_mask_function
    assert bert.model.config.num_labels == 3
    assert all(q.dtype == torch.float32 for q in bert.parameters())
    gpt = hf.HFSequenceModel(2, GPT2Config(vocab_size=20, n_embd=8, n_layer=3, n_head=2, n_positions=16).to_dict())
    assert (gpt.num_layers, gpt.hidden_size, gpt.decoder) == (3, 8, True)
    assert gpt.mask_function is masking_utils.causal_mask_function
    mask = torch.tensor([[True, True, False]])
    assert gpt._attention_mask(mask).tolist() == [[[[True, False, False], [True, True, False], [True, True, False]]]]
    assert bert._attention_mask(mask).tolist() == [[[[True, True, False]] * 3]]
    bert.model.config._attn_implementation = "flash_attention_2"  # another mask kind: the 2-D mask as it is
    assert bert._attention_mask(mask) is mask


def test_a_decoder_reads_the_score_at_its_last_real_token() -> None:
    from transformers import GPT2Config

    from trainflow.models import hf

    torch.manual_seed(0)
    gpt = hf.HFSequenceModel(2, GPT2Config(vocab_size=20, n_embd=8, n_layer=1, n_head=2, n_positions=16).to_dict())
    gpt.eval()
    tokens = torch.tensor([[3, 4, 5, 0], [6, 7, 0, 0]])
    mask = tokens > 0
    with torch.no_grad():
        got = gpt(tokens, mask)
        expected = [gpt.model.score(gpt.model.transformer(input_ids=tokens[i : i + 1, :n]).last_hidden_state[0, -1])
                    for i, n in enumerate((3, 2))]  # fmt: skip
    torch.testing.assert_close(got, torch.stack(expected), rtol=1e-5, atol=1e-6)


def test_layer_of_reads_the_numbered_layers_of_each_family() -> None:
    from trainflow.models import hf

    model = hf.HFSequenceModel(2, bert_config().to_dict())
    cases = {
        "model.bert.embeddings.word_embeddings.weight": 0,
        "model.model.embed_tokens.weight": 0,
        "model.transformer.wte.weight": 0,
        "model.transformer.wpe.weight": 0,
        "model.bert.encoder.layer.0.output.dense.bias": 1,
        "model.model.layers.4.mlp.up_proj.weight": 5,
        "model.transformer.h.12.attn.c_attn.weight": 13,
        "model.encoder.block.1.layer.0.SelfAttention.q.weight": 2,
        "model.x.blocks.7.y": 8,
        "model.transformer.ln_f.weight": 3,
        "model.classifier.weight": 3,
        "model.x.layer.3": 3,  # no dot after the number: not a layer
        "layer.3.x": 3,  # no dot before "layer"
    }
    assert {name: model.layer_of(name) for name in cases} == cases


def test_hf_flops_count_what_is_outside_the_embeddings() -> None:
    from trainflow.models import hf

    model = hf.HFSequenceModel(2, bert_config().to_dict())
    # BERT, hidden 8, intermediate 16, 2 layers: per layer q, k, v, out 4 x (64 + 8), norms 2 x 16, intermediate
    # 8 x 16 + 16, output 16 x 8 + 8: 288 + 32 + 144 + 136 = 600; pooler 72, classifier 8 x 2 + 2 = 18.
    assert model.flops_per_token(5) == 6.0 * (2 * 600 + 72 + 18) + 12 * 2 * 8 * 5
    assert type(model.flops_per_token(5)) is float


def test_activation_checkpointing_on_off_and_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainflow.models import hf

    model = hf.HFSequenceModel(2, bert_config().to_dict())
    newer = hasattr(type(model.model), "is_activation_checkpointing")  # Transformers 5's name

    def checkpointing() -> bool:
        return bool(model.model.is_activation_checkpointing if newer else model.model.is_gradient_checkpointing)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Transformers 5's own names: the old gradient_checkpointing_* ones warn
        model.activation_checkpointing(True)
        assert checkpointing()
        assert model.model.bert._gradient_checkpointing_func.keywords == {"use_reentrant": False}  # keeps RNG state
        model.activation_checkpointing(False)
        assert not checkpointing()
    monkeypatch.setattr(type(model.model), "supports_gradient_checkpointing", False)
    with pytest.raises(UserError) as exc:
        model.activation_checkpointing(True)
    assert str(exc.value) == "BertForSequenceClassification does not support activation checkpointing"
    model.activation_checkpointing(False)
