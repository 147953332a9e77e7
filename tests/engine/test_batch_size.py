"""train.batch_size auto: the search, the CPU memory estimate, the validation, and the acceptance contract — auto trains
the same weights as the fixed split of the same global batch, and the memory budget is what picks the split. Pinned
exactly (issue 24): the sizes the search probes and the one it picks (with out-of-memory simulated above a threshold),
the words of every choice and refusal, the CPU estimate's arithmetic and the probes' no-trace guarantees."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from support.nets import Net
from support.projects import REPO, make_project
from support.stages import fingerprint_of, training
from torch import nn

from trainflow.core.errors import ParamsError, UserError
from trainflow.engine import batch_size as bs
from trainflow.engine.batch_size import Choice
from trainflow.engine.distributed import Group
from trainflow.engine.loaders import Batch, TensorData
from trainflow.engine.objective import Objective
from trainflow.engine.precision import Precision
from trainflow.params import PipelineParams, TrainParams, with_values
from trainflow.stages.train import Setup

FP32 = Precision("fp32", "cpu")
CPU = torch.device("cpu")


def brute_force(total: int, limit: int) -> int | None:
    fitting = [d for d in range(1, total + 1) if total % d == 0 and d <= limit]
    return max(fitting) if fitting else None


@pytest.mark.parametrize("total", [1, 2, 12, 32, 36, 97, 360])
def test_search_finds_the_largest_divisor_that_fits_in_few_probes(total: int) -> None:
    for limit in range(0, total + 2):
        probed: list[int] = []

        def fits(b: int, limit: int = limit, probed: list[int] = probed) -> bool:
            probed.append(b)
            return b <= limit

        assert bs.largest_fitting(total, fits) == brute_force(total, limit), (total, limit)
        assert all(total % b == 0 for b in probed), probed  # only sizes that split the share exactly
        n_divisors = len(bs.divisors(total))
        assert len(probed) <= 2 + math.ceil(math.log2(n_divisors)), (total, limit, probed)


def test_divisors() -> None:
    assert bs.divisors(1) == [1]
    assert bs.divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]
    assert bs.divisors(97) == [1, 97]


def tiny_regression() -> tuple[nn.Module, TensorData, Objective]:
    torch.manual_seed(0)
    model = Net(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    data = TensorData(torch.randn(64, 4), torch.randn(64))
    return model, data, Objective("regression")


def test_the_cpu_estimate_counts_state_and_saved_activations_by_hand() -> None:
    """Linear(4, 8) -> ReLU -> Linear(8, 1), squared error, fp32, adamw. Per sample autograd keeps: the input row
    (4 floats) for the first matmul, ReLU's output (8 floats, also the second matmul's input: one storage), the
    output (1 float) and the target (1 float) for the loss: 14 floats = 56 bytes. The weights it also saves are
    state: 49 parameters x 4 bytes, as many gradients, and adamw's two moments: 4 x 196 = 784 bytes."""
    model, data, objective = tiny_regression()
    est = bs.estimate_memory(model, data, objective, FP32, TrainParams(), share=64)
    assert est.state == 784
    assert est.per_sample == 56
    assert est.fixed == 0
    sgd = bs.estimate_memory(model, data, objective, FP32, TrainParams(optimizer="sgd", momentum=0.9), share=64)
    assert sgd.state == 3 * 196  # one momentum buffer
    assert bs.estimate_memory(model, data, objective, FP32, TrainParams(ema_decay=0.9), share=64).state == 5 * 196


def test_ddp_gradient_buckets_count_as_one_more_copy_of_the_gradients() -> None:
    """DDP copies every gradient into the bucket it all-reduces: the 196 bytes of gradients of the tiny model (49
    float32 parameters) once more per rank, in the CPU estimate and in what the CUDA probe allocates beside its
    forward+backward (was: left out, so a micro-batch could fit the probe and not DDP). FSDP: as one process."""
    model, data, objective = tiny_regression()
    ddp, fsdp = Group(rank=0, world_size=2, strategy="ddp"), Group(rank=0, world_size=2, strategy="fsdp")
    assert bs.estimate_memory(model, data, objective, FP32, TrainParams(), 64, ddp).state == 784 + 196
    assert bs.estimate_memory(model, data, objective, FP32, TrainParams(), 64, fsdp).state == 784
    assert bs.estimate_memory(model, data, objective, FP32, TrainParams(), 64, Group()).state == 784
    assert bs.state_bytes(model, TrainParams(), ddp) == 3 * 196  # adamw's moments and the buckets: the probe's extra


def test_determinism_is_set_before_batch_size_auto_probes(
    iris: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cuBLAS reads CUBLAS_WORKSPACE_CONFIG once, when the first matmul starts it: with train.deterministic the
    setting must be in place before batch_size auto's probe runs its forward+backward (was: set after, by the
    Trainer, so a GPU run's cuBLAS reductions were not deterministic)."""
    from trainflow.stages import train as stage

    seen: list[tuple[str | None, bool]] = []
    resolve = stage.batch_size.resolve

    def probe(*args: Any, **kwargs: Any) -> Any:
        seen.append((os.environ.get("CUBLAS_WORKSPACE_CONFIG"), torch.are_deterministic_algorithms_enabled()))
        return resolve(*args, **kwargs)

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setattr(stage.batch_size, "resolve", probe)
    try:
        build(iris, tmp_path, batch_size="auto", global_batch=32, memory_budget_mb=64.0, deterministic=True)
    finally:
        torch.use_deterministic_algorithms(False)
    assert seen == [(":4096:8", True)]


def test_the_budget_picks_the_largest_micro_batch_within_it() -> None:
    model, data, objective = tiny_regression()

    def choose(budget_bytes: float | None, global_batch: int = 32) -> tuple[int, int]:
        budget = None if budget_bytes is None else budget_bytes / 2**20
        p = TrainParams(batch_size="auto", global_batch=global_batch, memory_budget_mb=budget)
        resolved, choice = bs.resolve(p, model, data, objective, FP32, CPU, Group())
        assert choice is not None and (choice.batch_size, choice.accumulate) == (
            resolved.batch_size,
            resolved.accumulate,
        )
        assert resolved.micro_batch * resolved.accumulate == global_batch  # exact, whatever the budget
        return choice.batch_size, choice.accumulate

    # 784 bytes of state + 56 per sample (hand-counted above).
    assert choose(784 + 56 * 8) == (8, 4)
    assert choose(784 + 56 * 16 - 1) == (8, 4)
    assert choose(784 + 56 * 16) == (16, 2)  # a bigger budget, a bigger micro-batch
    assert choose(784 + 56 * 32) == (32, 1)
    assert choose(None) == (32, 1)  # no budget: the whole global batch at once
    assert choose(784 + 56 * 11, global_batch=36) == (9, 4)  # a divisor of 36, not a power of two
    with pytest.raises(ParamsError, match=r"train\.memory_budget_mb: .* one sample needs"):
        choose(784 + 56 - 1)


def test_probes_leave_no_trace() -> None:
    """Estimating runs forward/backward in training mode: the RNG (dropout), BatchNorm's statistics, the gradients and
    the model's mode must be as before, or auto would train differently from the fixed batch size."""
    torch.manual_seed(1)
    model = Net(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.Dropout(0.5), nn.Linear(16, 3)).eval()
    data = TensorData(torch.randn(40, 4), torch.randint(0, 3, (40,)))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    p = TrainParams(batch_size="auto", global_batch=40, memory_budget_mb=1.0)
    bs.resolve(p, model, data, Objective("classification"), FP32, CPU, Group())
    assert torch.equal(torch.get_rng_state(), rng)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(q.grad is None for q in model.parameters())
    assert not model.training


class FakeGpu:
    """CudaProbe on CPU: a model that runs out of memory above `capacity` samples, memory stats that say b MiB."""

    def __init__(self, capacity: int, monkeypatch: pytest.MonkeyPatch) -> None:
        self.capacity, self.peak, self.emptied = capacity, 0, 0
        monkeypatch.setattr(torch.cuda, "empty_cache", self._empty)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: self.peak)
        props = type("Props", (), {"total_memory": 2**40})
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)

    def _empty(self) -> None:
        self.emptied += 1

    def model(self) -> nn.Module:
        gpu = self

        class Hungry(nn.Linear):
            def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
                if len(x) > gpu.capacity:
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
                gpu.peak = len(x) * 2**20
                return super().forward(x)

        return Hungry(4, 3)


def test_the_cuda_probe_recovers_from_out_of_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(capacity=10, monkeypatch=monkeypatch)
    model = gpu.model()
    data = TensorData(torch.randn(64, 4), torch.randint(0, 3, (64,)))
    probe = bs.CudaProbe(model, data, Objective("classification"), FP32, CPU, extra_bytes=8, budget=None)
    assert bs.largest_fitting(48, probe.fits) == 8  # 16, 24, 48 ran out of memory; 8 is the largest divisor <= 10
    assert probe.peaks[8] == 8.0 and gpu.emptied >= 2  # the cache emptied around each probe
    assert all(q.grad is None for q in model.parameters())
    budgeted = bs.CudaProbe(model, data, Objective("classification"), FP32, CPU, extra_bytes=8, budget=4.5 * 2**20)
    assert bs.largest_fitting(48, budgeted.fits) == 4  # the measured peak must also stay within the budget
    nothing = FakeGpu(capacity=0, monkeypatch=monkeypatch)
    empty = bs.CudaProbe(nothing.model(), data, Objective("classification"), FP32, CPU, extra_bytes=8, budget=None)
    assert bs.largest_fitting(48, empty.fits) is None
    cuda = torch.device("cuda")
    oom = bs._nothing_fits(TrainParams(batch_size="auto", global_batch=8), cuda, None, None)
    assert "not even one sample fits in GPU memory" in str(oom)
    over = bs._nothing_fits(TrainParams(batch_size="auto", global_batch=8, memory_budget_mb=1), cuda, None, 3.0)
    assert isinstance(over, ParamsError) and "train.memory_budget_mb" in str(over) and "peaked at 3 MiB" in str(over)


def test_validation_names_the_fields_to_fix(params_file: Path) -> None:
    from trainflow.params import load_params

    def problems(*overrides: str) -> str:
        with pytest.raises(ParamsError) as exc:
            load_params(params_file, list(overrides))
        return str(exc.value)

    assert "train.global_batch" in problems("train.batch_size=auto")
    assert "train.accumulate" in problems("train.batch_size=auto", "train.global_batch=64", "train.accumulate=2")
    text = problems("train.batch_size=16", "train.accumulate=2", "train.global_batch=64")
    assert "train.global_batch (64)" in text and "train.batch_size" in text and "train.accumulate" in text
    assert "batch_size: auto" in text  # what to do
    ok = load_params(params_file, ["train.batch_size=16", "train.accumulate=4", "train.global_batch=64"])
    assert ok.train.micro_batch == 16
    auto = load_params(params_file, ["train.batch_size=auto", "train.global_batch=64"])
    with pytest.raises(TypeError, match="resolve"):
        auto.train.micro_batch  # noqa: B018 - the engine never sees an unresolved batch size
    assert "train.batch_size" in problems("train.batch_size=0")
    # The real number of processes: 2 ranks of 16 x 4 make 128, not 64; an odd global batch cannot split over 2.
    fixed = TrainParams(batch_size=16, accumulate=4, global_batch=64)
    with pytest.raises(ParamsError, match=r"train\.global_batch: .*\(16 \* 4 \* 2 = 128\)"):
        bs.resolve(fixed, nn.Linear(4, 3), TensorData(torch.randn(8, 4), torch.zeros(8)), Objective("regression"),
                   FP32, CPU, Group(world_size=2))  # fmt: skip
    with pytest.raises(ParamsError, match=r"train\.global_batch: 63 does not split evenly over 2 processes"):
        bs.resolve(TrainParams(batch_size="auto", global_batch=63), nn.Linear(4, 3),
                   TensorData(torch.randn(8, 4), torch.zeros(8)), Objective("regression"), FP32, CPU,
                   Group(world_size=2))  # fmt: skip


def test_the_fingerprint_keeps_the_params_as_written() -> None:
    """Another machine (another budget, so another split of the same global batch) resumes the run; another global
    batch retrains."""
    base = PipelineParams()

    def fp(**train: Any) -> str:
        return fingerprint_of(with_values(base, {f"train.{k}": v for k, v in train.items()}, "test"), "data", REPO)

    auto = fp(batch_size="auto", global_batch=64, memory_budget_mb=100)
    assert fp(batch_size="auto", global_batch=64, memory_budget_mb=5) == auto
    assert fp(batch_size="auto", global_batch=64) == auto
    assert fp(batch_size="auto", global_batch=128, memory_budget_mb=100) != auto


# --- acceptance: the train stage's setup() with batch_size auto ---------------------------------------------------


@pytest.fixture(scope="module")
def iris(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainflow.core.paths import Paths
    from trainflow.params import load_params
    from trainflow.stages import run_stage

    root = make_project(tmp_path_factory.mktemp("bs") / "proj", {"data.source": "builtin:iris"})
    paths = Paths(root)
    for stage in ("ingest", "split"):
        run_stage(stage, load_params(paths.params), paths)
    return root


def build(root: Path, tmp: Path, dropout: float = 0.1, **train: Any) -> Setup:
    from trainflow.core.paths import Paths
    from trainflow.params import load_params
    from trainflow.stages.train import setup

    paths = Paths(root)
    values = {"train.epochs": 3, "train.progress": False, "train.resume": "never", "train.eval_every": 2,
              "model.dropout": dropout, **{f"train.{k}": v for k, v in train.items()}}  # fmt: skip
    params = with_values(load_params(paths.params), values, "test")
    return setup(training(params), paths, CPU, Group(), tmp / f"ckpt-{len(list(tmp.iterdir()))}")


def trained(root: Path, tmp: Path, **train: Any) -> tuple[dict[str, torch.Tensor], bs.Choice | None, TrainParams]:
    built = build(root, tmp, **train)
    built.trainer.fit(built.train, built.val)
    assert built.trainer.final_weights is not None
    return built.trainer.final_weights, built.batch, built.trainer.p


def test_auto_trains_the_same_weights_as_the_fixed_split_of_the_global_batch(iris: Path, tmp_path: Path) -> None:
    """The acceptance contract: under a small budget auto picks 8 x 4 and trains what 8 x 4 trains, bit for bit
    (with dropout: the probes must not move the RNG), and, without dropout, what 32 x 1 trains (the window's loss is
    divided once: only float summation order differs; with dropout the masks would be drawn per micro-batch). A
    bigger budget picks a bigger micro-batch."""
    # Budgets between the estimates at 8 and 16, and at 16 and 32 (the default MLP on iris's 4 features).
    fixed = build(iris, tmp_path, batch_size=32)
    est = bs.estimate_memory(fixed.trainer.model, fixed.train, fixed.trainer.objective, FP32, TrainParams(), 32)
    small, bigger = ((est.at(b) + est.at(2 * b)) / 2 / 2**20 for b in (8, 16))
    initial = {k: v.clone() for k, v in fixed.trainer.model.state_dict().items()}

    auto, choice, resolved = trained(iris, tmp_path, batch_size="auto", global_batch=32, memory_budget_mb=small)
    assert choice is not None and (choice.batch_size, choice.accumulate) == (8, 4)
    assert (resolved.batch_size, resolved.accumulate) == (8, 4)  # what the Trainer saw
    assert any(not torch.equal(auto[name], initial[name]) for name in auto)  # it trained
    same_split, _, _ = trained(iris, tmp_path, batch_size=8, accumulate=4, global_batch=32)
    for name in auto:
        torch.testing.assert_close(auto[name], same_split[name], rtol=0, atol=0)

    plain = {"dropout": 0.0, "global_batch": 32}
    auto, _, _ = trained(iris, tmp_path, batch_size="auto", memory_budget_mb=small, **plain)
    one_batch, _, _ = trained(iris, tmp_path, batch_size=32, **plain)
    for name in auto:
        torch.testing.assert_close(auto[name], one_batch[name], rtol=1e-5, atol=1e-7)

    _, choice_big, _ = trained(iris, tmp_path, batch_size="auto", global_batch=32, memory_budget_mb=bigger)
    assert choice_big is not None and (choice_big.batch_size, choice_big.accumulate) == (16, 2)


def test_a_run_resumes_on_a_machine_that_splits_the_global_batch_otherwise(iris: Path, tmp_path: Path) -> None:
    """The fingerprint holds batch_size auto and global_batch, not the split: a checkpoint written as 32 x 1 resumes
    under a budget that picks 8 x 4 (the same updates, exact accumulation); another global batch starts afresh."""
    from trainflow.core.paths import Paths
    from trainflow.params import load_params
    from trainflow.stages.train import setup

    paths = Paths(iris)
    ckpt = tmp_path / "checkpoints"

    def run(**train: Any) -> Setup:
        values = {"train.epochs": 2, "train.progress": False, "train.resume": "auto", "train.batch_size": "auto",
                  **{f"train.{k}": v for k, v in train.items()}}  # fmt: skip
        built = setup(training(with_values(load_params(paths.params), values, "test")), paths, CPU, Group(), ckpt)
        built.trainer.fit(built.train, built.val)
        return built

    first = run(global_batch=32)
    assert first.batch is not None and first.batch.batch_size == 32 and first.trainer.resumed_from is None
    fixed = build(iris, tmp_path, batch_size=32)
    est = bs.estimate_memory(fixed.trainer.model, fixed.train, fixed.trainer.objective, FP32, TrainParams(), 32)
    again = run(global_batch=32, memory_budget_mb=(est.at(8) + est.at(16)) / 2 / 2**20)
    assert again.batch is not None and again.batch.batch_size == 8
    assert again.trainer.resumed_from == first.trainer.state.updates  # resumed at the end: nothing left to do
    other = run(global_batch=16)
    assert other.trainer.resumed_from is None


def test_the_exported_model_records_the_split_auto_chose_of_the_global_batch(iris: Path, tmp_path: Path) -> None:
    """models/final/training.json: how the global batch was split, for whoever reads how the model was trained."""
    import shutil

    from trainflow.core.io import read_json
    from trainflow.core.paths import Paths
    from trainflow.params import load_params
    from trainflow.stages import run_stage

    root = shutil.copytree(iris, tmp_path / "proj")
    paths = Paths(root)
    values = {"train.epochs": 1, "train.progress": False, "train.batch_size": "auto", "train.global_batch": 32}
    run_stage("train", with_values(load_params(paths.params), values, "test"), paths)
    assert read_json(paths.final / "training.json")["batch_size_auto"] == {
        "batch_size": 32,
        "accumulate": 1,
        "global_batch": 32,
        "limit": "no memory budget: the whole share at once",
        "estimate_mb": None,
        "probe_peak_mb": None,
    }


@pytest.mark.parametrize(
    ("train", "copies"), [({}, 2), ({"optimizer": "sgd", "momentum": 0.9}, 1), ({"ema_decay": 0.99}, 3)]
)
def test_on_cuda_auto_probes_beside_a_stand_in_for_the_optimizer_state(
    monkeypatch: pytest.MonkeyPatch, train: dict[str, Any], copies: int
) -> None:
    """resolve on a (simulated) GPU: the probe allocates, beside its forward+backward, what training will hold besides
    weights and gradients: adamw's two moments of each of the 15 float32 parameters of Linear(4, 3) (sgd with
    momentum: one buffer; an EMA: one more copy)."""
    gpu = FakeGpu(capacity=64, monkeypatch=monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device=None: torch.zeros(8, dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device=None: None)
    reserved: list[int] = []

    class Probe(bs.CudaProbe):  # the real probe, on the CPU (torch.empty on "cuda" needs a GPU)
        def __init__(self, model: nn.Module, data: Any, objective: Objective, precision: Precision,
                     device: torch.device, extra_bytes: int, budget: float | None) -> None:  # fmt: skip
            assert device.type == "cuda"
            reserved.append(extra_bytes)
            super().__init__(model, data, objective, precision, CPU, extra_bytes, budget)

    monkeypatch.setattr(bs, "CudaProbe", Probe)
    model = gpu.model()
    monkeypatch.setattr(model, "to", lambda device: model)  # it is on the "GPU" already
    data = TensorData(torch.randn(64, 4), torch.randint(0, 3, (64,)))
    p = TrainParams(batch_size="auto", global_batch=48, **train)
    resolved, choice = bs.resolve(p, model, data, Objective("classification"), FP32, torch.device("cuda"), Group())
    assert reserved == [copies * 15 * 4]
    assert choice is not None and (choice.batch_size, choice.accumulate, choice.peak_mb) == (48, 1, 48.0)
    assert (resolved.batch_size, resolved.accumulate) == (48, 1)


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


class FakeCuda:
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
    gpu = FakeCuda(monkeypatch, capacity=64, total_mib=1000)
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
    gpu = FakeCuda(monkeypatch, capacity=10, total_mib=1000, per_sample=2.5)
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
    gpu = FakeCuda(monkeypatch, capacity=64, total_mib=1000)
    probe = bs.CudaProbe(gpu.model(), data3(), CLS, FP32, CPU, 8, 6.0 * MIB)
    assert (probe.fits(6), probe.fits(7)) == (True, False)
    assert probe.peaks == {6: 6.0, 7: 7.0}  # the peak of a probe over the limit is recorded too
    assert bs.largest_fitting(48, probe.fits) == 6


REAL_PROBE = bs.CudaProbe


def resolve_on_gpu(monkeypatch: pytest.MonkeyPatch, gpu: FakeCuda, p: TrainParams) -> tuple[TrainParams, Any]:
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
    gpu = FakeCuda(monkeypatch, capacity=10, total_mib=1000)
    resolved, choice = resolve_on_gpu(monkeypatch, gpu, TrainParams(batch_size="auto", global_batch=48))
    assert choice == bs.Choice(8, 6, 48, 1, "GPU memory 900 MiB", None, 8.0)
    assert (resolved.batch_size, resolved.accumulate) == (8, 6)
    # the probes 48, 6, 12, 8 (divisors 1 2 3 4 6 8 12 16 24 48), then the peak statistics reset for training
    forwards = [c for c in gpu.calls if c.startswith("forward")]
    assert forwards == ["forward 48", "forward 6", "forward 12", "forward 8"]
    assert gpu.calls[-1] == "reset cuda"


def test_on_a_gpu_a_budget_names_itself_as_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeCuda(monkeypatch, capacity=64, total_mib=1000, per_sample=0.5)
    p = TrainParams(batch_size="auto", global_batch=48, memory_budget_mb=5.0)
    _, choice = resolve_on_gpu(monkeypatch, gpu, p)
    assert choice == bs.Choice(8, 6, 48, 1, "GPU memory 5 MiB (memory budget)", None, 4.0)


def test_on_a_gpu_nothing_fitting_is_refused_by_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeCuda(monkeypatch, capacity=0, total_mib=1000)
    with pytest.raises(UserError) as oom:
        resolve_on_gpu(monkeypatch, gpu, TrainParams(batch_size="auto", global_batch=4, memory_budget_mb=1.0))
    assert str(oom.value).startswith("train: batch_size auto: not even one sample fits in GPU memory")
    assert gpu.calls[-1] == "reset cuda"
    over = FakeCuda(monkeypatch, capacity=64, total_mib=1000, per_sample=3.0)
    with pytest.raises(ParamsError) as budget:
        resolve_on_gpu(monkeypatch, over, TrainParams(batch_size="auto", global_batch=4, memory_budget_mb=2.0))
    assert budget.value.problems[0][1].startswith(
        "2 MiB is too little for batch_size auto: one sample's probe peaked at 3 MiB"
    )  # the peak at 1, the last size probed


def test_batch_size_auto_says_what_bounded_it_and_what_it_measured() -> None:
    cpu = Choice(8, 4, 32, 1, "memory budget 0.58 MiB", estimate_mb=0.5625)
    assert cpu.describe() == (
        "train: batch_size auto → 8 x accumulate 4 = global batch 32 (memory budget 0.58 MiB, estimate 0.562 MiB)"
    )
    gpu = Choice(16, 2, 64, 2, "90% of the GPU", peak_mb=1234.5)
    assert gpu.describe() == (
        "train: batch_size auto → 16 x accumulate 2 per process x 2 processes = global batch 64 "
        "(90% of the GPU, probe peak 1234 MiB)"
    )


def test_sgd_without_momentum_holds_no_optimizer_state_in_the_memory_estimate() -> None:
    """Linear(4, 8) -> ReLU -> Linear(8, 1) has 4 * 8 + 8 + 8 * 1 + 1 = 49 float32 parameters: 196 bytes. SGD with
    momentum 0 keeps no momentum buffer, so beyond the weights and gradients training holds nothing (0 bytes), and the
    CPU estimate's state is the weights and their gradients only: 2 x 196 bytes. With momentum it holds one buffer
    (196 bytes), and EMA one more copy."""
    torch.manual_seed(0)
    model = Net(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    weights = (4 * 8 + 8 + 8 * 1 + 1) * 4
    assert weights == 196
    plain = TrainParams(optimizer="sgd", momentum=0.0)
    assert bs.state_bytes(model, plain, Group()) == 0
    assert bs.state_bytes(model, TrainParams(optimizer="sgd", momentum=0.9), Group()) == 196
    assert bs.state_bytes(model, TrainParams(optimizer="sgd", momentum=0.0, ema_decay=0.9), Group()) == 196
    assert bs.state_bytes(model, TrainParams(optimizer="sgd", momentum=0.9, ema_decay=0.9), Group()) == 2 * 196
    data = TensorData(torch.randn(64, 4), torch.randn(64))
    fp32 = Precision("fp32", "cpu")
    est = bs.estimate_memory(model, data, Objective("regression"), fp32, plain, share=64)
    assert est.state == 2 * 196


def test_a_share_of_one_sample_is_one_measurement_all_of_it_per_sample() -> None:
    """estimate_memory with share 1 cannot probe two sizes: it measures one sample and counts it all per sample (no
    fixed part). Linear(4, 8) -> ReLU -> Linear(8, 1), squared error, fp32: autograd keeps the input row (4 floats),
    ReLU's output (8), the output (1) and the target (1) of one sample: 56 bytes (as test_batch_size.py works out)."""
    import torch
    from torch import nn

    from trainflow.engine import batch_size as bs
    from trainflow.engine.loaders import TensorData
    from trainflow.engine.objective import Objective
    from trainflow.engine.precision import Precision
    from trainflow.params import TrainParams

    class Net(nn.Sequential):  # called as trainflow calls its models: model(x=...)
        def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            return super().forward(x)

    torch.manual_seed(0)
    model = Net(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    data = TensorData(torch.randn(8, 4), torch.randn(8))
    fp32 = Precision("fp32", "cpu")
    est = bs.estimate_memory(model, data, Objective("regression"), fp32, TrainParams(), share=1)
    assert (est.state, est.fixed, est.per_sample) == (784, 0.0, 56.0)
