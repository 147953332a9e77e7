"""Throughput helpers: peak FLOP/s of known GPUs, training FLOPs per sample of built-in models, and MFU."""

from __future__ import annotations

import os
import re
from collections.abc import Callable

import torch
from torch import nn

from trainflow.engine.loaders import Batch
from trainflow.models import MLP

PEAK_FLOPS_ENV = "TRAINFLOW_PEAK_FLOPS"

# Dense (no sparsity) peak FLOP/s from the vendor data sheets / architecture whitepapers, matched against
# torch.cuda.get_device_name in order (more specific names first). Columns: 16-bit tensor cores (bf16/fp16 with fp32
# accumulate; None where the GPU has no bf16 tensor cores), tf32 tensor cores (None where absent), plain fp32.
_GPUS: tuple[tuple[str, float | None, float | None, float | None, float], ...] = (
    # pattern, bf16, fp16, tf32, fp32
    (r"H200 NVL", 835e12, 835e12, 417.5e12, 60e12),
    (r"H200", 989e12, 989e12, 494.5e12, 67e12),
    (r"H100 PCIe", 756e12, 756e12, 378e12, 51e12),
    (r"H100 NVL", 835e12, 835e12, 417.5e12, 60e12),
    (r"H100", 989e12, 989e12, 494.5e12, 67e12),  # SXM5 ("H100 80GB HBM3")
    (r"A100", 312e12, 312e12, 156e12, 19.5e12),
    (r"L40S", 362e12, 362e12, 183e12, 91.6e12),
    (r"L40\b", 181e12, 181e12, 90.5e12, 90.5e12),
    (r"\bL4\b", 121e12, 121e12, 60e12, 30.3e12),
    (r"\bA10\b", 125e12, 125e12, 62.5e12, 31.2e12),
    (r"V100.*PCIE", None, 112e12, None, 14e12),
    (r"V100", None, 125e12, None, 15.7e12),  # SXM2
    (r"RTX 4090(?! D)", 165.2e12, 165.2e12, 82.6e12, 82.6e12),
    (r"RTX 3090(?! Ti)", 71e12, 71e12, 35.6e12, 35.6e12),
)


def _tf32_enabled() -> bool:
    """Whether float32 matmuls on CUDA may run on tf32 tensor cores. The legacy flag is the one answer every torch
    gives: it follows torch.set_float32_matmul_precision too, while torch >= 2.9's get_float32_matmul_precision
    raises once both APIs were used (a user's set_float32_matmul_precision("high"), then train.tf32: false)."""
    return bool(torch.backends.cuda.matmul.allow_tf32)


def peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """Dense peak FLOP/s of `device` for matmuls in `dtype`; None for CPU, unknown GPUs or unsupported dtypes.

    float32 counts as tf32 when tf32 matmuls are enabled. The environment variable TRAINFLOW_PEAK_FLOPS overrides.
    """
    override = os.environ.get(PEAK_FLOPS_ENV, "").strip()
    if override:
        try:
            value = float(override)
        except ValueError:
            raise ValueError(f"{PEAK_FLOPS_ENV} must be a number of FLOP/s, got {override!r}") from None
        if not value > 0:
            raise ValueError(f"{PEAK_FLOPS_ENV} must be > 0, got {override!r}")
        return value
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    for pattern, bf16, fp16, tf32, fp32 in _GPUS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            if dtype == torch.bfloat16:
                return bf16
            if dtype == torch.float16:
                return fp16
            if dtype == torch.float32:
                return tf32 if tf32 is not None and _tf32_enabled() else fp32
            return None
    return None


def _unwrap(model: nn.Module) -> nn.Module:
    """The module inside torch.compile (`_orig_mod`) and DistributedDataParallel/DataParallel (`module`) wrappers."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        if isinstance(inner, nn.Module):
            model = inner
        elif isinstance(model, nn.DataParallel | nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def train_flops_per_sample(model: nn.Module, seq_len: int | None = None) -> float | None:
    """Training (forward + backward) FLOPs per sample, or None for models it does not know (no MFU then).

    Models with `flops_per_token(seq_len)` give flops_per_token(seq_len) * seq_len (seq_len required: the length the
    model actually runs on, padding included); trainflow's MLP gives 6 * parameters; models with `flops_per_sample()`
    (the cnn) give what it returns.
    """
    model = _unwrap(model)
    flops_per_token = getattr(model, "flops_per_token", None)
    if callable(flops_per_token):
        if seq_len is None:
            raise ValueError(f"{type(model).__name__} counts FLOPs per token: seq_len is required")
        return float(flops_per_token(seq_len)) * seq_len
    if isinstance(model, MLP):
        return 6.0 * sum(p.numel() for p in model.parameters())
    per_sample = getattr(model, "flops_per_sample", None)  # the cnn: its convolutions, at its image size
    if callable(per_sample):
        value = per_sample()
        return None if value is None else float(value)
    return None


def mfu(flops_per_second: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: achieved / peak FLOP/s, or None when the peak is unknown."""
    if peak is None or peak <= 0:
        return None
    return flops_per_second / peak


def flops_per_batch(model: nn.Module) -> Callable[[Batch], float] | None:
    """Training FLOPs of one micro-batch, from shapes only (no device sync); None for models it does not know."""
    inner = _unwrap(model)
    per_token = getattr(inner, "flops_per_token", None)
    if callable(per_token):

        def text(batch: Batch) -> float:
            if batch.lengths is not None:  # packed: each sequence at its own length (flops_per_token is affine in it)
                base, per = per_token(0), per_token(1) - per_token(0)
                lengths = batch.lengths.double()
                return float(base * lengths.sum() + per * lengths.square().sum())
            n, length = batch.inputs["tokens"].shape
            return float(train_flops_per_sample(inner, int(length)) or 0.0) * n

        return text
    per_sample = train_flops_per_sample(inner)
    if per_sample is None:
        return None
    return lambda batch: per_sample * batch.size
