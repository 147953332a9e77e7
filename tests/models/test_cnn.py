"""The built-in CNN (trainflow.models.cnn): its layers, blocks and defaults, the function a block and the whole
network compute, and its FLOP count, each worked out by hand."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def test_the_cnn_layers_by_hand() -> None:
    from trainflow.models.cnn import CNN, Block

    model: Any = CNN(3, 5, [4, 16], blocks=2, norm="group", image_size=(9, 7))  # type: ignore[arg-type]
    assert model.image_size == [9, 7]
    conv, norm, relu = model.stem
    assert (conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, conv.bias) == (
        3, 4, (3, 3), (1, 1), (1, 1), None
    )  # fmt: skip
    assert type(norm) is nn.GroupNorm and (norm.num_groups, norm.num_channels) == (4, 4) and type(relu) is nn.ReLU
    blocks = list(model.blocks)
    assert all(type(b) is Block for b in blocks) and len(blocks) == 4
    shapes = [(b.conv1.in_channels, b.conv1.out_channels, b.conv1.stride[0]) for b in blocks]
    assert shapes == [(4, 4, 1), (4, 4, 1), (4, 16, 2), (16, 16, 1)]
    for b in blocks:
        assert (b.conv1.kernel_size, b.conv1.padding, b.conv1.bias) == ((3, 3), (1, 1), None)
        assert (b.conv2.kernel_size, b.conv2.stride, b.conv2.padding, b.conv2.bias) == ((3, 3), (1, 1), (1, 1), None)
        assert b.conv2.in_channels == b.conv2.out_channels == b.conv1.out_channels
        assert type(b.norm1) is type(b.norm2) is nn.GroupNorm and type(b.relu) is nn.ReLU
        assert b.norm1.num_groups == min(8, b.conv1.out_channels) and b.norm1.num_channels == b.conv1.out_channels
        assert b.norm2.weight.abs().sum() == 0  # each block starts as the identity
        assert b.norm1.weight.abs().sum() == b.conv1.out_channels  # the first norm as usual: ones
    assert [type(b.skip) for b in blocks] == [nn.Identity, nn.Identity, nn.Sequential, nn.Identity]
    proj, proj_norm = blocks[2].skip
    assert (proj.in_channels, proj.out_channels, proj.kernel_size, proj.stride, proj.bias) == (4, 16, (1, 1), (2, 2),
                                                                                               None)  # fmt: skip
    assert type(proj_norm) is nn.GroupNorm and (proj_norm.num_groups, proj_norm.num_channels) == (8, 16)
    assert (model.head.in_features, model.head.out_features) == (16, 5)
    batch: Any = CNN(1, 2, [8])
    assert type(batch.stem[1]) is nn.BatchNorm2d and batch.stem[1].num_features == 8 and batch.image_size is None
    assert len(batch.blocks) == 1 and type(batch.blocks[0].norm1) is nn.BatchNorm2d
    widen: Any = Block(4, 6, 1, "batch")
    assert type(widen.skip) is nn.Sequential and widen.skip[0].stride == (1, 1)  # a wider block projects its skip


def test_a_block_and_the_cnn_compute_their_function() -> None:
    from trainflow.models.cnn import CNN, Block

    torch.manual_seed(0)
    block: Any = Block(2, 3, 2, "group").eval()
    for q in block.parameters():
        nn.init.normal_(q)
    x = torch.randn(2, 2, 5, 4)
    conv1, conv2, proj = block.conv1.weight, block.conv2.weight, block.skip[0].weight
    n1, n2, n3 = block.norm1, block.norm2, block.skip[1]

    def gn(t: torch.Tensor, norm: Any) -> torch.Tensor:
        return F.group_norm(t, 3, norm.weight, norm.bias, 1e-5)

    out = F.relu(gn(F.conv2d(x, conv1, stride=2, padding=1), n1))
    out = gn(F.conv2d(out, conv2, padding=1), n2)
    expected = F.relu(out + gn(F.conv2d(x, proj, stride=2), n3))
    torch.testing.assert_close(block(x), expected, rtol=1e-5, atol=1e-5)

    model: Any = CNN(2, 3, [3], norm="group").eval()
    for q in model.parameters():
        nn.init.normal_(q)
    stem = F.relu(F.group_norm(F.conv2d(x, model.stem[0].weight, padding=1), 3, model.stem[1].weight,
                               model.stem[1].bias, 1e-5))  # fmt: skip
    pooled = model.blocks(stem).mean(dim=(2, 3))
    torch.testing.assert_close(model(images=x), pooled @ model.head.weight.T + model.head.bias, rtol=1e-5, atol=1e-5)


def test_cnn_flops_by_hand() -> None:
    from trainflow.models.cnn import CNN, _conv_macs

    model = CNN(3, 10, [8, 16], blocks=2, image_size=[31, 30])
    stem = 31 * 30 * 8 * 3 * 9
    first = 2 * (2 * 31 * 30 * 8 * 8 * 9)  # two blocks of two 3x3 convs, 8 -> 8, full size
    down = 16 * 15 * (16 * 8 * 9 + 16 * 16 * 9 + 16 * 8)  # ceil(31 / 2) x ceil(30 / 2); the 1x1 skip
    second = 16 * 15 * 2 * 16 * 16 * 9
    assert model.flops_per_sample() == 6.0 * (stem + first + down + second + 16 * 10)
    assert type(model.flops_per_sample()) is float
    assert CNN(3, 10, [8]).flops_per_sample() is None
    assert _conv_macs(nn.Conv2d(8, 16, 3, groups=4), 5, 6) == 5 * 6 * 16 * 2 * 9
    assert _conv_macs(nn.Conv2d(3, 4, (1, 3)), 2, 2) == 2 * 2 * 4 * 3 * 3


def test_cnn_defaults_one_block_a_stage_and_batch_norm() -> None:
    from trainflow.models.cnn import CNN

    model: Any = CNN(3, 2, [4, 8])
    assert len(model.blocks) == 2 and model.image_size is None
    assert type(model.stem[1]) is nn.BatchNorm2d and type(model.blocks[1].norm2) is nn.BatchNorm2d
