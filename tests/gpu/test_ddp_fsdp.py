"""DDP and FSDP2 over NCCL on the GPU train what one plain process trains, to 1e-5 (every tensor; see assert_same).

`train.world_size: 1` trains without a wrapper (a Group of one process is not distributed), so on a one-GPU machine
the code of several processes on CUDA - DDP with its SUM comm hook and no_sync, fully_shard with its reduce-scatter,
set_requires_gradient_sync and fused AdamW on sharded parameters, the full state gathered for checkpoints, the
collectives of the step and of evaluation - is run here by a group that counts itself distributed, over a process
group of one NCCL rank. With two GPUs or more, two processes x accumulate 2 are also checked against one process x
accumulate 4: tests/engine/test_distributed.py's check (on gloo, CPU) on NCCL.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dist_ranks
import pytest
import torch
from support.ranks import BY_KIND, assert_same_history, assert_same_tensors, relative, without_key_bias

from trainflow.engine import distributed
from trainflow.engine.distributed import Group

from . import cuda_ranks
from .gpu_kit import CUDA, cuda_trainer

KINDS = ["table", "text"]  # settings: tests/engine/test_distributed.py's (accumulate 2, a partial window per epoch)


class OneRank(Group):
    """One rank that wraps, shards, reduces and gathers as each of several does (`Group()` does none of it)."""

    @property
    def distributed(self) -> bool:
        return True


@pytest.fixture(scope="module")
def nccl_of_one() -> Iterator[None]:
    import torch.distributed as dist

    torch.cuda.set_device(CUDA)
    address = f"tcp://127.0.0.1:{distributed.free_port()}"
    dist.init_process_group("nccl", init_method=address, rank=0, world_size=1, device_id=CUDA)
    try:
        yield
    finally:
        dist.destroy_process_group()


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str) -> None:
    """Every tensor within 1e-5 of its norm, but attention's key bias: its gradient is float noise that AdamW scales
    to steps of full size (test_distributed.without_key_bias), so it is held to the whole state's norm, within 1e-4."""
    assert_same_tensors(without_key_bias(got), without_key_bias(want), what)
    assert relative(got, want) < 1e-4, what


def trained(tmp: Path, kind: str, group: Group | None, **settings: Any) -> tuple[dict[str, torch.Tensor], Any]:
    """The exported weights (host copies) and the evaluation history of one run on the GPU."""
    train, val = dist_ranks.data(kind)
    for data in (train, val):
        data.to(CUDA)  # type: ignore[attr-defined]
    t = cuda_trainer(tmp, dist_ranks.model(kind), group=group, **settings)
    if group is not None and group.strategy == "fsdp":
        from torch.distributed.fsdp import FSDPModule

        assert isinstance(t.model, FSDPModule)  # sharded in place
    elif group is not None:
        assert isinstance(t.wrapped, torch.nn.parallel.DistributedDataParallel)
    t.fit(train, val)
    assert t.final_weights is not None
    return {k: v.detach().cpu() for k, v in t.final_weights.items()}, t.state.history


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("kind", KINDS)
def test_one_gpu_ddp_and_fsdp_equal_the_plain_run(nccl_of_one: None, tmp_path: Path, strategy: str, kind: str) -> None:
    plain, plain_history = trained(tmp_path / "plain", kind, None, **BY_KIND[kind])
    wrapped, history = trained(tmp_path / strategy, kind, OneRank(strategy=strategy), **BY_KIND[kind])
    assert_same(wrapped, plain, f"{strategy}-{kind}")
    assert relative(plain, dist_ranks.model(kind).state_dict()) > 1e-2  # it trained
    assert_same_history(history, plain_history)


def test_two_gpus_equal_one_with_twice_the_accumulation(tmp_path: Path) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices: the one-GPU runs above check DDP and FSDP on one")
    got = distributed.launch(2, cuda_ranks.exactness, str(tmp_path / "two"), {k: BY_KIND[k] for k in KINDS})
    for kind in KINDS:
        one, one_history = trained(tmp_path / kind, kind, None, **{**BY_KIND[kind], "accumulate": 4})
        for strategy in ("ddp", "fsdp"):
            assert_same(got[f"{strategy}-{kind}"]["weights"], one, f"{strategy}-{kind}")
            assert_same_history(got[f"{strategy}-{kind}"]["history"], one_history)
