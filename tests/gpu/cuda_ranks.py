"""What each rank runs in test_ddp_fsdp.py's test of two GPUs (a module: the launcher starts fresh processes), as
tests/engine/dist_ranks.py does on the CPU with gloo."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import dist_ranks
import torch

from trainflow.engine import distributed

from .gpu_kit import cuda_trainer


def exactness(tmp: str, settings: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """ddp and fsdp over NCCL, for each data kind: rank 0's exported weights and history (host copies)."""
    device = distributed.device_for(torch.device("cuda"))  # cuda:LOCAL_RANK
    joined = distributed.init(int(os.environ["WORLD_SIZE"]), "ddp", "nccl", device)
    out: dict[str, Any] = {}
    for strategy in ("ddp", "fsdp"):
        group = dataclasses.replace(joined, strategy=strategy)
        for kind in settings:
            train, val = dist_ranks.data(kind)
            for data in (train, val):
                data.to(device)  # type: ignore[attr-defined]
            t = cuda_trainer(Path(tmp) / f"{strategy}-{kind}", dist_ranks.model(kind), group=group, device=device,
                             **settings[kind])  # fmt: skip
            t.fit(train, val)
            if group.is_main:
                assert t.final_weights is not None
                weights = {k: v.detach().cpu() for k, v in t.final_weights.items()}
                out[f"{strategy}-{kind}"] = {"weights": weights, "history": t.state.history}
    distributed.shutdown(joined)
    return out
