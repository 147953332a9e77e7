"""The trainer: `fit()` runs the loop; `train_step()` is one whole optimizer update, top to bottom.

Units: an *update* is one optimizer step over a *window* of up to `batch_size * accumulate` samples, split into
micro-batches of `batch_size`. The loss of an update is the sum of per-sample (or per-token) losses over the window
divided once by the number of loss terms in that window, so a smaller last window, or a window of padded sequences,
is weighted exactly like any other and micro-batch B x accumulate 1 computes the same gradient as B/4 x accumulate 4.

The hot loop never waits for the device. On an accelerator, skipping a non-finite update, advancing the learning-rate
schedule and counting skips all happen on the device: the fused optimizer takes a `found_inf` flag, and the schedule
is a table indexed by a device counter of applied updates. The host reads the device only every `log_every` updates,
at evaluations and at checkpoints. On CPU, where the device is the host, the same decisions are taken in Python
(`_step_on_host`): bit-identical, and without the scalar kernels that only exist to keep a GPU from waiting.
With train.compile: reduce-overhead the model's forward and backward are replayed as CUDA graphs too (graphs.py), so
what the host still launches per update is the loss, clipping, the decision and the fused step.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch import nn

from trainflow.core.errors import PREEMPTED, ParamsError, Preempted, UserError
from trainflow.core.io import failpoint, write_json
from trainflow.core.logger import Logger, NullLogger
from trainflow.core.progress import Progress, progress
from trainflow.engine import flops
from trainflow.engine.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    capture_rng,
    flatten_optimizer,
    load_checkpoint,
    repair,
    restore_rng,
    unflatten_optimizer,
)
from trainflow.engine.distributed import Group, RunningStats
from trainflow.engine.ema import EMA
from trainflow.engine.graphs import REDUCE_OVERHEAD, compiled, fallback_reason, own_gradients, refusals
from trainflow.engine.loaders import Batch, Dataset, epoch_order
from trainflow.engine.objective import Objective
from trainflow.engine.optim import FusedAdamWStep, build_optimizer, plan_groups
from trainflow.engine.precision import Precision, configure_backends
from trainflow.engine.preempt import PREEMPTED_MARK, Watch
from trainflow.engine.profile import profiler
from trainflow.engine.schedule import Plateau, lr_table
from trainflow.params import TrainParams

# fp16: the GradScaler starts at a scale of 2**16 and halves it on each overflow, so up to 16 skips in a row are its
# own search for a scale that fits (large models need several at the start), not a diverged model.
FP16_PROBES = 16


class NonFiniteError(UserError):
    """Too many consecutive updates had a non-finite loss or gradient."""


@dataclass
class TrainState:
    """Host-side progress; all of it goes into meta.json of each checkpoint."""

    epoch: int = 0  # epochs completed
    position: int = 0  # samples of the current epoch's order done: the data position, in index space (any world size)
    updates: int = 0  # windows stepped through (applied + skipped): the loop's clock
    applied: int = 0  # optimizer updates applied (the schedule's clock; read from the device at sync points)
    consecutive_nonfinite: int = 0  # skipped updates in a row, as of the last read
    samples: int = 0
    tokens: int = 0
    loss_terms: int = 0  # samples or target tokens of applied updates: what the train loss was summed over
    best_metric: float | None = None
    best_update: int = -1
    bad_evals: int = 0  # evaluations since the last improvement (early stopping patience is counted in these)
    last_eval_update: int = -1
    checkpoint_update: int = -1
    stopped_early: bool = False
    planned_epochs: int = 0  # train.epochs as this run resolved it (auto: by the updates an epoch takes); 0: not yet
    history: list[dict[str, float]] = field(default_factory=list)
    # The train loss of applied updates summed over their terms (folded in from the device at each read), and its
    # value at the last log and evaluation, for per-interval means.
    loss_sum: float = 0.0
    loss_at_log: float = 0.0
    terms_at_log: int = 0
    loss_at_eval: float = 0.0
    terms_at_eval: int = 0


class Counters:
    """What the step decides, counted where it decides: applied updates (the schedule's index), loss terms of applied
    updates and the longest run of skipped ones since the last read, and the current run of skipped updates.

    On an accelerator these are device tensors, updated by tensor ops so the host never waits (`DeviceCounters`); on
    the CPU, Python ints (this class): the same counts without a kernel launch per count. Either way the host reads
    them into TrainState only at sync points (`Trainer._sync`)."""

    def __init__(self) -> None:
        self._applied = self._terms = self._consecutive = self._worst = 0

    @property
    def applied(self) -> int:
        return self._applied

    def count(self, applied: bool, terms: int) -> None:
        if applied:
            self._applied += 1
            self._terms += terms
            self._consecutive = 0
        else:
            self._consecutive += 1
            self._worst = max(self._worst, self._consecutive)

    def read(self) -> tuple[int, int, int, int]:
        """(applied, terms since the last read, skipped in a row, longest such run since the last read)."""
        out = (self._applied, self._terms, self._consecutive, self._worst)
        self._terms = self._worst = 0
        return out

    def restore(self, applied: int, consecutive: int) -> None:
        self._applied, self._consecutive = applied, consecutive


class DeviceCounters(Counters):
    def __init__(self, device: torch.device) -> None:
        self.index = torch.zeros(1, dtype=torch.long, device=device)  # applied updates: the schedule's index
        self.terms = torch.zeros((), dtype=torch.long, device=device)
        self.consecutive = torch.zeros((), device=device)
        self.worst = torch.zeros((), device=device)

    @property
    def applied(self) -> int:
        return int(self.index)  # a sync: for tests and tools, never in the step

    def count_on_device(self, is_finite: torch.Tensor, skip: torch.Tensor, terms: int) -> None:
        self.index += is_finite  # the schedule advances only on applied updates
        self.terms.add_(is_finite, alpha=terms)
        torch.addcmul(skip, self.consecutive, skip, out=self.consecutive)  # (run + 1) if skipped, else 0
        torch.maximum(self.worst, self.consecutive, out=self.worst)

    def tensors(self) -> list[torch.Tensor]:
        return [self.index[0], self.terms, self.consecutive, self.worst]

    def reset_reads(self) -> None:
        self.terms.zero_()
        self.worst.zero_()

    def restore(self, applied: int, consecutive: int) -> None:
        self.index.fill_(applied)
        self.consecutive.fill_(consecutive)


# train.epochs auto: enough epochs for at least AUTO_UPDATES optimizer updates, and at least AUTO_EPOCHS. A table of
# AUTO_EPOCHS * per-epoch updates or more trains as a fixed AUTO_EPOCHS did; a smaller one (a few updates an epoch)
# gets more epochs, with the schedule's warmup stretched over its longer run. Early stopping ends either sooner.
AUTO_UPDATES = 1000
AUTO_EPOCHS = 40


def planned_epochs(epochs: int | str, per_epoch: int) -> int:
    """train.epochs as a number: itself, or auto's, for an epoch of `per_epoch` updates."""
    if isinstance(epochs, int):
        return epochs
    return max(AUTO_EPOCHS, math.ceil(AUTO_UPDATES / max(1, per_epoch)))


@dataclass(frozen=True)
class Plan:
    window: int  # samples per update: batch_size * accumulate * world_size
    per_epoch: int  # updates per (whole) epoch
    total: int  # updates in the whole run: the length of the schedule
    epoch_samples: int = 0  # samples an epoch trains on (all of them, or limit_batches windows)
    epochs: int = 1  # epochs in the whole run: train.epochs, auto resolved


class Trainer:
    def __init__(
        self,
        model: nn.Module,
        params: TrainParams,
        *,
        seed: int,
        device: torch.device,
        precision: Precision,
        objective: Objective,
        checkpoint_dir: Path,
        fingerprint: str,
        logger: Logger | None = None,
        flops_per_batch: Callable[[Batch], float] | None = None,
        peak_flops: float | None = None,
        group: Group | None = None,
    ) -> None:
        configure_backends(params, device)
        self.group = group = group or Group()
        if group.sharded and params.ema_decay is not None:
            raise ParamsError(
                "params.yaml", [("train.ema_decay", "the weight average is not sharded; use strategy ddp with it")]
            )
        if group.sharded and (precision.uses_scaler or params.optimizer == "sgd"):
            raise ParamsError(
                "params.yaml",
                [
                    ("train.strategy", "fsdp trains with adamw in fp32 or bf16; for fp16 (a GradScaler over shards) "
                     "or sgd (torch has no sharded fused SGD with a tensor learning rate) use strategy ddp")
                ],
            )  # fmt: skip
        if group.sharded and precision.name == "fp8":
            raise ParamsError(
                "params.yaml",
                [
                    ("train.strategy", "fp8 is not offered with fsdp: torchao's float8 under FSDP2 wants its fp8 "
                     "all-gather (enable_fsdp_float8_all_gather, and precompute_float8_dynamic_scale_for_fsdp after "
                     "each optimizer step), which this engine neither sets up nor has tested; use strategy ddp")
                ],
            )  # fmt: skip
        if problems := refusals(params):  # train.compile reduce-overhead with what it cannot run with
            raise ParamsError("params.yaml", problems)
        model = precision.prepare(model)  # fp8: Float8Linear layers, before DDP/FSDP wrap the model
        self.p = params
        self.seed = seed
        self.device = device
        self.precision = precision
        self.objective = objective
        self.fingerprint = fingerprint
        self.logger = logger or NullLogger()
        # MFU: FLOPs per micro-batch (built-in models know theirs) over the device's peak (known CUDA GPUs).
        self.flops_per_batch = flops_per_batch or flops.flops_per_batch(model)
        self.peak_flops = peak_flops or flops.peak_flops(device, precision.dtype)
        self.store = CheckpointStore(checkpoint_dir, params.keep_last)
        self.model = model.to(device)  # what gets saved: never the compiled wrapper (FSDP: sharded in place)
        self.wrapped = group.wrap(self.model, device, params.sync_batchnorm)  # DDP around the model, or the model
        # Several ranks: BatchNorm's running statistics merged after each window into those one process holds.
        self.running_stats = RunningStats(group, self.model, params.micro_batch, params.accumulate)
        # train.compile (graphs.py); reduce-overhead also replays forward and backward as CUDA graphs on CUDA (its code
        # path, capture off, on CPU), unless `prepare` finds the ranks or the data against it.
        self.graphed = params.compile == REDUCE_OVERHEAD
        self.forward: Callable[..., torch.Tensor] = compiled(self.wrapped, params.compile)
        self.params = [q for q in self.model.parameters() if q.requires_grad]
        # The schedule writes `lr` (the scheduled rate); each parameter group learns at lr * its fixed scale
        # (layer_decay, param_groups), its optimizer `lr` a view of one element of `lrs`.
        specs = plan_groups(self.model, params)
        self.lr = torch.tensor(params.lr, device=device)
        self.lr_scales = torch.tensor([g.lr_scale for g in specs], device=device)
        self.lrs = self.lr * self.lr_scales
        self.optimizer = build_optimizer(specs, params, self.lrs)
        # AdamW's fused kernel called directly, without torch.optim's per-step Python (optim.py); where that does not
        # apply (sgd, sharded parameters), the optimizer's own step.
        self.fused_step = (
            FusedAdamWStep(self.optimizer) if not group.sharded and FusedAdamWStep.applies(self.optimizer) else None
        )
        # Per-group rates are logged (lr/<group>) when they differ from the scheduled one.
        self.group_names = [g.name for g in specs] if any(g.lr_scale != 1.0 for g in specs) else []
        named = [(n, q) for n, q in self.model.named_parameters() if q.requires_grad]
        # The optimizer's parameters by name, in the order its state dict numbers them: saved with each checkpoint,
        # so a resume maps the saved moments onto parameters by name, whatever groups the current params make.
        names = {id(q): n for n, q in named}
        self.param_order = [names[id(q)] for g in self.optimizer.param_groups for q in g["params"]]
        self.ema = EMA(named, params.ema_decay, device) if params.ema_decay is not None else None
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision.uses_scaler)
        # Where skip decisions happen: on an accelerator, on the device (the host never waits for it); on CPU, in
        # Python (there is nothing to wait for). Both give bit-identical results; tests run both on CPU.
        self.counters: Counters = Counters()
        self.decide_on_device = device.type != "cpu"
        self._rates: list[float] = []  # the schedule table as floats, for the host path
        # Both paths: the train loss of applied updates, summed since the host last read it (float32, then folded
        # into state.loss_sum in float64), and the current window's loss.
        self.loss_acc = torch.zeros((), device=device)
        self._window_loss = torch.zeros((), device=device)
        self._skip = torch.zeros((), device=device)
        self._seeds: dict[int, torch.Tensor] = {}
        self.grad_norm = torch.zeros((), device=device)  # of the last update, before clipping
        self._zero = torch.zeros((), device=device)
        self.state = TrainState()
        self.plan = Plan(1, 1, 1)
        self.plateau: Plateau | None = None
        self._base_table = self._table = torch.zeros(1, device=device)
        self._clock = (time.perf_counter(), 0, 0, 0.0)  # (time, samples, tokens, flops) at the last log
        self._flops = 0.0
        self._logged_at = 0
        self._best_weights: tuple[int, dict[str, torch.Tensor]] | None = None
        self._saved_best = -1  # the best update that the checkpoint of state.checkpoint_update names
        self._resumed_root: Path | None = None  # the folder of the checkpoint resumed from (resume: <path>: another)
        self.final_weights: dict[str, torch.Tensor] | None = None  # after fit(), on rank 0: what to export
        self.resumed_from: int | None = None  # the update a resumed run continued from; None for a fresh start
        # A signal (train.preempt_signals) or train.max_time stops fit() after an update, with a checkpoint, raising
        # Preempted. Off by default: the train stage gives its Watch, entered for the whole stage (`watch`);
        # `preemptible` alone makes fit() enter one of its own. A sweep's trials leave the signals to the sweep.
        self.watch: Watch | None = None
        self.preemptible = False
        self._watch: Watch | None = None
        # train.profile writes its trace here (the train stage: reports/profile); None: not profiled.
        self.profile_dir: Path | None = None
        self._profiler: Any = None

    @property
    def decide_on_device(self) -> bool:
        return isinstance(self.counters, DeviceCounters)

    @decide_on_device.setter
    def decide_on_device(self, on_device: bool) -> None:
        """Choose the decision path (before training: the counts start at zero). Tests force the device one on CPU."""
        self.counters = DeviceCounters(self.device) if on_device else Counters()

    # --- the training step --------------------------------------------------------------------------------------

    def train_step(self, micro_batches: list[Batch], count: int | None = None) -> None:
        """One optimizer update over one window of micro-batches. On an accelerator nothing here waits for it.

        Per micro-batch: forward under autocast, backward of its summed loss times scale / count (count = the loss
        terms of the whole window: of every rank's micro-batches, when there are several ranks; gradients are summed
        across ranks on the last micro-batch). Then: unscale (fp16), clip, and apply the update if the gradient norm
        is finite, else skip it: weights, optimizer state and the schedule stay as they were. Last, fp16's scale
        adapts.
        """
        for q in self.params:  # optimizer.zero_grad(set_to_none=True), without its per-call hooks and profiler record
            q.grad = None
        if count is None:
            count = sum(b.count for b in micro_batches)  # loss terms in the window; a partial window has fewer
        # Seeding backward with 1/count divides the window's summed loss once: every term weighs exactly 1/count.
        seed = self._seeds.get(count)
        if seed is None:
            seed = self._seeds[count] = torch.full((), 1.0 / count, device=self.device)
        if self.scaler.is_enabled():
            seed = self.scaler.scale(seed)
        window_loss: torch.Tensor | None = None  # the window's summed loss: the first micro-batch's, then added to
        last = len(micro_batches) - 1
        waiting = self.params  # reduce-overhead: the parameters whose .grad backward may still hand over from its graph
        for i, batch in enumerate(micro_batches):
            with self.group.gradient_sync(self.wrapped, i == last):
                with self.precision.autocast():
                    out = self.forward(**batch.inputs)
                loss_sum = self.objective.train_loss_sum(out, batch.target)
                loss_sum.backward(seed)
            if self.graphed and i < last:
                waiting = own_gradients(waiting)  # out of the graph pool, which the next replay overwrites
            if window_loss is None:  # one kernel fewer per micro-batch than zero-then-add (0 + x is x, bit for bit)
                window_loss = self._window_loss.copy_(loss_sum.detach()) if last else loss_sum.detach()
            else:
                window_loss += loss_sum.detach()
        assert window_loss is not None
        if self.scaler.is_enabled():
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not scaled ones
        grad_norm = self._clip_gradients()
        if self.decide_on_device:
            self._step_on_device(grad_norm, window_loss, count)
        else:
            self._step_on_host(grad_norm, window_loss, count)
        if self.scaler.is_enabled():
            self.scaler.update()  # fp16: an overflow halves the scale; growth_interval finite updates double it
        self.grad_norm = grad_norm

    def _step_on_device(self, grad_norm: torch.Tensor, window_loss: torch.Tensor, count: int) -> None:
        """Apply or skip the update without the host waiting: flags, counters and the schedule stay on the device."""
        # A non-finite norm <=> some gradient is inf/NaN (a non-finite loss makes them so); x - x is 0 only if finite.
        is_finite = torch.eq(grad_norm - grad_norm, 0)
        skip = torch.logical_not(is_finite, out=self._skip)  # float 0/1, as the fused kernel wants
        c = self.counters
        assert isinstance(c, DeviceCounters)
        torch.index_select(self._table, 0, c.index, out=self.lr.view(1))  # the rate of this applied update
        torch.mul(self.lr, self.lr_scales, out=self.lrs)  # each group's
        if self.fused_step is not None:
            self.fused_step(found_inf=skip)  # found_inf = 1: the fused kernel writes nothing
        else:
            opt: Any = self.optimizer
            opt.grad_scale, opt.found_inf = None, skip
            self.optimizer.step()
            del opt.grad_scale, opt.found_inf
        if self.ema is not None:
            self.ema.update_if(is_finite)
        self.loss_acc += torch.where(is_finite, window_loss, self._zero)  # a skipped window's inf/NaN stays out
        c.count_on_device(is_finite, skip, count)

    def _step_on_host(self, grad_norm: torch.Tensor, window_loss: torch.Tensor, count: int) -> None:
        """The same decisions on CPU, where the device is the host and reading a value costs a memory load.

        Bit-identical to `_step_on_device` (same rates, same fused kernel, same float32 loss sums, the same counts);
        it branches in Python instead of computing flags and masked updates that only keep an accelerator from waiting.
        """
        applied = math.isfinite(grad_norm.item())
        if applied:
            self.lrs.copy_(self._lrs_rows[self.counters.applied])  # one copy; `lr` is set where it is read (_sync)
            if self.fused_step is not None:
                self.fused_step()
            else:
                self.optimizer.step()
            if self.ema is not None:
                self.ema.update()
            self.loss_acc += window_loss
        self.counters.count(applied, count)

    def _clip_gradients(self) -> torch.Tensor:
        """Global L2 norm of the gradients (returned), clipped to max_grad_norm. Two foreach calls, no host sync."""
        grads = [self.group.local(q.grad) for q in self.params if q.grad is not None]
        if not grads:
            return self._zero
        # torch's clip_grad_norm_ loops over parameters in Python on CPU; the foreach ops are one call each.
        norms = torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32))
        # FSDP: each rank holds a shard of every gradient, so the global norm sums the shards' squares.
        sharded = self.group.sharded
        total = self.group.sum_(norms.square().sum()).sqrt() if sharded else torch.linalg.vector_norm(norms)
        if self.p.max_grad_norm is not None:
            torch._foreach_mul_(grads, (self.p.max_grad_norm / (total + 1e-6)).clamp_(max=1.0))
        return total

    # --- the loop ---------------------------------------------------------------------------------------------

    def prepare(self, train: Dataset) -> Dataset:
        """Plan the run (updates per epoch, total) and build the schedule table; returns the data to train on."""
        p = self.p
        if p.overfit_batches:
            keep = epoch_order(len(train), self.seed, 0)[: p.overfit_batches * p.micro_batch * p.accumulate]
            train = train.subset(keep)
        window = p.micro_batch * p.accumulate * self.group.world_size
        epoch_samples = len(train) if not p.limit_batches else min(len(train), p.limit_batches * window)
        per_epoch = math.ceil(epoch_samples / window)
        s = self.state
        # auto is resolved once, by a fresh run; a resumed one keeps its checkpoint's number (see _restore), so a
        # resume under another world size (other windows, other updates an epoch) plans the same epochs.
        if not s.planned_epochs:
            s.planned_epochs = planned_epochs(p.epochs, per_epoch)
        epochs = s.planned_epochs
        # Updates left from the data position (a fresh run: all of them). A run resumed under another world size
        # continues from the same sample with windows of the new size, so the schedule is planned for what is left.
        # (None of this epoch, if the position is already past its end: see _run_epoch.)
        left = max(0, math.ceil((epoch_samples - s.position) / window)) + per_epoch * (epochs - s.epoch - 1)
        total = s.updates + left
        if p.max_steps is not None:
            total = min(total, p.max_steps)
        self.plan = Plan(window, per_epoch, total, epoch_samples, epochs)
        self._build_table()
        if self.graphed and (why := fallback_reason(self.group.world_size, train)):
            self.graphed = False
            self.forward = compiled(self.wrapped, True)  # nothing is compiled before the first call
            if self.group.is_main:
                print(f"train: train.compile reduce-overhead: {why}; compiling as compile: true", file=sys.stderr)
        return train

    def _build_table(self) -> None:
        p, total = self.p, self.plan.total
        warmup = round(p.warmup_fraction * total)
        self._base_table = lr_table(p.schedule, total, warmup, p.lr, p.min_lr, self.device)
        if p.schedule == "plateau" and self.plateau is None:
            self.plateau = Plateau(p.plateau_factor, p.plateau_patience, floor_scale=p.min_lr / p.lr)
        self._set_table()

    def fit(self, train: Dataset, val: Dataset) -> TrainState:
        p = self.p
        train = self.prepare(train)
        if p.overfit_batches:
            val = train  # memorising a few windows: validate on exactly those
        self._resume()
        if self.resumed_from is not None:
            self.prepare(train)  # the updates left from where the checkpoint is
        total = self.plan.total
        s = self.state
        bar = progress(total, initial=s.updates, unit="upd", desc="train", enabled=p.progress and self.group.is_main)
        self._clock = (time.perf_counter(), s.samples, s.tokens, self._flops)
        self._logged_at = s.updates
        anomaly = torch.autograd.detect_anomaly() if p.detect_anomaly else contextlib.nullcontext()
        own = Watch(p.preempt_signals, self.group) if self.preemptible and self.watch is None else None
        self._watch = self.watch or own
        if self._watch is not None:
            self._watch.start_clock(p.max_time)
        self._profiler = profiler(p.profile, self.profile_dir, self.device, self.group.rank)
        if self.group.is_main:
            (self.store.root / PREEMPTED_MARK).unlink(missing_ok=True)  # this run resumes what that one stopped
        try:
            with anomaly, own or contextlib.nullcontext(), self._profiler or contextlib.nullcontext():
                while not self._done():
                    self._run_epoch(train, val, bar)
                if s.last_eval_update != s.updates and not s.stopped_early:
                    self._evaluate(val)  # the final weights compete for "best" too
                if s.updates != self._logged_at:
                    self._log(bar)
                self._checkpoint()
        finally:
            bar.close()
            self.store.wait()  # the last checkpoint is on disk before fit() returns or raises
        self.group.barrier()
        if s.stopped_early and self.group.is_main:
            print(
                f"train: stopped early at update {s.updates} (epoch {s.epoch}): {p.monitor} did not improve by more "
                f"than {p.min_delta:g} in {p.patience} evaluations; best {s.best_metric:.4g} at update {s.best_update}",
                file=sys.stderr,
            )
        self._load_best()
        return s

    def _run_epoch(self, train: Dataset, val: Dataset, bar: Progress) -> None:
        p, s, plan = self.p, self.state, self.plan
        if s.position >= plan.epoch_samples:
            # Resumed past this epoch's end: with windows of another size (another batch size or world size),
            # train.limit_batches or train.overfit_batches make the epoch shorter than the checkpoint's was. The epoch
            # is over; without this, fit() would call this method forever with nothing to do.
            if self.group.is_main:
                print(
                    f"train: resumed at sample {s.position} of epoch {s.epoch}, past the {plan.epoch_samples} samples "
                    f"an epoch now takes in windows of {plan.window} (train.limit_batches, train.overfit_batches); "
                    "the next epoch starts",
                    file=sys.stderr,
                )
            s.epoch, s.position = s.epoch + 1, 0
            return
        # The order goes where the dataset gathers (the device, for tables): no host-to-device copy per batch.
        orders = getattr(train, "epoch_order", None)  # text: length-bucketed, still a function of (seed, epoch)
        order = (orders(self.seed, s.epoch) if orders else epoch_order(len(train), self.seed, s.epoch)).to(
            train.index_device
        )
        group = self.group
        while s.position < plan.epoch_samples:
            idx = order[s.position : min(s.position + plan.window, plan.epoch_samples)]
            shard = group.shard(idx, p.micro_batch * p.accumulate)  # this rank's samples (one process: all)
            mine = [idx] if p.accumulate == 1 and not group.distributed else list(shard.split(p.micro_batch))
            if group.distributed:  # every rank runs `accumulate` micro-batches (some empty): collectives line up
                mine += [idx[:0]] * (p.accumulate - len(mine))
            micro = [train.batch(i) for i in mine]
            with self.running_stats.merged(len(idx)):
                self.train_step(micro, train.count(idx))  # the loss terms of the whole window, every rank's
            s.updates += 1
            s.position += len(idx)
            s.samples += len(idx)
            s.tokens += train.tokens(idx)  # the whole window's, every rank's, as samples
            if self.peak_flops and self.flops_per_batch is not None:
                self._flops += sum(self.flops_per_batch(b) for b in micro)
            bar.update(1)
            if self._profiler is not None:
                self._profiler.step()
            failpoint("update")
            epoch_end = s.position == plan.epoch_samples
            if epoch_end:
                s.epoch, s.position = s.epoch + 1, 0
            if s.updates % p.log_every == 0:
                self._log(bar)
            if (p.eval_every and s.updates % p.eval_every == 0) or (p.eval_every is None and epoch_end):
                self._evaluate(val)
            if epoch_end or (p.checkpoint_every and s.updates % p.checkpoint_every == 0):
                self._checkpoint()
            if self._done():
                return
            if self._watch is not None and (why := self._watch.due_after_update()):
                self._preempt(why)
            if epoch_end:
                return

    def _preempt(self, why: str) -> NoReturn:
        """Checkpoint here (whole: weights, optimizer, data position, RNG), wait until it is on disk on every rank,
        and stop with Preempted: the rerun resumes from this update, bit for bit."""
        s = self.state
        self._checkpoint()
        self.store.wait()
        if self.group.is_main:  # for a job script that sees a launcher's exit code rather than ours (torchrun: 1)
            write_json(self.store.root / PREEMPTED_MARK, {"update": s.updates, "why": why, "at": time.time()})
        self.group.barrier()  # no rank exits (and gets its siblings killed) before rank 0's checkpoint is written
        raise Preempted(
            f"train: {why}: stopped after update {s.updates} of {self.plan.total} (epoch {s.epoch}) with a checkpoint "
            f"in {self.store.path(s.updates)}; rerun to resume from it (exit code {PREEMPTED}: preempted, resumable)"
        )

    def _done(self) -> bool:
        s = self.state
        return s.stopped_early or s.epoch >= self.plan.epochs or s.updates >= self.plan.total

    def _set_table(self) -> None:
        scale = self.plateau.scale if self.plateau else 1.0
        self._table = self._base_table * scale if scale != 1.0 else self._base_table
        self._rates = self._table.tolist()  # exactly the float32 rates, for the host-side path
        # Each update's per-group rates, the products `_step_on_device` makes (float32 rate x scale, bit for bit).
        self._lrs_rows = self._table[:, None] * self.lr_scales[None, :]

    # --- reading the device: logging, evaluation ------------------------------------------------------------------

    def _sync(self) -> dict[str, float]:
        """Read every device counter in one transfer, and stop if too many updates in a row were non-finite."""
        s, c = self.state, self.counters
        if not self.decide_on_device and c.applied:  # the host path leaves `lr` to here: the last applied update's
            self.lr.fill_(self._rates[c.applied - 1])
        self.group.sum_(self.loss_acc)  # each rank summed the loss of its own samples
        rates = list(self.lrs.unbind()) if self.group_names else []
        values = [self.loss_acc, self.grad_norm, self.lr, *rates]
        if isinstance(c, DeviceCounters):  # everything in one transfer
            read = torch.stack([t.double() for t in values + c.tensors()]).tolist()
            c.reset_reads()
            counts = read[len(values) :]
        else:
            read, counts = [t.item() for t in values], list(c.read())
        loss_acc, grad_norm, lr, *group_lrs = read[: len(values)]
        applied, terms, consecutive, worst = (int(v) for v in counts)
        s.applied, s.consecutive_nonfinite = applied, consecutive
        s.loss_terms += terms
        s.loss_sum += loss_acc  # in float64 on the host; the device sums only since the last read
        self.loss_acc.zero_()
        if worst >= self.p.max_nonfinite + (FP16_PROBES if self.scaler.is_enabled() else 0):
            raise NonFiniteError(
                f"train: {int(worst)} consecutive updates had a non-finite loss or gradient (by update {s.updates}, "
                f"epoch {s.epoch}); lower train.lr, set train.max_grad_norm, or use fp32 "
                "(train.detect_anomaly: true names the op that produced it). "
                f"The last good checkpoint is kept in {self.store.root}."
            )
        return {"loss_total": s.loss_sum, "grad_norm": grad_norm, "lr": lr} | {
            f"lr/{name}": rate for name, rate in zip(self.group_names, group_lrs, strict=True)
        }

    def _mean_loss(self, loss_sum: float, terms: int) -> float:
        """The mean train loss over `terms` loss terms, in the units the objective reports (regression: target's)."""
        return loss_sum / max(terms, 1) * self.objective.loss_unit

    def _log(self, bar: Progress) -> None:
        s = self.state
        dev = self._sync()
        t0, samples0, tokens0, flops0 = self._clock
        now = time.perf_counter()
        elapsed = max(now - t0, 1e-9)
        record = {
            "train_loss": self._mean_loss(dev["loss_total"] - s.loss_at_log, s.loss_terms - s.terms_at_log),
            "lr": dev["lr"],
            **{k: v for k, v in dev.items() if k.startswith("lr/")},
            "grad_norm": dev["grad_norm"],
            "skipped_updates": float(s.updates - s.applied),
            "samples_per_s": (s.samples - samples0) / elapsed,
        }
        if s.tokens:
            record["tokens_per_s"] = (s.tokens - tokens0) / elapsed
        if self.peak_flops and self.flops_per_batch is not None:
            record["mfu"] = (self._flops - flops0) / elapsed / self.peak_flops
        s.loss_at_log, s.terms_at_log = dev["loss_total"], s.loss_terms
        self._clock = (now, s.samples, s.tokens, self._flops)
        self._logged_at = s.updates
        self.logger.log(record, step=s.updates)
        bar.set_postfix(loss=f"{record['train_loss']:.4f}", lr=f"{record['lr']:.2e}", refresh=False)

    @torch.no_grad()
    def evaluate(self, data: Dataset, batch_size: int = 1024) -> dict[str, float]:
        """Validation metrics (val_loss, val_accuracy, val_ece or val_rmse/val_r2), summed on the device, read once;
        val_roc_auc and val_pr_auc too when train.monitor is one of them.

        The val set is cut into batches of `batch_size`, dealt round-robin to the ranks (no padding: a rank without a
        batch left runs an empty one, so FSDP's collectives line up). Each batch's sums land in its own row, the rows
        are summed across ranks (adding zeros is exact) and then in batch order: the same numbers one process gets.
        The ranked metrics need every sample's class probabilities: each batch writes them (and its labels) to its own
        rows of [N, classes] and [N] tensors, zeros elsewhere, summed across ranks the same way and ranked on the
        device; their values come back in the same single read."""
        g = self.group
        self.model.eval()
        n_batches = math.ceil(len(data) / batch_size)
        if self.p.limit_batches:
            n_batches = min(n_batches, self.p.limit_batches)
        rows = torch.zeros(n_batches, len(self.objective.sum_names), dtype=torch.float64, device=self.device)
        ranked = self.objective.wants_scores(self.p.monitor)
        n = min(len(data), n_batches * batch_size) if ranked else 0
        scores: torch.Tensor | None = None  # [n, classes], made at the first forward (which tells the classes)
        labels = torch.zeros(n, dtype=torch.long, device=self.device)
        for b in range(g.rank, math.ceil(n_batches / g.world_size) * g.world_size, g.world_size):
            start, stop = (b * batch_size, min((b + 1) * batch_size, len(data))) if b < n_batches else (0, 0)
            batch = data.batch(torch.arange(start, stop, device=data.index_device))
            with self.precision.autocast():
                out = self.forward(**batch.inputs)
            if b < n_batches:
                sums = self.objective.eval_sums(out, batch.target, batch.count)
                # A Python number (the batch's count) is filled on the device: torch.as_tensor would copy it from
                # the host, a blocking copy on a GPU (tests/engine/test_eval_host_sync.py refuses it).
                parts = [
                    v.to(self.device, torch.float64).reshape(-1) if isinstance(v, torch.Tensor)
                    else torch.full((1,), float(v), dtype=torch.float64, device=self.device)
                    for v in sums
                ]  # fmt: skip
                rows[b] = torch.cat(parts)
            if ranked:
                if batch.target.dim() != 1:
                    why = f"{self.p.monitor} ranks one score per sample; per-token targets have val_loss, val_accuracy"
                    raise ParamsError("params.yaml", [("train.monitor", f"{why} and val_ece")])
                if scores is None:
                    scores = torch.zeros(n, out.shape[-1], device=self.device)
                scores[start:stop] = self.objective.scores(out)  # an empty batch writes nothing
                labels[start:stop] = batch.target
        self.model.train()
        names, totals = self.objective.sum_names, g.sum_(rows).sum(0)
        if ranked:  # (no batch at all: no scores, and NaNs)
            everyone = g.sum_(scores if scores is not None else torch.zeros(0, 2, device=self.device))
            names = (*names, *self.objective.ranked_names)
            totals = torch.cat([totals, self.objective.ranked_sums(everyone, g.sum_(labels))])
        values = totals.tolist()  # the one host read
        return self.objective.metrics(dict(zip(names, values)))

    def _evaluate(self, val: Dataset) -> None:
        p, s = self.p, self.state
        with self.ema.swapped_in() if self.ema is not None else contextlib.nullcontext():
            metrics = self.evaluate(val)  # with EMA, the averaged weights are the ones validated
        if p.monitor not in metrics:
            raise ParamsError(
                "params.yaml",
                [("train.monitor", f"{p.monitor} is not measured for this task; choose one of {sorted(metrics)}")],
            )
        dev = self._sync()
        value = metrics[p.monitor]
        if s.best_metric is None:
            improved = math.isfinite(value)
        elif p.minimize:
            improved = value < s.best_metric - p.min_delta
        else:
            improved = value > s.best_metric + p.min_delta
        if improved:
            s.best_metric, s.best_update, s.bad_evals = value, s.updates, 0
        else:
            s.bad_evals += 1
            s.stopped_early = s.bad_evals >= p.patience
        if self.plateau is not None and self.plateau.observe(improved):
            self._set_table()
        record = {
            "update": float(s.updates),
            "epoch": s.epoch + s.position / max(self.plan.epoch_samples, 1),
            "train_loss": self._mean_loss(dev["loss_total"] - s.loss_at_eval, s.loss_terms - s.terms_at_eval),
            **metrics,
            "lr": dev["lr"],
        }
        s.loss_at_eval, s.terms_at_eval, s.last_eval_update = dev["loss_total"], s.loss_terms, s.updates
        s.history.append(record)
        self.logger.log({k: v for k, v in record.items() if k.startswith("val_")}, step=s.updates)
        if improved:
            self._checkpoint()  # the best weights are a checkpoint of their own, kept by retention

    # --- checkpoints ------------------------------------------------------------------------------------------

    def _checkpoint(self) -> None:
        s = self.state
        if s.checkpoint_update == s.updates:
            if s.best_update == s.updates != self._saved_best and self.group.is_main:
                # Written before an evaluation of the same weights found them the best (the final one, or the first
                # after resuming from this very checkpoint): it, and best.json, must name this update.
                plateau = asdict(self.plateau) if self.plateau else None
                self.store.name_best(s.updates, {"state": asdict(s), "plateau": plateau})
                self._best_weights = None  # _load_best reads them back from that checkpoint
                self._saved_best = s.updates
            return
        self._sync()  # never save after too many non-finite updates (and fill in s.applied)
        s.checkpoint_update = s.updates
        self._saved_best = s.best_update  # the best update this checkpoint's meta names
        # Every rank takes part (FSDP gathers the shards; each rank's RNG is kept); rank 0 alone writes.
        weights, optimizer = self.group.full_state(self.model, self.optimizer)
        rngs = self.group.gather(capture_rng())
        if rngs is None:
            return
        assert optimizer is not None
        opt_tensors, opt_meta = flatten_optimizer(optimizer)
        opt_meta["param_names"] = self.param_order
        (rng_tensors, rng_meta), others = rngs[0], rngs[1:]
        meta = {
            "fingerprint": self.fingerprint,
            "state": asdict(s),
            "plateau": asdict(self.plateau) if self.plateau else None,
            "best_step": self.store.path(s.best_update).name if s.best_update >= 0 else None,
            "optimizer": opt_meta,
            "scaler": self.scaler.state_dict(),
            "rng": rng_meta,
            "rng_ranks": [m for _, m in others],  # ranks 1.. (tensor groups rng_rank1, ...)
            "position_unit": "samples",
            "world_size": self.group.world_size,
            "params": self.p.model_dump(),
            "flops": self._flops,
        }
        tensors = {"model": weights, "optimizer": opt_tensors, "rng": rng_tensors}
        if self.ema is not None:
            tensors["ema"] = self.ema.state()
        tensors |= {f"rng_rank{r}": t for r, (t, _) in enumerate(others, start=1)}
        snapshot = self.store.save_async(s.updates, tensors, meta)
        if s.best_update == s.updates:  # export these without reading them back
            self._best_weights = (s.updates, self._exported(snapshot))

    def _resume(self) -> None:
        """Rank 0 picks the checkpoint to continue from (or none), every rank loads it."""
        chosen = self._choose_checkpoint() if self.group.is_main else None
        chosen = self.group.broadcast(chosen)
        if chosen is not None:
            self._restore(load_checkpoint(Path(chosen)), Path(chosen))
            self._resumed_root = Path(chosen).parent

    def _choose_checkpoint(self) -> str | None:
        p = self.p
        self.store.remove_partial()
        if p.resume == "never":
            if n := self.store.clear():
                print(f"train: train.resume is never; removed {n} earlier checkpoint(s)", file=sys.stderr)
            return None
        if p.resume == "auto":
            path = self.store.latest()
            if path is None:
                return None
            if load_checkpoint(path).meta.get("fingerprint") != self.fingerprint:
                # A changed lr or changed data must retrain, not "resume" a finished run and change nothing.
                n = self.store.clear()
                print(
                    f"train: the {n} checkpoint(s) in {self.store.root} are from other training params, code or data;"
                    " starting fresh",
                    file=sys.stderr,
                )
                return None
        else:
            path = Path(p.resume)
            if path.is_dir() and not (path / "meta.json").exists():
                path = CheckpointStore(path, 1).latest() or path  # a checkpoints folder: its newest checkpoint
            if not path.is_dir():
                raise ParamsError("params.yaml", [("train.resume", f"checkpoint directory {p.resume} does not exist")])
            meta = load_checkpoint(path).meta
            if meta.get("fingerprint") != self.fingerprint:
                saved = meta.get("params", {})
                differ = [f"train.{k}" for k, v in self.p.model_dump().items() if k in saved and saved[k] != v]
                which = f" ({', '.join(differ)} among them)" if differ else ""
                print(
                    f"train: continuing from {path}, written with other params or data{which}: its weights, optimizer "
                    "moments and progress continue under the current params",
                    file=sys.stderr,
                )
        return str(path)

    def _restore(self, ckpt: Checkpoint, path: Path) -> None:
        saved_optimizer = ckpt.meta.get("params", {}).get("optimizer", self.p.optimizer)
        if saved_optimizer != self.p.optimizer:
            raise CheckpointError(
                f"checkpoint {path} holds the state of {saved_optimizer}, but train.optimizer is {self.p.optimizer}: "
                f"one optimizer's moments cannot continue another's; set train.optimizer: {saved_optimizer} to "
                "continue it, or start fresh with train.resume: never"
            )
        try:
            optimizer = self._optimizer_state(unflatten_optimizer(ckpt.tensors["optimizer"], ckpt.meta["optimizer"]))
            self.group.load_state(self.model, self.optimizer, ckpt.tensors["model"], optimizer)
            for g, group in enumerate(self.optimizer.param_groups):
                group["lr"] = self.lrs[g]  # the device tensor the schedule writes into
            if self.fused_step is not None:
                self.fused_step.refresh()  # the state tensors just loaded
            if self.ema is not None:  # a checkpoint without one (resume: <path> of a run without EMA) starts it anew
                self.ema.load(ckpt.tensors.get("ema") or dict(zip(self.ema.names, self.ema.targets, strict=True)))
            if self.scaler.is_enabled() and ckpt.meta["scaler"]:
                self.scaler.load_state_dict(ckpt.meta["scaler"])
            self.state = TrainState(**ckpt.meta["state"])
            if self.p.epochs != "auto" or ckpt.meta.get("params", {}).get("epochs") != "auto":
                self.state.planned_epochs = 0  # a number, or a checkpoint of another train.epochs: planned anew
            if "consecutive_nonfinite" in ckpt.meta:  # written by trainflow 0.1.0, before it moved into the state
                self.state.consecutive_nonfinite = int(ckpt.meta["consecutive_nonfinite"])
            if ckpt.meta.get("position_unit") != "samples":  # trainflow <= 0.2: windows of one process
                saved = ckpt.meta["params"]
                self.state.position *= saved["batch_size"] * saved["accumulate"]
            self.counters.restore(self.state.applied, self.state.consecutive_nonfinite)
            self._restore_rng(ckpt)
            if self.plateau is not None and ckpt.meta.get("plateau"):
                self.plateau = Plateau(**ckpt.meta["plateau"])
            self._flops = float(ckpt.meta.get("flops", 0.0))
        except (KeyError, TypeError, RuntimeError, ValueError) as exc:
            raise CheckpointError(
                f"checkpoint {path} does not fit this model and trainer ({type(exc).__name__}: {exc}); {repair(path)}"
            ) from None
        s = self.state
        self.resumed_from = s.updates
        self._saved_best = s.best_update
        if self.group.is_main:
            print(
                f"train: resumed from {path} at update {s.updates} (epoch {s.epoch}, sample {s.position} of its order)",
                file=sys.stderr,
            )

    def _optimizer_state(self, saved: dict[str, Any]) -> dict[str, Any]:
        """The saved optimizer state in this optimizer's layout: each parameter's state tensors (moments, step) from
        the checkpoint, found by name; the groups and every hyperparameter (weight decay, momentum, rates) as the
        current params make them. `resume: <path>` under other params trains with the params it says it uses."""
        names = saved.get("param_names")
        if names is None:  # written before trainflow saved the names: the same layout, or load_state says it differs
            return {"state": saved["state"], "param_groups": saved["param_groups"]}
        by_name = {names[int(i)]: state for i, state in saved["state"].items()}
        current = self.optimizer.state_dict()
        state = {i: by_name[name] for i, name in enumerate(self.param_order) if name in by_name}
        return {"state": state, "param_groups": current["param_groups"]}

    def _restore_rng(self, ckpt: Checkpoint) -> None:
        """Each rank continues its own random streams; a rank the checkpoint did not have (resumed on more processes)
        starts them from (seed, rank, update), and so does a GPU it has no state for (resumed on more GPUs)."""
        rank = self.group.rank
        seed = self.seed * 1_000_003 + rank * 10_007 + self.state.updates
        if rank == 0:
            reseeded = restore_rng(ckpt.tensors["rng"], ckpt.meta["rng"], reseed=seed)
        elif f"rng_rank{rank}" in ckpt.tensors:
            reseeded = restore_rng(ckpt.tensors[f"rng_rank{rank}"], ckpt.meta["rng_ranks"][rank - 1], reseed=seed)
        else:
            torch.manual_seed(seed)  # the CPU's and every GPU's stream
            return
        mine = self.device.index if self.device.index is not None else 0
        if self.device.type == "cuda" and mine in reseeded:
            saved = sum(1 for k in ckpt.tensors["rng"] if k.startswith("cuda"))
            print(
                f"train: the checkpoint holds the random state of {saved} GPU(s), none for cuda:{mine} (rank {rank}); "
                "its stream starts anew from (seed, rank, update), so random ops on it (dropout) differ from an "
                "uninterrupted run from here on",
                file=sys.stderr,
            )

    def _exported(self, tensors: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """The weights to export from a checkpoint's tensors: the model's, with EMA its averaged parameters."""
        if self.ema is None:
            return tensors["model"]
        return self.ema.overlay(self.model, tensors["model"], tensors["ema"])

    def _load_best(self) -> None:
        """Set `final_weights` (rank 0) to the best weights seen (by `monitor`), which is what gets exported, or the
        last ones; one process also leaves its model holding them."""
        s, main = self.state, self.group.is_main
        best: dict[str, torch.Tensor] | None = None
        if main and s.best_update >= 0:
            path = self.store.path(s.best_update)
            if not path.is_dir() and self._resumed_root is not None:  # a best from before a resume: <path>
                path = self._resumed_root / path.name
            if self._best_weights is not None and self._best_weights[0] == s.best_update:
                best = self._best_weights[1]
            elif path.is_dir():
                best = self._exported(load_checkpoint(path).tensors)
            else:
                print(f"train: the best checkpoint {path} is gone; keeping the last weights", file=sys.stderr)
        if self.group.broadcast(best is None):  # every rank takes part in gathering the last weights
            last = self.group.full_state(self.model, None)[0]
            best = self._exported({"model": last, "ema": self.ema.state()} if self.ema is not None else {"model": last})
        if not main:
            return
        assert best is not None
        self.final_weights = best
        if not self.group.sharded:
            self.model.load_state_dict(best)
