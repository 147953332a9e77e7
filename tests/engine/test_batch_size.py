"""train.batch_size auto: the search, the CPU memory estimate, the validation, and the acceptance contract — auto trains
the same weights as the fixed split of the same global batch, and the memory budget is what picks the split."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from support.nets import Net
from support.projects import REPO, make_project
from support.stages import fingerprint_of, training
from torch import nn

from trainflow.core.errors import ParamsError
from trainflow.engine import batch_size as bs
from trainflow.engine.distributed import Group
from trainflow.engine.loaders import TensorData
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
