"""Image augmentation on batched tensors, in plain torch (torchvision's wheels need a CUDA torch).

Every random number is a function of (seed, epoch, sample index, draw) alone — a counter-based hash, not a generator
with state — so a sample is changed the same way whatever batch it is in, whichever process or thread prepares it,
and a run resumed in the middle of an epoch augments exactly as the uninterrupted one. The hash is integer
arithmetic below 2**62 (exact on any device, no overflow), so CPU and CUDA draw the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

PRIME = 2_147_483_647  # 2**31 - 1: every value stays below it, so products stay below 2**62
DRAWS = 4  # per sample: shift x, shift y, flip, angle


@dataclass(frozen=True)
class Augment:
    """What to change, at most: shift (pixels, zero padding), flip (left-right, p = 1/2), rotate (degrees)."""

    shift: int = 0
    flip: bool = False
    rotate: float = 0.0

    @property
    def active(self) -> bool:
        return self.shift > 0 or self.flip or self.rotate > 0


def uniforms(seed: int, epoch: int, idx: torch.Tensor, draws: int = DRAWS) -> torch.Tensor:
    """float64 [len(idx), draws] in [0, 1): the same numbers for the same (seed, epoch, sample, draw), anywhere."""
    key = hash_int((seed * 1_000_003 + epoch) % PRIME)  # Python ints: exact
    x = (idx.to(torch.int64)[:, None] % PRIME * 48_271 + key) % PRIME
    x = (x + torch.arange(1, draws + 1, device=idx.device) * 16_807) % PRIME
    for _ in range(3):  # MINSTD steps with xor-shifts between them mix the sample and the draw into every bit
        x = (x * 48_271) % PRIME
        x = x ^ (x >> 13)
        x = (x * 69_621 + 12_345) % PRIME
    return x.to(torch.float64) / PRIME


def hash_int(v: int) -> int:
    for _ in range(3):
        v = (v * 48_271) % PRIME
        v ^= v >> 13
        v = (v * 69_621 + 12_345) % PRIME
    return v


def apply(x: torch.Tensor, idx: torch.Tensor, seed: int, epoch: int, a: Augment) -> torch.Tensor:
    """`x` float [N, C, H, W] (raw pixel values) changed per sample: shifted, flipped, rotated (in that order)."""
    if not a.active or len(x) == 0:
        return x
    u = uniforms(seed, epoch, idx.to(x.device))
    n, _, h, w = x.shape
    if a.shift > 0:
        s = a.shift
        dy = (u[:, 0] * (2 * s + 1)).long()  # the crop's corner in the padded image: 0..2s (s = no shift)
        dx = (u[:, 1] * (2 * s + 1)).long()
        padded = F.pad(x, (s, s, s, s))
        rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
        cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
        batch = torch.arange(n, device=x.device)[:, None, None, None]
        channel = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
        x = padded[batch, channel, rows, cols]
    if a.flip:
        x = torch.where((u[:, 2] < 0.5)[:, None, None, None], x.flip(-1), x)
    if a.rotate > 0:
        angle = (2 * u[:, 3] - 1) * math.radians(a.rotate)
        cos, sin = torch.cos(angle), torch.sin(angle)
        zero = torch.zeros_like(cos)
        # affine_grid works in [-1, 1] coordinates per axis: scale the off-diagonal terms so that a non-square
        # image turns rigidly instead of shearing.
        theta = torch.stack(
            [torch.stack([cos, -sin * h / w, zero], 1), torch.stack([sin * w / h, cos, zero], 1)], 1
        ).to(x.dtype)
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        x = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return x
