"""Precision policy: which autocast dtype to use, whether gradients need loss scaling, and fp8's model conversion."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import nn

from trainflow.core.errors import ParamsError
from trainflow.params import TrainParams

# fp8: the converted Linear layers run their matmuls in float8 (torchao), under bf16 autocast like everything else.
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}
# fp8 tensor cores that torch's float8 matmul (torch._scaled_mm) is tuned for: Hopper (H100, H200). Ada (8.9) has
# fp8 too, but nothing here was measured on it.
FP8_CAPABILITY = (9, 0)
FP8_INSTALL = "pip install -e '.[fp8]' (or pip install 'torchao>=0.17': 0.17 is the first for torch 2.11+)"


@dataclass(frozen=True)
class Precision:
    name: str  # resolved: fp32 | bf16 | fp16 | fp8
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

    def prepare(self, model: nn.Module) -> nn.Module:
        """The model to train: fp8's with its Linear layers converted (`apply_fp8`), any other precision's as it is.
        The Trainer calls it once, before DDP or FSDP wrap the model."""
        return apply_fp8(model) if self.name == "fp8" else model


def resolve_device(requested: str) -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise ParamsError("params.yaml", [("train.device", "cuda was requested but no CUDA GPU is visible")])
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def resolve_precision(requested: str, device: torch.device) -> Precision:
    """fp32 | bf16 | fp16 | fp8 as requested (fp16 runs on CPU too, slowly: its GradScaler logic is the same as on
    CUDA; fp8 only on a Hopper GPU with torchao installed, `check_fp8`); auto = bf16 on a GPU with native bf16
    (compute capability 8.0+), else fp32."""
    if requested == "auto":
        return Precision("bf16" if native_bf16(device) else "fp32", device.type)
    if requested == "fp8":
        check_fp8(device)
    return Precision(requested, device.type)


def check_fp8(device: torch.device) -> None:
    """fp8 where it can run: a CUDA GPU of compute capability 9.0+ (H100, H200), with torchao importable; else a
    ParamsError on train.precision that says what to use instead."""
    where = None
    if device.type != "cuda":
        where = f"this run is on {device.type}"
    elif (capability := torch.cuda.get_device_capability(device)) < FP8_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        where = f"this run's GPU, {name}, has compute capability {capability[0]}.{capability[1]}"
    if where is not None:
        raise ParamsError(
            "params.yaml",
            [("train.precision", f"fp8 needs an NVIDIA H100/H200-class GPU (compute capability 9.0+); {where}: "
              "use bf16 or auto")],
        )  # fmt: skip
    float8_training()


def float8_training() -> ModuleType:
    """torchao.float8, or a ParamsError on train.precision saying how to install it (it is no default dependency)."""
    try:
        import torchao.float8
    except ImportError as exc:
        raise ParamsError(
            "params.yaml",
            [("train.precision", f"fp8 trains through torchao's float8 training, which cannot be imported ({exc}): "
              f"{FP8_INSTALL}, or use bf16")],
        ) from None  # fmt: skip
    return torchao.float8


def fp8_layers(model: nn.Module) -> list[str]:
    """The names of the Linear layers that fp8 converts: each one whose in_features and out_features are multiples of
    16, except the last Linear the model registers (its output head in every built-in model).

    Why those: torch's float8 matmul (torch._scaled_mm) takes only dimensions that are multiples of 16, and torchao
    swaps every Linear it is given, so a layer of another width would fail at its first forward. The head is kept out
    because its outputs are the logits the loss reads directly, where fp8's 3 mantissa bits would cost the most
    accuracy, and with a handful of classes its matmul is too small for fp8 to gain anything over the casts and amax
    reductions it adds (torchtitan's float8 configs leave their output layer out too)."""
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    head = linears[-1][0] if linears else None
    return [name for name, m in linears if name != head and m.in_features % 16 == 0 and m.out_features % 16 == 0]


def apply_fp8(model: nn.Module) -> nn.Module:
    """`model` with its `fp8_layers` swapped for torchao's Float8Linear, in place (torchao's recipe: dynamic
    tensorwise scaling, a scale per tensor from its absolute max at each matmul). A Float8Linear holds the Linear's
    own float32 weight and bias under the same names, so the state dict, checkpoints and the export are those of the
    plain model; only the matmuls in forward and backward run in float8. A model with no such layer is a ParamsError:
    fp8 would change nothing (a cnn, text_bag: their only Linear is the head)."""
    chosen = set(fp8_layers(model))
    if not chosen:
        raise ParamsError(
            "params.yaml",
            [("train.precision", f"fp8 converts Linear layers whose sizes are multiples of 16, other than the output "
              f"head, and {type(model).__name__} has none: use bf16")],
        )  # fmt: skip
    float8 = float8_training()
    # pad_inner_dim: the weight gradient's matmul sums over the batch's rows (tokens: batch × padded length, and a
    # partial last batch), which torch._scaled_mm on CUDA takes only in multiples of 16; torchao then pads both
    # operands with zero rows, which add nothing to the sum (a copy of the fp8 operands per matmul, 1 byte an element).
    config = float8.Float8LinearConfig(pad_inner_dim=True)
    converted: nn.Module = float8.convert_to_float8_training(
        model, module_filter_fn=lambda _, name: name in chosen, config=config
    )
    return converted


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
