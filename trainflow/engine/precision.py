"""Precision policy: which autocast dtype to use and whether gradients need loss scaling."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from trainflow.errors import ParamsError
from trainflow.params import TrainParams

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Precision:
    name: str  # resolved: fp32 | bf16 | fp16
    device_type: str  # cpu | cuda

    @property
    def uses_scaler(self) -> bool:
        # fp16 has too few exponent bits for small gradients: scale the loss up, unscale before clipping.
        return self.name == "fp16"

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES.get(self.name, torch.float32)

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=DTYPES[self.name])


def resolve_device(requested: str) -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise ParamsError("params.yaml", [("train.device", "cuda was requested but no CUDA GPU is visible")])
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def resolve_precision(requested: str, device: torch.device) -> Precision:
    if requested == "fp16" and device.type != "cuda":
        raise ParamsError(
            "params.yaml",
            [
                (
                    "train.precision",
                    f"fp16 with a GradScaler needs a CUDA GPU, but training runs on {device.type}; "
                    "use bf16 (autocast works on CPU) or fp32",
                )
            ],
        )
    if requested == "auto":
        bf16_ok = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return Precision("bf16" if bf16_ok else "fp32", device.type)
    return Precision(requested, device.type)


def configure_backends(params: TrainParams, device: torch.device) -> None:
    """TF32 and determinism switches; call before the first CUDA kernel (cuBLAS reads its env var once)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = params.tf32
        torch.backends.cudnn.allow_tf32 = params.tf32
    if params.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS reductions
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        torch.use_deterministic_algorithms(True)
    elif torch.are_deterministic_algorithms_enabled():  # the call imports torch._inductor (1.5 s): only if needed
        torch.use_deterministic_algorithms(False)
