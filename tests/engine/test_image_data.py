"""Images in the engine: augmentation drawn per (seed, epoch, sample) in plain torch, ImageData's background prefetch
giving the same batches as decoding on the spot, a resumed augmented image run equal to the uninterrupted one, and
the cnn (BatchNorm in train vs eval, FLOP count)."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from engine_kit import make_trainer
from torch import nn

from trainflow.engine.augment import Augment, apply
from trainflow.engine.flops import train_flops_per_sample
from trainflow.engine.loaders import ImageData, epoch_order
from trainflow.models import build_model
from trainflow.models.cnn import CNN


def pixels(n: int = 40, c: int = 2, h: int = 6, w: int = 5, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n, c, h, w), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def shifted(x: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """x [C, H, W] moved by (dy, dx), zeros coming in: the hand-written reference of a padded random crop."""
    out = np.zeros_like(x)
    _, h, w = x.shape
    out[:, max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = x[
        :, max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : w + min(-dx, 0)
    ]
    return out


def test_shift_and_flip_give_one_of_the_allowed_images_per_sample_whatever_the_batch() -> None:
    x = pixels().float()
    idx = torch.arange(100, 140)
    a = Augment(shift=2, flip=True)
    out = apply(x, idx, seed=3, epoch=1, a=a).numpy()
    seen = set()
    for i in range(len(x)):
        xi = x[i].numpy()
        candidates = {
            (dy, dx, f): shifted(xi[:, :, ::-1] if f else xi, dy, dx)
            for dy in range(-2, 3)
            for dx in range(-2, 3)
            for f in (False, True)
        }
        match = [k for k, v in candidates.items() if np.array_equal(v, out[i])]
        assert match, f"sample {i} is no shift/flip of its input"
        seen.add(match[0])
    assert len(seen) > 10  # the draws differ between samples
    # The same sample gets the same change in any batch: alone, or in reverse order.
    for i in (0, 7, 39):
        alone = apply(x[i : i + 1], idx[i : i + 1], seed=3, epoch=1, a=a)
        assert torch.equal(alone[0], torch.from_numpy(out[i]))
    reverse = apply(x.flip(0), idx.flip(0), seed=3, epoch=1, a=a)
    assert torch.equal(reverse.flip(0), torch.from_numpy(out))
    # Another epoch or seed draws anew; no augmentation leaves the batch alone.
    assert not torch.equal(apply(x, idx, seed=3, epoch=2, a=a), torch.from_numpy(out))
    assert not torch.equal(apply(x, idx, seed=4, epoch=1, a=a), torch.from_numpy(out))
    assert apply(x, idx, 3, 1, Augment()) is x


def test_rotation_turns_by_at_most_the_angle() -> None:
    # A centred bright bar: rotating it by a small angle keeps its mass near the centre and changes the pixels.
    x = torch.zeros(8, 1, 9, 9)
    x[:, :, 4, 2:7] = 100.0
    out = apply(x, torch.arange(8), seed=0, epoch=0, a=Augment(rotate=30))
    assert not torch.equal(out, x)
    assert torch.allclose(out.sum(dim=(1, 2, 3)), x.sum(dim=(1, 2, 3)), rtol=0.1)
    rows = torch.arange(9.0)[None, :, None]
    spread = ((out[:, 0] * (rows - 4) ** 2).sum(dim=(1, 2)) / out[:, 0].sum(dim=(1, 2))).sqrt()
    assert bool((spread < 2.5 * np.sin(np.radians(30)) + 0.5).all())  # the bar's ends move at most r * sin(30°)


def test_prefetching_in_a_thread_gives_the_batches_decoding_on_the_spot_gives() -> None:
    images = pixels(n=50)
    y = torch.arange(50) % 3
    threads: set[str] = set()

    def decode(rows: list[int]) -> torch.Tensor:
        threads.add(threading.current_thread().name)
        return images[rows]

    a = Augment(shift=1, flip=True)
    eager = ImageData(images, y, [10.0, 20.0], [2.0, 4.0], augment=a)
    lazy = ImageData(decode, y, [10.0, 20.0], [2.0, 4.0], augment=a)
    for epoch in (0, 1):
        order = eager.epoch_order(9, epoch)
        assert torch.equal(lazy.epoch_order(9, epoch), order)
        assert torch.equal(order, epoch_order(50, 9, epoch))
        # consecutive windows (prefetched), then a shard of non-consecutive samples (made on the spot)
        for idx in [order[0:8], order[8:16], order[16:24], order[24:40:2], order[40:50]]:
            b1, b2 = eager.batch(idx), lazy.batch(idx)
            assert torch.equal(b1.inputs["images"], b2.inputs["images"]) and torch.equal(b1.target, b2.target)
            expected = (apply(images[idx].float(), idx, 9, epoch, a) - torch.tensor([10.0, 20.0])[:, None, None]) / (
                torch.tensor([2.0, 4.0])[:, None, None]
            )
            assert torch.equal(b1.inputs["images"], expected) and b1.count == len(idx)
    assert any(t.startswith("trainflow-images") for t in threads)  # the next batch was decoded in the background


def test_evaluation_in_index_order_prefetches_exactly_the_next_window() -> None:
    """No epoch order (evaluation): the batches are consecutive windows of the index order, and each one after the
    first is decoded ahead, in the background, as exactly the window that follows: every image decoded once."""
    images = pixels(n=20)
    decoded: list[tuple[bool, list[int]]] = []

    def decode(rows: list[int]) -> torch.Tensor:
        decoded.append((threading.current_thread().name.startswith("trainflow-images"), rows))
        return images[rows]

    lazy = ImageData(decode, torch.arange(20) % 3, [10.0, 20.0], [2.0, 4.0])
    for idx in (torch.arange(0, 8), torch.arange(8, 16), torch.arange(16, 20)):
        assert torch.equal(lazy.batch(idx).target, idx % 3)
    assert sorted(decoded) == [(False, list(range(0, 8))), (True, list(range(8, 16))), (True, list(range(16, 20)))]


def test_files_decoded_for_a_device_are_normalised_on_the_host_with_no_copy_back() -> None:
    """Images decoded from files are normalised on the host (in the prefetch thread), then copied to the device.
    Was: mean/std lived on the device only and were copied back to the host for every batch, a device-to-host copy
    that waits for the training queued on the GPU. Here the device is `meta` (no GPU here), whose tensors cannot be
    copied back at all: a batch must never try."""
    images = pixels(n=20)
    lazy = ImageData(lambda rows: images[rows], torch.arange(20) % 3, [10.0, 20.0], [2.0, 4.0])
    lazy.to(torch.device("meta"))
    lazy.epoch_order(3, 0)
    for idx in (torch.arange(0, 8), torch.arange(8, 16)):  # the second was prefetched in the thread
        batch = lazy.batch(idx)
        assert batch.inputs["images"].device.type == "meta" and batch.inputs["images"].shape == (8, 2, 6, 5)
    host = ImageData(lambda rows: images[rows], torch.arange(20) % 3, [10.0, 20.0], [2.0, 4.0])
    expected = (images[:8].float() - torch.tensor([10.0, 20.0])[:, None, None]) / torch.tensor([2.0, 4.0])[
        :, None, None
    ]
    assert torch.equal(host.batch(torch.arange(8)).inputs["images"], expected)


class Interrupted(Exception):
    pass


SETTINGS: dict[str, Any] = {"epochs": 3, "batch_size": 8, "accumulate": 2, "checkpoint_every": 3, "eval_every": 5,
                            "log_every": 4, "keep_last": 2, "resume": "auto", "optimizer": "sgd",
                            "lr": 0.05}  # fmt: skip


def image_run(tmp: Path, lazy: bool, stop_after: int | None = None) -> Any:
    torch.manual_seed(5)
    model = CNN(2, 3, [8, 16], 1, image_size=[6, 5])
    t = make_trainer(tmp, model, **SETTINGS)
    if stop_after is not None:
        step = t.train_step

        def crash(micro: list[Any], count: int) -> None:
            if t.state.updates == stop_after:
                raise Interrupted
            step(micro, count)

        t.train_step = crash  # type: ignore[method-assign]
    images, y = pixels(n=75, seed=1), torch.arange(75) % 3
    source: Any = (lambda rows: images[rows]) if lazy else images
    train = ImageData(source, y, [128.0, 128.0], [64.0, 64.0], augment=Augment(shift=1, flip=True, rotate=15))
    val = ImageData(pixels(n=20, seed=2), torch.arange(20) % 3, [128.0, 128.0], [64.0, 64.0])
    with contextlib.suppress(Interrupted):
        t.fit(train, val)
    return t


@pytest.mark.parametrize(("lazy", "stop"), [(False, 7), (True, 9)])  # mid-epoch (5 updates per epoch)
def test_an_augmented_image_run_resumed_mid_epoch_equals_the_uninterrupted_one(
    tmp_path: Path, lazy: bool, stop: int
) -> None:
    whole = image_run(tmp_path / "whole", lazy)
    crashed = image_run(tmp_path / "resumed", lazy, stop_after=stop)
    assert crashed.state.updates == stop
    resumed = image_run(tmp_path / "resumed", lazy)
    assert resumed.resumed_from is not None and resumed.resumed_from % 5 != 0  # inside an epoch
    a, b = whole.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # BatchNorm's running stats too
    assert whole.state.history == resumed.state.history
    c = crashed.model.state_dict()
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_cnn_batchnorm_uses_batch_statistics_in_training_and_running_ones_in_eval() -> None:
    torch.manual_seed(0)
    model = build_model({"name": "cnn", "in_channels": 1, "out_features": 4, "channels": [8], "blocks": 2})
    x = torch.randn(6, 1, 8, 8) * 3 + 1
    model.train()
    first = model(x)
    assert first.shape == (6, 4)
    assert torch.allclose(model(x[:3]), first[:3]) is False  # a batch's statistics shape each sample's output
    model.eval()
    with torch.no_grad():
        assert torch.allclose(model(x[:3]), model(x)[:3], atol=1e-6)  # running statistics: per sample
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms and all(int(m.num_batches_tracked) == 2 for m in norms)


def test_cnn_flops_count_every_convolution_at_its_output_size() -> None:
    model = CNN(3, 10, [8, 16, 32], 2, norm="group", image_size=[13, 10])
    macs = 0

    def count(m: nn.Module, _: Any, out: torch.Tensor) -> None:
        nonlocal macs
        assert isinstance(m, nn.Conv2d)
        macs += out.shape[2] * out.shape[3] * m.out_channels * m.in_channels * m.kernel_size[0] * m.kernel_size[1]

    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            m.register_forward_hook(count)
    model.eval()
    model(torch.zeros(1, 3, 13, 10))
    assert train_flops_per_sample(model) == 6.0 * (macs + 32 * 10)
    assert train_flops_per_sample(CNN(3, 10, [8], 1)) is None  # no image size: no count, no error
