"""The host-sync guard's parts, for the CPU tests (tests/engine) and the GPU tier: the ATen ops that make a GPU's host
wait for the device, a dispatch mode that raises on them, and the windows and poisoned gradients run under it."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainflow.engine.loaders import Batch, Dataset

aten = torch.ops.aten
# Ops whose result (or output size) depends on tensor values, so a GPU must finish and copy to the host first.
SYNC_OPS = {
    aten._local_scalar_dense.default,  # .item(), float(), int(), bool()
    aten.is_nonzero.default,
    aten.nonzero.default,  # also torch.where(cond), argwhere
    aten.masked_select.default,
    aten._unique.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.equal.default,
    aten.bincount.default,
    aten.repeat_interleave.Tensor,
    # torch.tensor(<Python data>, device=cuda): a blocking copy from pageable host memory, so the host waits for the
    # stream (set_sync_debug_mode flags it; the GPU tier caught Transformers 5.17's eager mask doing it per forward).
    aten.lift_fresh.default,
}
# Indexing with a boolean mask is a nonzero in disguise (the CPU kernel does it without dispatching nonzero).
MASK_INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}


class HostSyncError(AssertionError):
    pass


class _NoSync(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in SYNC_OPS:
            raise HostSyncError(f"host-device sync in train_step: {func}")
        if func in MASK_INDEXING:
            indices = args[1] if len(args) > 1 else kwargs.get("indices", [])
            if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
                raise HostSyncError(f"host-device sync in train_step: {func} with a boolean mask")
        return func(*args, **kwargs)


def windows(data: Dataset, batch_size: int, accumulate: int, n: int) -> list[list[Batch]]:
    """n windows of micro-batches, built before the guard: batching is data preparation, not the step."""
    size = batch_size * accumulate
    return [[data.batch(i) for i in torch.arange(k * size, (k + 1) * size).split(batch_size)] for k in range(n)]


def poison(param: torch.Tensor, attempts: set[int], accumulate: int) -> None:
    """Gradients of `param` become inf on the given 1-based updates: the skip path runs under the guard too."""
    calls = [0]

    def hook(grad: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return grad * float("inf") if (calls[0] - 1) // accumulate + 1 in attempts else grad

    param.register_hook(hook)
