"""What the GPU tests share: engine_kit's trainer factory on the GPU, and reading states back to compare them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from engine_kit import BASE
from torch import nn

from trainflow.engine.distributed import Group
from trainflow.engine.objective import Objective
from trainflow.engine.precision import Precision
from trainflow.engine.trainer import Trainer
from trainflow.params import TrainParams

CUDA = torch.device("cuda", 0)


def cuda_trainer(
    tmp: Path,
    model: nn.Module,
    task: str = "classification",
    precision: str = "fp32",
    group: Group | None = None,
    device: torch.device = CUDA,
    **kw: Any,
) -> Trainer:
    """engine_kit.make_trainer on the GPU: the same settings (BASE), the device decision path (what a GPU runs)."""
    p = TrainParams.model_validate({**BASE, **kw})
    return Trainer(
        model,
        p,
        seed=7,
        device=device,
        precision=Precision(precision, "cuda"),
        objective=Objective(task),  # type: ignore[arg-type]
        checkpoint_dir=tmp,
        fingerprint="gpu-test",
        group=group,
    )


def on_host(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state of device tensors copied to the host, where engine_kit.bitwise_equal reads their bytes."""
    return {k: v.detach().cpu() for k, v in state.items()}
