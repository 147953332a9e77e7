"""Distributed overhead: trainflow's Trainer on 2 DDP processes vs a minimal hand-written DDP loop, same everything.

Both run in the same two ranks (gloo on CPU; nccl on GPUs with --device cuda), started once by trainflow's launcher
(torch's elastic_launch), and alternate within each repeat (in a rotating order). Both train bench/engine_overhead.py's
MLP from the same initial weights on the same synthetic table, in the same global sample order, with fused AdamW,
warmup + cosine per update, clipping at 1.0 and a validation pass per epoch. Each update's global batch is
2 x batch_size: ours splits it into two contiguous shards and sums gradients (its exact-accumulation contract); the
hand-written loop gives each rank the same shard, averages the mean loss with DDP's default all-reduce. What is
timed is the whole fit() of each, between barriers; throughput is global training samples / wall seconds.

    .venv/bin/python bench/distributed_overhead.py [--batch-size 256] [--epochs 2] [--rows 50000] [--repeats 5]

Target: ours / hand-written >= 0.97 (median of the per-repeat ratios). "ours, preemptible" is the Trainer as the train
stage runs it, exchanging a stop flag between the ranks every N updates (trainflow.engine.preempt): its cost.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_overhead as eo  # noqa: E402  (the model, data, optimizer and schedule the single-process bench uses)

from trainflow.engine import distributed  # noqa: E402
from trainflow.engine.loaders import TensorData  # noqa: E402
from trainflow.engine.objective import Objective  # noqa: E402
from trainflow.engine.precision import Precision  # noqa: E402
from trainflow.engine.trainer import Trainer  # noqa: E402
from trainflow.params import TrainParams  # noqa: E402

TARGET = 0.97


def ours(
    group: distributed.Group,
    data: tuple[torch.Tensor, ...],
    batch: int,
    epochs: int,
    device: torch.device,
    preemptible: bool = False,
) -> None:
    x, y, x_val, y_val = data
    p = TrainParams(
        epochs=epochs, batch_size=batch, accumulate=1, lr=eo.LR, min_lr=eo.MIN_LR, weight_decay=eo.WEIGHT_DECAY,
        warmup_fraction=eo.WARMUP_FRACTION, schedule="cosine", max_grad_norm=eo.MAX_GRAD_NORM, precision="fp32",
        progress=False, resume="never", log_every=50, patience=10**6, world_size=group.world_size,
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="trainflow-bench-") as tmp:
        trainer = Trainer(
            eo.make_model(), p, seed=eo.SEED, device=device, precision=Precision("fp32", device.type),
            objective=Objective("classification"), checkpoint_dir=Path(tmp), fingerprint="bench", group=group,
        )  # fmt: skip
        trainer.preemptible = preemptible  # the train stage's setting: the ranks exchange a stop flag each update
        trainer.fit(TensorData(x, y, device), TensorData(x_val, y_val, device))


def hand_written(
    group: distributed.Group, data: tuple[torch.Tensor, ...], batch: int, epochs: int, device: torch.device
) -> None:
    from torch.nn.parallel import DistributedDataParallel

    x, y, x_val, y_val = data
    model = eo.make_model().to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    params = [q for q in model.parameters() if q.requires_grad]
    opt = eo.make_optimizer(model)
    window = batch * group.world_size
    total = math.ceil(len(x) / window) * epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, eo.lr_lambda(total, round(eo.WARMUP_FRACTION * total)))
    for epoch in range(epochs):
        for idx in eo.epoch_order(len(x), epoch).to(device).split(window):
            mine = idx[len(idx) * group.rank // group.world_size : len(idx) * (group.rank + 1) // group.world_size]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(ddp(x[mine]), y[mine]).backward()
            torch.nn.utils.clip_grad_norm_(params, eo.MAX_GRAD_NORM)
            opt.step()
            sched.step()
        if group.is_main:
            eo.validate(model, x_val, y_val)
        group.barrier()


def ours_preemptible(
    group: distributed.Group, data: tuple[torch.Tensor, ...], batch: int, epochs: int, device: torch.device
) -> None:
    ours(group, data, batch, epochs, device, preemptible=True)


WAYS = {"ours": ours, "ours, preemptible": ours_preemptible, "hand-written": hand_written}


def rank(rows: int, batch: int, epochs: int, repeats: int, device_name: str) -> dict[str, list[float]]:
    device = distributed.device_for(torch.device(device_name))
    world = int(os.environ["WORLD_SIZE"])
    group = distributed.init(world, "ddp", distributed.backend_for("auto", device), device)
    data = eo.make_data(rows, rows // 10)
    seconds: dict[str, list[float]] = {w: [] for w in WAYS}
    names = list(WAYS)
    for r in range(repeats + 1):  # the first round warms up (allocator, kernels) and is not counted
        for name in names[r % len(names) :] + names[: r % len(names)]:
            group.barrier()
            start = time.perf_counter()
            WAYS[name](group, data, batch, epochs, device)
            group.barrier()
            if r:
                seconds[name].append(time.perf_counter() - start)
    distributed.shutdown(group)
    return seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--batch-size", type=int, default=256, help="per process")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--record", action="store_true", help="write the headline to bench/results/ (bench/record.py)")
    a = ap.parse_args(argv)
    seconds = distributed.launch(a.world_size, rank, a.rows, a.batch_size, a.epochs, a.repeats, a.device)
    samples = a.rows * a.epochs
    hand = seconds["hand-written"]
    ratios = {w: [h / o for o, h in zip(seconds[w], hand)] for w in WAYS if w != "hand-written"}  # time = throughput
    print(f"{a.world_size} processes ({a.device}), {a.rows} rows x {a.epochs} epochs, batch {a.batch_size} per process")
    print("| way | median samples/s | median s | runs | / hand-written (median of per-repeat ratios) |")
    print("|---|---:|---:|---:|---:|")
    for name, s in seconds.items():
        shown = f"{statistics.median(ratios[name]):.3f}" if name in ratios else "1"
        print(f"| {name} | {samples / statistics.median(s):,.0f} | {statistics.median(s):.2f} | {len(s)} | {shown} |")
    ratio = statistics.median(ratios["ours"])
    of_medians = statistics.median(hand) / statistics.median(seconds["ours"])
    print(f"\nours: ratio of the median throughputs (the table's columns): {of_medians:.3f}")
    print(f"ours / hand-written throughput, median of {len(ratios['ours'])} per-repeat ratios: {ratio:.3f}", end="")
    print(f" (target >= {TARGET})")
    print(json.dumps({"ratio": ratio, "ratios": ratios, "seconds": seconds}))
    if a.record:
        from record import command_line, record

        preemptible = statistics.median(ratios["ours, preemptible"])
        met = {
            (True, True): "yes",
            (True, False): "partly: `fit()` yes, preemptible no",
            (False, True): "partly: `fit()` no, preemptible yes",
            (False, False): "no",
        }
        record(
            "distributed",
            what=f"Distributed: {a.world_size} DDP processes vs a hand-written DDP loop",
            command=command_line(argv),
            headline=f"/ hand-written: `fit()` {ratio:.3f}, preemptible (the train stage) {preemptible:.3f}",
            target=f"≥ {TARGET}",
            met=met[ratio >= TARGET, preemptible >= TARGET],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
