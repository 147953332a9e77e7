"""The global switches of train.deterministic and train.tf32 (trainflow.engine.precision.configure_backends): cuDNN,
deterministic algorithms, cuBLAS's workspace and TF32, set on a CUDA device's flags without a GPU."""

from __future__ import annotations

import torch

from trainflow.params import TrainParams


def _switches() -> tuple[bool, bool, bool, bool, bool, str | None]:
    import os

    return (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.are_deterministic_algorithms_enabled(),
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )


def test_deterministic_sets_every_switch_and_tf32_follows_the_params_on_cuda_only(backends: None) -> None:
    """train.deterministic: cuDNN deterministic and not benchmarking, deterministic algorithms, cuBLAS's fixed
    workspace. TF32 is set from train.tf32 for a CUDA device (the flags are plain settings: no GPU is needed to set
    them) and left alone for the CPU. Turning determinism off again switches the algorithms back."""
    from trainflow.engine.precision import configure_backends

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = True, False
    torch.use_deterministic_algorithms(False)
    configure_backends(TrainParams(deterministic=True, tf32=True), torch.device("cpu"))
    assert _switches() == (False, False, False, True, True, ":4096:8")
    configure_backends(TrainParams(deterministic=True, tf32=True), torch.device("cuda", 0))
    assert _switches() == (True, True, False, True, True, ":4096:8")
    configure_backends(TrainParams(deterministic=False, tf32=False), torch.device("cuda", 0))
    assert _switches()[:2] + _switches()[4:5] == (False, False, False)
