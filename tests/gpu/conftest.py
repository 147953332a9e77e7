"""The GPU tier runs only where CUDA is: elsewhere every test in it is collected and skipped, with one reason.

Collecting imports nothing that needs a GPU (torch's CUDA calls happen inside the tests), so `pytest tests/gpu` on a
CPU machine prints skips, never errors. On a GPU: `bash scripts/gpu_check.sh` (or `pytest -q tests/gpu`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
REASON = "no CUDA device: the GPU tier runs on a machine with an NVIDIA GPU (bash scripts/gpu_check.sh)"

# The engine tests' helpers beside them (engine_kit: tiny data, models, the state comparisons; dist_ranks) are
# reused as they are. pytest puts tests/engine on the path only when it collects a file there: put it there for this
# tier alone too.
sys.path.insert(0, str(HERE.parent / "engine"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # the hook sees the whole session's items: mark this tier's (`pytest -m gpu` selects them)
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.gpu)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skipped here, not by a skip marker: pytest then folds every skip into one line of its summary (a marker's
    skips are listed per test function)."""
    if not torch.cuda.is_available():
        pytest.skip(REASON)
