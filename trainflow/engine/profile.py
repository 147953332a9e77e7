"""train.profile: a torch.profiler trace of a few updates, for "why is my step slow".

Updates `start` .. `start + updates - 1` of a run (counted from its first update, a resumed run's too) are recorded:
the update before them is the profiler's warm-up (recorded and dropped, as torch advises: the first profiled step
carries the profiler's own start-up), the ones before that pass untouched. Each rank writes its trace as Chrome
trace JSON (`rank<r>.<time>.pt.trace.json`) into the folder the train stage gives (reports/profile/), which Perfetto
(ui.perfetto.dev: "Open trace file") and TensorBoard's profile plugin (`tensorboard --logdir reports/profile`, with
`torch-tb-profiler` installed) open. Off (null), the trainer holds no profiler and checks one attribute per update.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainflow.params import ProfileParams


def profiler(p: ProfileParams | None, folder: Path | None, device: torch.device, rank: int) -> Any:
    """A started-on-enter torch.profiler.profile recording `p`'s updates into `folder`, or None when off."""
    if p is None or folder is None:
        return None
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    folder.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    warmup = 1 if p.start > 1 else 0
    return profile(
        activities=activities,
        schedule=schedule(wait=p.start - 1 - warmup, warmup=warmup, active=p.updates, repeat=1),
        on_trace_ready=tensorboard_trace_handler(str(folder), worker_name=f"rank{rank}"),
        record_shapes=True,
    )
