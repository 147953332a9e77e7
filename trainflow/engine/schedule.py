"""Learning-rate schedules as pure functions of the number of applied optimizer updates."""

from __future__ import annotations

import math


def warmup_cosine(update: int, total: int, warmup: int, peak: float, floor: float) -> float:
    """LR of optimizer update `update` (0-based): linear warmup to `peak`, then cosine decay to `floor` at `total`."""
    if update < warmup:
        return peak * (update + 1) / warmup
    progress = min(1.0, (update - warmup) / max(1, total - warmup))
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))
