"""Precision policy: which autocast dtype to use and whether gradients need loss scaling."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from trainflow.core.errors import ParamsError
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
    """fp32 | bf16 | fp16 as requested (fp16 runs on CPU too, slowly: its GradScaler logic is the same as on CUDA);
    auto = bf16 on a GPU with native bf16 (compute capability 8.0+), else fp32."""
    if requested == "auto":
        return Precision("bf16" if native_bf16(device) else "fp32", device.type)
    return Precision(requested, device.type)


def native_bf16(device: torch.device) -> bool:
    """Whether `device` computes in bf16 at full speed. Pre-Ampere GPUs (V100, T4) accept bf16 tensors but emulate
    the arithmetic, many times slower than fp32: torch's default check counts that emulation as support."""
    return device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)


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
    elif torch.are_deterministic_algorithms_enabled():  # the call imports torch._inductor (slow): only if needed
        torch.use_deterministic_algorithms(False)
