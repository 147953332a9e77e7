"""The FLOPs counter's TF32 check (trainflow.engine.flops): TF32 is on when either of torch's APIs says so, the
last setting winning."""

from __future__ import annotations

import pytest
import torch

from trainflow.engine.flops import _tf32_enabled


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ([], False),
        ([("precision", "high")], True),
        ([("precision", "medium")], True),
        ([("allow", True)], True),
        ([("precision", "high"), ("allow", False)], False),  # the last word wins: no longer tf32
        ([("allow", True), ("precision", "highest")], False),
    ],
)
def test_tf32_is_enabled_by_either_api_and_the_last_setting_wins(settings: list, expected: bool) -> None:
    """A user's torch.set_float32_matmul_precision("high") and then train.tf32: false (configure_backends sets the
    legacy flag) once made the FLOPs counter raise torch's "mix of the legacy and new APIs" RuntimeError."""
    saved = torch.backends.cuda.matmul.fp32_precision
    try:
        for api, value in settings:
            if api == "precision":
                torch.set_float32_matmul_precision(value)
            else:
                torch.backends.cuda.matmul.allow_tf32 = value
        assert _tf32_enabled() is expected
    finally:
        torch.backends.cuda.matmul.fp32_precision = saved
