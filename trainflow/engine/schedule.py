"""Learning-rate schedules in optimizer-update units.

A schedule is a table: `lr_table(...)[k]` is the learning rate of the k-th *applied* update. The trainer keeps the
table on the training device and looks the rate up with a device-side counter that only advances when an update is
applied, so a skipped (non-finite) update never moves the schedule and the lookup needs no host sync.

reduce-on-plateau is the one schedule that depends on results: its table is constant (after warmup) and `Plateau`
scales it down between evaluations, on the host, where the validation metric already is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

ScheduleName = Literal["constant", "cosine", "linear", "one_cycle", "plateau"]
ONE_CYCLE_DIV = 25.0  # one-cycle starts at lr / 25, as torch's OneCycleLR


def lr_at(kind: ScheduleName, update: int, total: int, warmup: int, peak: float, floor: float) -> float:
    """LR of applied update `update` (0-based) out of `total`; `warmup` updates ramp up first."""
    if kind == "one_cycle":
        # Cosine up from peak/25 to peak over the warmup, then cosine down to the floor.
        start = peak / ONE_CYCLE_DIV
        if update < warmup:
            return _cos(start, peak, update / max(1, warmup))
        return _cos(peak, floor, min(1.0, (update - warmup) / max(1, total - warmup - 1)))
    if update < warmup:
        return peak * (update + 1) / warmup
    progress = min(1.0, (update - warmup) / max(1, total - warmup))
    if kind == "cosine":
        return _cos(peak, floor, progress)
    if kind == "linear":
        return peak + (floor - peak) * progress
    return peak  # constant, and plateau before any reduction


def _cos(start: float, end: float, progress: float) -> float:
    return end + 0.5 * (start - end) * (1.0 + math.cos(math.pi * progress))


def lr_table(
    kind: ScheduleName, total: int, warmup: int, peak: float, floor: float, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Rates for updates 0..total; one entry past the end so a finished run still has a rate to report."""
    rates = [lr_at(kind, k, total, warmup, peak, floor) for k in range(total + 1)]
    return torch.tensor(rates, dtype=torch.float32, device=device)


@dataclass
class Plateau:
    """reduce-on-plateau: multiply the LR by `factor` after `patience` evaluations without improvement."""

    factor: float
    patience: int
    floor_scale: float  # min_lr / lr: the scale never goes below this
    scale: float = 1.0
    bad_evals: int = 0

    def observe(self, improved: bool) -> bool:
        """Record one evaluation; True if the scale changed."""
        if improved:
            self.bad_evals = 0
            return False
        self.bad_evals += 1
        if self.bad_evals < self.patience or self.scale <= self.floor_scale:
            return False
        self.scale = max(self.scale * self.factor, self.floor_scale)
        self.bad_evals = 0
        return True
