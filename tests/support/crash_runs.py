"""What two crash runs (tests/engine/crash_run.py, tests/gpu/cuda_crash_run.py) left, compared: a run killed and
resumed must end as the run never killed."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file


def same_run(a: Path, b: Path) -> bool:
    wa, wb = load_file(str(a / "final.safetensors")), load_file(str(b / "final.safetensors"))
    # Compare the bits (as int32), so even -0.0 vs 0.0 or two different NaNs would count as a difference.
    bitwise = wa.keys() == wb.keys() and all(wa[k].view(torch.int32).equal(wb[k].view(torch.int32)) for k in wa)
    history = [json.loads((d / "history.json").read_text()) for d in (a, b)]
    counts = [json.loads((d / "counts.json").read_text()) for d in (a, b)]  # applied updates; the scaler's state
    return bitwise and history[0] == history[1] and counts[0] == counts[1]  # every evaluation: update, losses, lr
