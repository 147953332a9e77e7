"""cnn: a small residual convolutional net for images (model.name: cnn, or auto with an image column).

conv 3x3 stem → stages of residual blocks (two 3x3 convs with a norm each and a skip; the first block of every stage
after the first halves the height and width and widens the channels, its skip a strided 1x1 conv) → global average
pool → linear head. Forward takes `images` [N, C, H, W] float (normalised) and returns logits [N, out_features].

BatchNorm uses the batch's statistics in train() and its running averages in eval(): the engine validates, evaluate
scores and predict serves in eval(), so all three see the same function of the weights.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn


def _norm(kind: str, channels: int) -> nn.BatchNorm2d | nn.GroupNorm:
    if kind == "group":
        return nn.GroupNorm(min(8, channels), channels)
    return nn.BatchNorm2d(channels)


class Block(nn.Module):
    """x + f(x), f = conv-norm-relu-conv-norm; a strided/widening block projects the skip with a 1x1 conv."""

    def __init__(self, cin: int, cout: int, stride: int, norm: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = _norm(norm, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = _norm(norm, cout)
        nn.init.zeros_(self.norm2.weight)  # each block starts as the identity: deep nets train from the first step
        self.skip: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _norm(norm, cout))
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return self.relu(out + self.skip(x))


class CNN(nn.Module):
    def __init__(
        self,
        in_channels: int,
        out_features: int,
        channels: list[int],
        blocks: int = 1,
        norm: Literal["batch", "group"] = "batch",
        image_size: list[int] | None = None,
    ) -> None:
        super().__init__()
        self.image_size = list(image_size) if image_size else None  # [H, W]: for FLOP counts only
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, channels[0], 3, 1, 1, bias=False), _norm(norm, channels[0]), nn.ReLU()
        )
        layers: list[nn.Module] = []
        width = channels[0]
        for s, c in enumerate(channels):
            for b in range(blocks):
                layers.append(Block(width, c, 2 if s > 0 and b == 0 else 1, norm))
                width = c
        self.blocks = nn.Sequential(*layers)
        self.head = nn.Linear(width, out_features)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(images))
        out: torch.Tensor = self.head(x.mean(dim=(2, 3)))
        return out

    def flops_per_sample(self) -> float | None:
        """Training FLOPs per image: 3 x forward (backward ~ 2 x forward), 2 per multiply-add of the convs and the
        head (norms, activations and the pool are not counted); None without image_size."""
        if self.image_size is None:
            return None
        h, w = self.image_size
        macs = _conv_macs(self.stem[0], h, w)
        for block in self.blocks:
            assert isinstance(block, Block)
            stride = block.conv1.stride[0]
            h, w = (h - 1) // stride + 1, (w - 1) // stride + 1  # 3x3 with padding 1, or 1x1: ceil(size / stride)
            macs += _conv_macs(block.conv1, h, w) + _conv_macs(block.conv2, h, w)
            if isinstance(block.skip, nn.Sequential):
                macs += _conv_macs(block.skip[0], h, w)
        macs += self.head.in_features * self.head.out_features
        return 6.0 * macs


def _conv_macs(conv: nn.Module, h_out: int, w_out: int) -> int:
    """Multiply-adds of a Conv2d producing an [h_out, w_out] map."""
    assert isinstance(conv, nn.Conv2d)
    kh, kw = conv.kernel_size
    return h_out * w_out * conv.out_channels * conv.in_channels // conv.groups * kh * kw
