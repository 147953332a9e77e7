"""Training samples/s reading a table from disk (MemmapData: a `pread` per row, the next batch in a thread) against
holding it in memory (TensorData), in one process, alternating, on the same batches of the same epoch order: an MLP
70 -> 256 -> 256 -> 2, AdamW, batch 1024 (issue 26: the streamed path's cost, without the stages around it).

    .venv/bin/python bench/streamed_train_rate.py [--rows 1000000] [--batches 400] [--repeats 3] [--threads N]

Prints the median samples/s of each and their ratio.
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
from trainflow.engine.data import Dataset, MemmapData, TensorData, epoch_order  # noqa: E402

FEATURES, BATCH = 70, 1024


def rate(data: Dataset, model: torch.nn.Module, opt: torch.optim.Optimizer, n: int, batches: int) -> float:
    order = data.epoch_order(0, 0) if isinstance(data, MemmapData) else epoch_order(n, 0, 0)
    started = time.perf_counter()
    for k in range(batches):
        b = data.batch(order[k * BATCH : (k + 1) * BATCH])
        loss = torch.nn.functional.cross_entropy(model(b.inputs["x"]), b.target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return batches * BATCH / (time.perf_counter() - started)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batches", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
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
        memory = TensorData(torch.from_numpy(x), torch.from_numpy(y))
        rates: dict[str, list[float]] = {"memory": [], "disk": []}
        for _ in range(args.repeats):
            rates["memory"].append(rate(memory, model, opt, args.rows, args.batches))
            rates["disk"].append(rate(disk, model, opt, args.rows, args.batches))
    m, d = statistics.median(rates["memory"]), statistics.median(rates["disk"])
    print(f"torch threads {torch.get_num_threads()}: in memory {m:,.0f} samples/s, from disk {d:,.0f}, "
          f"ratio {d / m:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
