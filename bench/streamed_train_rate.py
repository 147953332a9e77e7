"""Training samples/s reading a table from disk (MemmapData: a `pread` per row, the next batch in a thread) against
holding it in memory (TensorData), in one process, alternating, on the same batches of the same epoch order: an MLP
70 -> 256 -> 256 -> 2, AdamW, batches of 1024 (issue 26: the streamed path's cost, without the stages around it).

    .venv/bin/python bench/streamed_train_rate.py [--rows 1000000] [--batches 400] [--chunk 20] [--threads N]
        [--shuffle rows|blocks] [--batch 1024]

`--shuffle`: the disk side's sample order (train.shuffle; blocks, what a streamed table gets by default, reads 64
consecutive rows at once); the memory side's is always rows (a gather costs the same in any order).

The two sides alternate every `--chunk` batches; it prints the median chunk's samples/s of each and the median ratio
of adjacent chunks.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainflow.engine.loaders import Dataset, MemmapData, TensorData, epoch_order  # noqa: E402

FEATURES = 70


def chunk_seconds(
    data: Dataset,
    order: torch.Tensor,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    start: int,
    batches: int,
    size: int,
) -> float:
    """Seconds to train on `batches` batches of `size` of `data` from batch `start` of `order`."""
    started = time.perf_counter()
    for k in range(start, start + batches):
        b = data.batch(order[k * size : (k + 1) * size])
        loss = torch.nn.functional.cross_entropy(model(b.inputs["x"]), b.target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batches", type=int, default=400)
    ap.add_argument("--chunk", type=int, default=20, help="batches per chunk (the sides alternate per chunk)")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    ap.add_argument("--shuffle", choices=["rows", "blocks"], default="blocks", help="the disk side's order")
    ap.add_argument("--batch", type=int, default=1024, help="samples per batch")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    x = np.random.default_rng(0).standard_normal((args.rows, FEATURES), dtype=np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 2))  # fmt: skip
    opt = torch.optim.AdamW(model.parameters())
    with tempfile.TemporaryDirectory() as tmp:
        np.save(Path(tmp) / "x.npy", x)
        disk = MemmapData(np.load(Path(tmp) / "x.npy", mmap_mode="r"), y)
        disk.shuffle = args.shuffle
        memory = TensorData(torch.from_numpy(x), torch.from_numpy(y))
        # Interleaved in chunks of `--chunk` batches (memory, disk, memory, disk, ...), each side walking its own
        # epoch order forward (so the disk side's read-ahead predicts every batch, as in training): this machine's
        # slow spells last seconds, and a ratio of adjacent chunks cancels them. Ratio: the median of the ratios of
        # adjacent chunks; samples/s: the median chunk of each side.
        orders = {"memory": epoch_order(args.rows, 0, 0), "disk": disk.epoch_order(0, 0)}
        seconds: dict[str, list[float]] = {"memory": [], "disk": []}
        for c in range(args.batches // args.chunk):
            for name, data in (("memory", memory), ("disk", disk)):
                seconds[name].append(
                    chunk_seconds(data, orders[name], model, opt, c * args.chunk, args.chunk, args.batch)
                )
    per_chunk = args.chunk * args.batch
    m, d = per_chunk / statistics.median(seconds["memory"]), per_chunk / statistics.median(seconds["disk"])
    ratio = statistics.median(t_m / t_d for t_m, t_d in zip(seconds["memory"], seconds["disk"]))
    print(f"torch threads {torch.get_num_threads()}, disk order {args.shuffle}, batch {args.batch}: in memory "
          f"{m:,.0f} samples/s, from disk {d:,.0f}, "
          f"ratio {ratio:.2f} (median of {len(seconds['disk'])} adjacent chunks of {args.chunk} batches)")  # fmt: skip


if __name__ == "__main__":
    main()
