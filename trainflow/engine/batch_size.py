"""train.batch_size auto: the largest micro-batch that fits, and the accumulation that keeps the global batch exact.

An update's global batch is batch_size * accumulate * world_size samples (train.global_batch). The trainer divides the
summed loss of a whole window once, so every split of that window computes the same update (up to float summation
order): choosing the micro-batch is a question of memory only. `resolve` takes the largest divisor b of
global_batch / world_size that fits and sets accumulate = global_batch / world_size / b.

Only what "fits" means differs by device, so the search (`largest_fitting`) takes it as a predicate:
- CUDA: one forward+backward at b, with a stand-in allocation for the optimizer state (and DDP's gradient
  buckets), must not raise
  torch.OutOfMemoryError, and its peak (torch.cuda.max_memory_allocated) must stay under HEADROOM of the GPU's memory
  and under train.memory_budget_mb if set. The unwrapped model is probed: with FSDP the estimate is conservative.
- CPU: an estimate must stay under train.memory_budget_mb (null: no limit, the whole share at once): parameters,
  gradients and optimizer state, plus the activations autograd saves for backward, measured with saved_tensors_hooks
  at two small sizes and extrapolated linearly (they grow with the batch; weight copies under autocast do not).
The CPU tests therefore exercise the search CUDA runs.

Probes leave no trace in training: they run under a forked RNG, restore the model's buffers (BatchNorm statistics)
and mode, and leave no gradients behind. Several ranks take the smallest of their choices, so they all run the same
number of micro-batches.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainflow.core.errors import ParamsError, UserError
from trainflow.engine.distributed import Group
from trainflow.engine.loaders import Batch, Dataset
from trainflow.engine.objective import Objective
from trainflow.engine.precision import Precision
from trainflow.params import TrainParams, global_batch_problem

MIB = 2**20
HEADROOM = 0.9  # CUDA: a probe's peak may use this fraction of the GPU's memory (the allocator fragments; training
# also holds loss accumulators, the schedule table and, at checkpoints, host copies in flight)
PROBE_SIZES = (4, 8)  # CPU: the two micro-batch sizes the saved activations are measured at


def divisors(n: int) -> list[int]:
    """The divisors of n >= 1, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def largest_fitting(total: int, fits: Callable[[int], bool]) -> int | None:
    """The largest divisor of `total` for which `fits` holds; None when not even 1 does.

    `fits` must be monotone (if b fits, every smaller b does). `total` itself is tried first (often everything fits:
    one probe), then a binary search over the divisors: O(log d) probes, each of which may cost an out-of-memory
    error on CUDA.
    """
    candidates = divisors(total)
    if fits(candidates[-1]):
        return candidates[-1]
    best, lo, hi = None, 0, len(candidates) - 2
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(candidates[mid]):
            best, lo = candidates[mid], mid + 1
        else:
            hi = mid - 1
    return best


@dataclass(frozen=True)
class Choice:
    """What batch_size auto chose, and what bounded it."""

    batch_size: int
    accumulate: int
    global_batch: int
    world_size: int
    limit: str  # what bounded the choice, in words
    estimate_mb: float | None = None  # CPU with a budget: the estimated memory (MiB) of a micro-batch of batch_size
    peak_mb: float | None = None  # CUDA: the probe's measured peak (MiB) at batch_size

    def describe(self) -> str:
        per = f" per process x {self.world_size} processes" if self.world_size > 1 else ""
        measured = [f"estimate {_mib(self.estimate_mb)} MiB"] if self.estimate_mb is not None else []
        measured += [f"probe peak {_mib(self.peak_mb)} MiB"] if self.peak_mb is not None else []
        how = ", ".join([self.limit, *measured])
        return (
            f"train: batch_size auto → {self.batch_size} x accumulate {self.accumulate}{per} = global batch "
            f"{self.global_batch} ({how})"
        )

    def summary(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "accumulate": self.accumulate,
            "global_batch": self.global_batch,
            "limit": self.limit,
            "estimate_mb": self.estimate_mb,
            "probe_peak_mb": self.peak_mb,
        }


def resolve(
    params: TrainParams,
    model: nn.Module,
    data: Dataset,
    objective: Objective,
    precision: Precision,
    device: torch.device,
    group: Group,
) -> tuple[TrainParams, Choice | None]:
    """`params` with a number for batch_size (and accumulate), as the Trainer needs; the Choice when it was auto.

    A fixed batch_size is only checked against train.global_batch on the real number of processes.
    """
    world = group.world_size
    if params.batch_size != "auto":
        if problem := global_batch_problem(params, world):
            raise ParamsError("params.yaml", [("train.global_batch", problem)])
        return params, None
    assert params.global_batch is not None  # TrainParams requires it with batch_size auto
    if params.global_batch % world:
        raise ParamsError(
            "params.yaml",
            [("train.global_batch", f"{params.global_batch} does not split evenly over {world} processes; make it "
              f"a multiple of {world}")],
        )  # fmt: skip
    share = params.global_batch // world
    budget = None if params.memory_budget_mb is None else params.memory_budget_mb * MIB
    model.to(device)  # where the Trainer puts it anyway
    est: MemoryEstimate | None = None
    with untouched(model, device):
        if device.type == "cuda":
            probe = CudaProbe(model, data, objective, precision, device, state_bytes(model, params, group), budget)
            chosen = largest_fitting(share, probe.fits)
            estimate, peak = None, probe.peaks.get(chosen or 1)
            limit = f"GPU memory {_mib(probe.limit / MIB)} MiB" + (" (memory budget)" if probe.budgeted else "")
        elif budget is None:
            chosen, estimate, peak, limit = share, None, None, "no memory budget: the whole share at once"
        else:
            est = estimate_memory(model, data, objective, precision, params, share, group)
            chosen = largest_fitting(share, lambda b: est.at(b) <= budget)
            estimate, peak = est.at(chosen or 1) / MIB, None
            limit = f"memory budget {params.memory_budget_mb:g} MiB"
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # the train summary's peak_memory_mb is training's, not a probe's
    if chosen is None:
        raise _nothing_fits(params, device, estimate, peak)
    chosen = _agree(group, chosen)
    if est is not None:  # another rank may have chosen less
        estimate = est.at(chosen) / MIB
    choice = Choice(chosen, share // chosen, params.global_batch, world, limit, estimate, peak)
    return params.model_copy(update={"batch_size": chosen, "accumulate": share // chosen}), choice


def _nothing_fits(params: TrainParams, device: torch.device, estimate: float | None, peak: float | None) -> UserError:
    if device.type == "cuda" and peak is None:  # it ran out of GPU memory, whatever the budget
        return UserError(
            "train: batch_size auto: not even one sample fits in GPU memory (forward+backward ran out of memory); "
            "try precision: bf16, strategy: fsdp with several GPUs, or a smaller model"
        )
    needs = (
        f"one sample's probe peaked at {_mib(peak)} MiB"
        if peak is not None
        else f"one sample needs {_mib(estimate)} MiB"
    )
    return ParamsError(
        "params.yaml",
        [("train.memory_budget_mb", f"{params.memory_budget_mb:g} MiB is too little for batch_size auto: {needs} "
          "(parameters, gradients, optimizer state and activations); raise it, or set it to null for no limit")],
    )  # fmt: skip


def _mib(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}" if value < 100 else f"{value:.0f}"


def _agree(group: Group, chosen: int) -> int:
    """The smallest choice of all ranks, on every rank: each runs `accumulate` micro-batches per update."""
    if not group.distributed:
        return chosen
    gathered = group.gather(chosen)
    return int(group.broadcast(min(gathered) if gathered else chosen))


@contextlib.contextmanager
def untouched(model: nn.Module, device: torch.device) -> Iterator[None]:
    """Probe `model` in training mode and leave no trace: RNG streams, buffers, mode and gradients as they were."""
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    was_training = model.training
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model.train()
        try:
            yield
        finally:
            model.zero_grad(set_to_none=True)
            with torch.no_grad():
                for buffer, saved in buffers:
                    buffer.copy_(saved)
            model.train(was_training)


def probe_batch(data: Dataset, size: int) -> Batch:
    """`size` samples to probe with: the longest ones where samples differ in length (text pads a batch to its
    longest: the worst case), else the first ones; repeated when the data has fewer."""
    lengths = getattr(data, "lengths", None)
    order = torch.argsort(lengths, descending=True, stable=True) if isinstance(lengths, torch.Tensor) else None
    idx = order if order is not None else torch.arange(len(data))
    idx = idx.repeat(math.ceil(size / len(idx)))[:size]
    return data.batch(idx.to(data.index_device))


def forward_backward(model: nn.Module, batch: Batch, objective: Objective, precision: Precision) -> None:
    """What the trainer runs per micro-batch (train_step), without the optimizer."""
    with precision.autocast():
        out = model(**batch.inputs)
    objective.train_loss_sum(out, batch.target).backward()


def state_bytes(model: nn.Module, params: TrainParams, group: Group) -> int:
    """Memory training holds beyond the weights and their gradients: adamw's two moments (sgd: one momentum buffer)
    and the EMA copy of each trainable parameter, and under DDP the buckets it all-reduces gradients in (a second copy
    of them: DDP copies each gradient into its bucket, gradient_as_bucket_view being off). FSDP is estimated as one
    process (conservative: each rank holds a shard)."""
    trainable = sum(q.numel() * q.element_size() for q in model.parameters() if q.requires_grad)
    copies = 2 if params.optimizer == "adamw" else int(params.momentum > 0)
    buckets = int(group.distributed and not group.sharded)
    return trainable * (copies + int(params.ema_decay is not None) + buckets)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of one micro-batch's training step: `state` (parameters, gradients, optimizer state) and the saved
    activations, `fixed` plus `per_sample` times the batch size."""

    state: int
    fixed: float
    per_sample: float

    def at(self, batch_size: int) -> float:
        return self.state + self.fixed + self.per_sample * batch_size


def estimate_memory(
    model: nn.Module,
    data: Dataset,
    objective: Objective,
    precision: Precision,
    params: TrainParams,
    share: int,
    group: Group | None = None,
) -> MemoryEstimate:
    """The CPU estimate: parameters + gradients + optimizer state (and DDP's buckets), and the activations saved for
    backward measured at two small sizes (at most `share`), extrapolated linearly."""
    weights = sum(q.numel() * q.element_size() for q in model.parameters())
    grads = sum(q.numel() * q.element_size() for q in model.parameters() if q.requires_grad)
    state = weights + grads + state_bytes(model, params, group or Group())
    large = min(PROBE_SIZES[1], share)
    small = min(PROBE_SIZES[0], large // 2)
    if small < 1:  # a share of 1: one measurement, all of it per sample
        return MemoryEstimate(state, 0.0, float(saved_bytes(model, probe_batch(data, large), objective, precision)))
    m_small, m_large = (saved_bytes(model, probe_batch(data, n), objective, precision) for n in (small, large))
    per_sample = max(0.0, (m_large - m_small) / (large - small))
    return MemoryEstimate(state, max(0.0, m_small - per_sample * small), per_sample)


def saved_bytes(model: nn.Module, batch: Batch, objective: Objective, precision: Precision) -> int:
    """Bytes of the tensors autograd saves for backward in one forward of `batch` (each storage once; the parameters
    themselves, which some ops save, are counted as state, not here); runs the backward too, as training does."""
    params = {q.untyped_storage().data_ptr() for q in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if (ptr := storage.data_ptr()) not in params:
            seen[ptr] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward_backward(model, batch, objective, precision)
    model.zero_grad(set_to_none=True)
    return sum(seen.values())


class CudaProbe:
    """`fits(b)`: one forward+backward at b runs on the GPU without running out of memory, with a stand-in for the
    optimizer state allocated, and peaks under the limit (HEADROOM of the GPU, or train.memory_budget_mb)."""

    def __init__(
        self,
        model: nn.Module,
        data: Dataset,
        objective: Objective,
        precision: Precision,
        device: torch.device,
        extra_bytes: int,
        budget: float | None,
    ) -> None:
        self.model, self.data, self.objective, self.precision, self.device = model, data, objective, precision, device
        self.extra_bytes = extra_bytes
        gpu = HEADROOM * torch.cuda.get_device_properties(device).total_memory
        self.budgeted = budget is not None and budget < gpu
        self.limit = min(gpu, budget) if budget is not None else gpu
        self.peaks: dict[int, float] = {}  # MB, of every probe that ran

    def fits(self, batch_size: int) -> bool:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        ran = self._run(batch_size)
        self.model.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()  # what an out-of-memory probe left cached goes back before the next one
        if not ran:
            return False
        peak = torch.cuda.max_memory_allocated(self.device)
        self.peaks[batch_size] = peak / MIB
        return peak <= self.limit

    def _run(self, batch_size: int) -> bool:
        # The tensors of a failed probe die with this frame (an exception's traceback would keep them alive).
        try:
            stand_in = torch.empty(self.extra_bytes, dtype=torch.uint8, device=self.device)
            forward_backward(self.model, probe_batch(self.data, batch_size), self.objective, self.precision)
            del stand_in
        except torch.OutOfMemoryError:
            return False
        return True
