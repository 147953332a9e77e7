"""Everything about ranks, in one place: start them, wrap the model, split the data, reduce, gather, write from one.

The engine trains on N processes through PyTorch's own machinery: `elastic_launch` (what torchrun runs) starts the
ranks, DDP or FSDP2 (`fully_shard`) syncs the gradients. What we add is exactness:

- Each update's global window of `batch_size * accumulate * world_size` samples (the order still a function of
  (seed, epoch) only) is cut, in rank order, into shares of `batch_size * accumulate` samples, and each share into
  micro-batches of `batch_size`: exactly the micro-batches one process with `accumulate * world_size` cuts from the
  window, no padding, no duplicates. A partial last window leaves the last ranks a shorter share, or none. Every rank
  runs `accumulate` micro-batches, some possibly empty, so the collectives of FSDP2 (one per forward) and DDP (one per
  synced backward) line up.
- Gradients are **summed** across ranks (a DDP comm hook; FSDP2's divide factor of 1), and each rank seeds its backward
  with 1 / (the loss terms of the whole global window): the update is the global window's summed loss divided once,
  the same as one process with `accumulate * world_size` micro-batches. Only SUM reductions are used (gloo has no
  PREMUL_SUM/AVG for this).
- Gradients sync on a window's last micro-batch only (DDP `no_sync`, FSDP2 `set_requires_gradient_sync`).
- BatchNorm normalises each micro-batch with that micro-batch's statistics, on its rank; the micro-batches being one
  process's, so are the gradients (one process's with `accumulate * world_size` micro-batches, not with the whole
  window in one: BatchNorm makes accumulation differ from a large batch, on one process as on many). After every
  window the ranks' running statistics are merged into exactly those one process holds (`RunningStats`).
  `sync_batchnorm` (torch's SyncBatchNorm, CUDA only) instead normalises over every rank's k-th micro-batch at once.

A `Group` of one process is the default everywhere, and all of this collapses to plain single-process code for it.
The CUDA/nccl path differs from the CPU/gloo one only in the backend and the device, so the CPU tests cover its logic.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import socket
import sys
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from trainflow.core.errors import ParamsError, Preempted, ServiceError, UserError

if TYPE_CHECKING:
    from trainflow.engine.preempt import Watch

# A rank that waits this long in a collective has lost a peer: fail, never hang. Long enough for a checkpoint write.
TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("TRAINFLOW_COLLECTIVE_TIMEOUT", "120")))


def launched() -> bool:
    """Whether this process is a rank started by torchrun / elastic_launch (RANK and WORLD_SIZE set)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def resolve_world_size(requested: int | str, device: torch.device) -> int:
    """train.world_size: an int, or auto = the visible GPUs (1 on CPU). Under torchrun, WORLD_SIZE wins."""
    if launched():
        return int(os.environ["WORLD_SIZE"])
    if requested == "auto":
        return max(torch.cuda.device_count(), 1) if device.type == "cuda" else 1
    return int(requested)


def backend_for(requested: str, device: torch.device) -> str:
    return ("nccl" if device.type == "cuda" else "gloo") if requested == "auto" else requested


@dataclass(frozen=True)
class Group:
    """This process's place among the ranks of one training run. `Group()` is a single process."""

    rank: int = 0
    world_size: int = 1
    strategy: str = "ddp"  # ddp | fsdp

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def sharded(self) -> bool:
        """FSDP: each rank holds a shard of every parameter, gradient and optimizer state."""
        return self.distributed and self.strategy == "fsdp"

    # --- model --------------------------------------------------------------------------------------------------

    def wrap(self, model: nn.Module, device: torch.device, sync_batchnorm: bool = False) -> nn.Module:
        """The module to run forward/backward through: the model itself, DDP around it, or it, fully sharded.

        DDP sums gradients (a comm hook) instead of averaging them; FSDP2's divide factor of 1 does the same.
        sync_batchnorm: the model's BatchNorm layers become SyncBatchNorm first (in place: the saved state keeps
        BatchNorm's keys), which torch runs on CUDA only."""
        if not self.distributed:
            return model  # SyncBatchNorm over one rank is BatchNorm
        if sync_batchnorm:
            if device.type == "cpu":
                raise ParamsError(
                    "params.yaml",
                    [("train.sync_batchnorm", "torch's SyncBatchNorm runs on CUDA only; set it to false on the CPU "
                      "(each rank's BatchNorm then normalises its own micro-batches, the ones one process would)")],
                )  # fmt: skip
            nn.SyncBatchNorm.convert_sync_batchnorm(model)
        if self.strategy == "fsdp":
            from torch.distributed.fsdp import FSDPModule, fully_shard

            for unit in _shard_units(model):  # params gathered one unit at a time
                fully_shard(unit)
            fully_shard(model)
            for module in model.modules():  # each unit reduces its own gradients: every one must SUM
                if isinstance(module, FSDPModule):
                    module.set_gradient_divide_factor(1.0)
                    module.set_force_sum_reduction_for_comms(True)
            return model
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        ddp.register_comm_hook(None, _sum_hook)
        _DDPS.add(ddp)  # `shutdown` takes its reducer
        return ddp

    def gradient_sync(self, wrapped: nn.Module, enabled: bool) -> contextlib.AbstractContextManager[object]:
        """Sync gradients in this backward (a window's last micro-batch) or only accumulate them locally."""
        if not self.distributed or enabled:
            return _NO_CHANGE
        if self.sharded:
            return _fsdp_no_sync(wrapped)
        return wrapped.no_sync()  # type: ignore[operator,no-any-return]

    # --- data ---------------------------------------------------------------------------------------------------

    def shard(self, idx: torch.Tensor, share: int) -> torch.Tensor:
        """This rank's part of a global window: the `share` (batch_size * accumulate) samples after the lower ranks'.
        Cut into micro-batches of batch_size, they are the ones one process cuts from the window (so are BatchNorm's
        statistics); nothing padded or repeated. A partial last window leaves the last ranks less, or nothing."""
        if not self.distributed:
            return idx
        return idx[self.rank * share : (self.rank + 1) * share]

    def micro_batches(self, window: int, share: int, micro_batch: int) -> list[int]:
        """How many micro-batches with samples in them each rank runs (rank order) for a window of `window` samples."""
        return [math.ceil(min(max(window - r * share, 0), share) / micro_batch) for r in range(self.world_size)]

    # --- reductions ---------------------------------------------------------------------------------------------

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """In place: the sum of `tensor` over all ranks (on the device; no host sync)."""
        if self.distributed:
            import torch.distributed as dist

            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (small host objects: a path, a decision)."""
        if not self.distributed:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj`, in rank order, on rank 0 (None elsewhere)."""
        if not self.distributed:
            return [obj]
        import torch.distributed as dist

        out: list[Any] | None = [None] * self.world_size if self.is_main else None
        dist.gather_object(obj, out, dst=0)
        return out

    # --- state ----------------------------------------------------------------------------------------------------

    def full_state(
        self, model: nn.Module, optimizer: torch.optim.Optimizer | None
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
        """The whole (unsharded) model state dict and the optimizer's (torch's format: integer parameter ids), as a
        single process would have them. FSDP: gathered to rank 0, every rank must call this (others get empties)."""
        if not self.sharded:
            return dict(model.state_dict()), optimizer.state_dict() if optimizer is not None else None
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights: dict[str, torch.Tensor] = get_model_state_dict(model, options=options)  # type: ignore[assignment]
        if optimizer is None:
            return weights, None
        by_name = get_optimizer_state_dict(model, optimizer, options=options)
        return weights, (_names_to_ids(by_name) if self.is_main else None)

    def load_state(
        self, model: nn.Module, optimizer: torch.optim.Optimizer | None, weights: dict[str, torch.Tensor],
        optim: dict[str, Any] | None,
    ) -> None:  # fmt: skip
        """Load a whole state (as `full_state` returns it, read by every rank) into this rank's model and optimizer."""
        if not self.sharded:
            model.load_state_dict(weights)
            if optimizer is not None and optim is not None:
                optimizer.load_state_dict(optim)
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(model, dict(weights), options=options)  # type: ignore[arg-type]  # it shards in place
        if optimizer is not None and optim is not None:
            set_optimizer_state_dict(model, optimizer, _ids_to_names(optim, model, optimizer), options=options)

    def local(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's shard of a (possibly sharded) tensor."""
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor  # type: ignore[no-any-return]


class RunningStats:
    """BatchNorm's running statistics on several ranks, merged after every window into those one process holds.

    One process folds each micro-batch's statistics s_k (mean, unbiased variance) into a running average, one
    micro-batch after the other: r <- (1 - m) r + m s_k. After a window of A micro-batches that is
    r = (1 - m)^A r0 + sum_k (1 - m)^(A - k) m s_k, linear in the s_k. The ranks hold consecutive runs of the window's
    micro-batches (`Group.shard`), so each rank folds its own into zeros and scales the result by (1 - m)^(the
    micro-batches of the ranks after it); one all-reduce SUM of those, plus (1 - m)^A r0, is one process's r, on every
    rank (the same terms added in another order: equal within float rounding). momentum None (a cumulative average,
    the mean of every s_k so far) merges the same way with counts for weights. num_batches_tracked grows by the
    window's micro-batches that had samples, as on one process. So validation, checkpoints and the export see one
    process's statistics, whichever rank they read. (DDP still broadcasts rank 0's buffers before a window's first
    forward, for any other buffers a model keeps: the statistics are zeros on every rank then.)

    Cost per update, only with several ranks and BatchNorm layers: a copy of the statistics and one all-reduce of two
    floats per channel, on the device. SyncBatchNorm layers are left alone: they hold every rank's statistics already.
    """

    def __init__(self, group: Group, model: nn.Module, micro_batch: int, accumulate: int) -> None:
        self.group, self.micro_batch, self.share = group, micro_batch, micro_batch * accumulate
        per_rank = [m for m in model.modules() if isinstance(m, _BatchNorm) and not isinstance(m, nn.SyncBatchNorm)]
        self.norms = [m for m in per_rank if m.track_running_stats] if group.distributed else []

    def merged(self, window: int) -> contextlib.AbstractContextManager[object]:
        """Around the forwards of one window of `window` samples (all ranks'): its statistics merged at the end."""
        if not self.norms:
            return _NO_CHANGE
        return self._merging(self.group.micro_batches(window, self.share, self.micro_batch))

    @contextlib.contextmanager
    def _merging(self, counts: list[int]) -> Iterator[None]:
        stats = [s for m in self.norms for s in _buffers(m)[:2]]  # mean_0, var_0, mean_1, ...
        tracked = [_buffers(m)[2] for m in self.norms]
        start, tracked_before = [s.clone() for s in stats], [t.clone() for t in tracked]
        for t in stats + tracked:
            t.zero_()  # training normalises with the batch's statistics: these are only written, never read
        try:
            yield
        except BaseException:
            for t, before in zip(stats + tracked, start + tracked_before, strict=True):
                t.copy_(before)
            raise
        rank, total = self.group.rank, sum(counts)
        own, kept = [], []  # per buffer: the weight of what this rank folded in, and that of r0
        for m, before in zip(self.norms, tracked_before, strict=True):
            if m.momentum is None:  # r = (n0 r0 + sum of this window's s_k) / (n0 + A); a rank's own is its mean
                n0 = int(before)  # a host read, as the layer itself makes one per forward for this
                weights = (counts[rank] / (n0 + total), n0 / (n0 + total))
            else:
                decay = 1.0 - m.momentum
                weights = (decay ** sum(counts[rank + 1 :]), decay**total)
            own += [weights[0]] * 2
            kept += [weights[1]] * 2
        torch._foreach_mul_(stats, own)
        flat = self.group.sum_(torch.cat([s.reshape(-1) for s in stats]))  # one all-reduce for every layer
        torch._foreach_copy_(stats, [v.view_as(s) for v, s in zip(flat.split([s.numel() for s in stats]), stats)])
        torch._foreach_mul_(start, kept)
        torch._foreach_add_(stats, start)
        torch._foreach_add_(tracked_before, total)
        torch._foreach_copy_(tracked, tracked_before)


def _buffers(norm: _BatchNorm) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """running_mean, running_var, num_batches_tracked of a layer that tracks them."""
    assert norm.running_mean is not None and norm.running_var is not None and norm.num_batches_tracked is not None
    return norm.running_mean, norm.running_var, norm.num_batches_tracked


# Every DDP `Group.wrap` made in this process and not yet shut down, while anything else holds it.
_DDPS: weakref.WeakSet[nn.Module] = weakref.WeakSet()

_NO_CHANGE = contextlib.nullcontext()  # reusable: the one-process step pays nothing for the distributed case


@contextlib.contextmanager
def _fsdp_no_sync(wrapped: nn.Module) -> Iterator[None]:
    wrapped.set_requires_gradient_sync(False)  # type: ignore[operator]
    try:
        yield
    finally:
        wrapped.set_requires_gradient_sync(True)  # type: ignore[operator]


def _shard_units(model: nn.Module) -> Iterator[nn.Module]:
    """The model's direct children with parameters, each its own FSDP unit; containers without a forward
    (ModuleList, ModuleDict: a transformer's layers) contribute their items instead."""
    for child in model.children():
        if isinstance(child, nn.ModuleList | nn.ModuleDict):
            yield from _shard_units(child)
        elif any(p.requires_grad for p in child.parameters()):
            yield child


def _sum_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects annotations it cannot evaluate
    """DDP comm hook: all-reduce each gradient bucket with SUM (DDP's default divides by the world size)."""
    import torch.distributed as dist

    work = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.SUM, async_op=True)
    assert work is not None
    return work.get_future().then(lambda fut: fut.value()[0])


def _param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The optimizer's parameters by name, in its own order (the order its state dict numbers them)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]


def _names_to_ids(state: dict[str, Any]) -> dict[str, Any]:
    """torch.distributed's optimizer state dict (keyed by parameter name) in torch's own format (integer ids)."""
    order = [name for g in state["param_groups"] for name in g["params"]]
    ids = {name: i for i, name in enumerate(order)}
    groups = [{**g, "params": [ids[n] for n in g["params"]]} for g in state["param_groups"]]
    return {"state": {ids[n]: s for n, s in state["state"].items()}, "param_groups": groups}


def _ids_to_names(state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    names = _param_names(model, optimizer)
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]
    return {"state": {names[int(i)]: s for i, s in state["state"].items()}, "param_groups": groups}


# --- processes ------------------------------------------------------------------------------------------------------


def init(world_size: int, strategy: str, backend: str, device: torch.device) -> Group:
    """Join the process group torchrun / elastic_launch set up (RANK, WORLD_SIZE, MASTER_ADDR in the environment), or
    return a single-process group."""
    if not launched() or world_size == 1:
        return Group(strategy=strategy)
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=TIMEOUT)
    return Group(rank=rank, world_size=dist.get_world_size(), strategy=strategy)


def shutdown(group: Group) -> None:
    """Leave the process group, after every DDP still alive has dropped its reducer.

    Freeing a gloo group joins its worker threads, which may need the GIL to finish what they hold: the comm hook's
    Python callback (run and dropped by the thread that completes the all-reduce), and any collective started in a
    backward (its saved thread state holds that backward's Python context). The group's Python handles release the
    GIL while they join; DDP's reducer, a C++ object freed with the GIL held, does not. Were its reference the last
    (a model freed after this), the process would hang at teardown. Freed here, while the group is still registered,
    the reducer never frees the group: the last Python handle does."""
    if group.distributed:
        import torch.distributed as dist

        for ddp in list(_DDPS):
            del ddp.reducer, ddp.logger  # the reducer's two holders: the logger keeps a reference to it
        _DDPS.clear()
        if dist.is_initialized():
            dist.destroy_process_group()


def device_for(requested: torch.device) -> torch.device:
    """The device of this rank: cuda:LOCAL_RANK when launched on GPUs."""
    if requested.type == "cuda" and launched():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return requested


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RankFailed(ServiceError):
    """A rank of a distributed run died (killed, crashed); the others were stopped. Exit code 1, like a service
    failure: rerunning resumes from the last checkpoint, so Prefect's retries apply."""


def launch(world_size: int, entrypoint: Callable[..., Any], *args: Any, watch: Watch | None = None) -> Any:
    """Run `entrypoint(*args)` on `world_size` local processes with torch's elastic launcher (c10d rendezvous on
    127.0.0.1, a free port) and return rank 0's result. One rank failing stops the others within seconds; its error
    is raised here (a UserError of a rank keeps its exit code 2).

    `watch` (the train stage's): the signals it catches are passed on to the ranks, which catch them too and stop at
    the same point (in training: after the same update, with a checkpoint); their Preempted is raised here. torch's
    launcher handles only the others: on its own it raises SignalException and stops the ranks without a checkpoint
    (SIGTERM, SIGINT), or dies of the signal (SIGUSR1)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    caught = [s.name for s in watch.signals] if watch is not None else []
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=world_size,
        run_id=f"trainflow-{os.getpid()}",
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        max_restarts=0,
        monitor_interval=0.1,  # also how soon a signal is passed on: the launcher's handler runs between its polls
        start_method="spawn",
        signals_to_handle=",".join(_launcher_signals(caught)),
    )
    threads = os.environ.get("OMP_NUM_THREADS")  # the ranks share the cores, as under torchrun; restored after
    if threads is None:
        os.environ["OMP_NUM_THREADS"] = str(max((os.cpu_count() or 1) // world_size, 1))
    try:
        with watch.passing_on() if watch is not None else contextlib.nullcontext():
            results = elastic_launch(config, _entry)(caught, entrypoint, *args)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        raise _rank_error(rank, failure) from None
    finally:
        if threads is None:
            del os.environ["OMP_NUM_THREADS"]
    if isinstance(results[0], Stopped):  # every rank stopped at the same point
        raise Preempted(results[0].message)
    return results[0]


@dataclass(frozen=True)
class Stopped:
    """What a preempted rank returns to the launcher: an exit code other than 0 would have torch's launcher log it as
    a failure, with a traceback, and stop the other ranks with SIGTERM while they still finish."""

    message: str


def _launcher_signals(caught: list[str]) -> list[str]:
    """The signals torch's launcher handles itself (its default four, less those the ranks are to catch); never none,
    which it would report with a traceback."""
    left = [s for s in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT") if s not in caught]
    return left or ["SIGUSR2"]


def _entry(signals: list[str], fn: Callable[..., Any], *args: Any) -> Any:
    """What each rank runs: `fn(*args)`, a user's error printed as one process would print it (exit 2), a preemption
    returned (Stopped). `signals`: the preemption signals to catch from the start (the launcher passes them on, and
    started this process with them blocked: one that came meanwhile is noted now)."""
    from trainflow.engine.preempt import Watch

    with Watch(signals, held=True):
        try:
            return fn(*args)
        except UserError as exc:
            print(f"rank {os.environ.get('RANK')}: {exc}", file=sys.stderr, flush=True)
            sys.exit(UserError.exit_code)
        except Preempted as exc:  # every rank stopped at the same point (in training: with the checkpoint written)
            return Stopped(str(exc))


def _rank_error(rank: int, failure: Any) -> Exception:
    if failure.exitcode == UserError.exit_code:
        return UserError(f"rank {rank} of the distributed run failed; its error is printed above (the others stopped)")
    if failure.exitcode < 0:
        import signal

        how = f"was killed by {signal.Signals(-failure.exitcode).name}"
    else:
        how = f"exited with code {failure.exitcode}"
    return RankFailed(
        f"rank {rank} of the distributed run {how}; the other ranks were stopped. Rerun the stage: it resumes from "
        "the last checkpoint"
    )
