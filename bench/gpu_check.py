"""GPU checks of the engine: CUDA AMP (bf16, fp16 + GradScaler) against fp32, no host syncs, throughput and MFU, and
the engine against a hand-written PyTorch loop.

On one CUDA GPU it trains the built-in text transformer on a synthetic 4-topic text task, the same seed and data for
each precision, and reports for each: final train loss, val accuracy, tokens/s and MFU (the engine's own figures,
engine/flops.py), peak GPU memory (of the whole fit, validation in batches of 1024 included), plus the fp16 run's
skipped updates (the GradScaler's overflow probes at the start). Then:
  - no host syncs: 20 `train_step` calls under `torch.cuda.set_sync_debug_mode("error")` (any op that makes the host
    wait for the GPU raises);
  - a forced non-finite gradient on 3 chosen updates under fp16: those updates are skipped on the device, the schedule
    index (`applied`) advances only on the others, and the weights stay finite;
  - ours vs raw (bf16, without and with torch.compile): the engine's `fit()` against a plain PyTorch loop written out
    here (`raw_loop`), same model and initial weights, same fused AdamW (decay on matrices only), warmup + cosine
    schedule, clipping, per-window loss and the same padded batches in the same order; both time intervals of
    `--raw-steps / 8` updates ending in a read of the device, and report the median tokens/s over all but the first
    interval (warm-up, compilation), MFU (the same FLOPs formula) and peak memory (torch.cuda.max_memory_allocated).

    python bench/gpu_check.py [--layers 8] [--d-model 768] [--batch-size 128] [--epochs 2] [--compile]
    python bench/gpu_check.py --part raw --layers 12 --d-model 768 --min-len 128 --max-len 512   # BERT-base size

`--part precisions` runs the first three, `--part raw` the last, `all` (the default) both. `--part speed` gathers
issue 47's figures in one command sized for one 10-minute call (scripts/gpu_check.sh runs it last): the engine with
`train.compile: reduce-overhead` against the raw CUDA loop and Lightning on bench/engine_overhead.py's MLP at batch
32/128/512; padded against packed text (`train.packing`) in bf16 compiled, ours and the raw loop on the same batches,
tokens/s and MFU; fp8 against bf16 (tokens/s, validation accuracy; fp8's params error where it cannot run). With
`--record` it writes benchmarks/gpu-speed.md (device, date, driver, torch) and its row of BENCHMARKS.md
(bench/results/gpu-speed.json, rendered by bench/render.py):

    python bench/gpu_check.py --part speed --record --layers 12 --d-model 768 --min-len 128 --max-len 512 \\
        --batch-size 64 --raw-steps 120 --n-train 10000

`--device cpu` runs the same code on the CPU (fp32 and bf16; the forced skip in fp16 too, which CPU autocast has; no
sync check; fp8 refused) with a tiny model: a smoke test of this script, not a measurement:

    python bench/gpu_check.py --device cpu --layers 1 --d-model 64 --max-len 64 --batch-size 64 \\
        --n-train 2560 --epochs 1 --raw-steps 40

The tables go to stdout; the last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import math
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from trainflow.core.errors import ParamsError
from trainflow.engine import flops
from trainflow.engine.loaders import LONGEST, TextData
from trainflow.engine.objective import Objective
from trainflow.engine.precision import resolve_precision
from trainflow.engine.schedule import lr_at
from trainflow.engine.trainer import Trainer
from trainflow.models.text import TextTransformer
from trainflow.params import TrainParams

VOCAB, CLASSES, TOPIC_SHARE = 8000, 4, 0.25
SEED = 0
ROOT = Path(__file__).resolve().parents[1]
INTERVALS = 8  # ours vs raw: each run is timed in this many intervals; the first (warm-up, compilation) is dropped


def make_text(n: int, seed: int, max_len: int, min_len: int = 16) -> TextData:
    """Sequences of min_len..max_len tokens; a quarter of each sequence's tokens come from its topic's vocabulary
    band."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g)
    band = (VOCAB - 1) // CLASSES
    sequences = []
    for y, length in zip(labels.tolist(), lengths.tolist()):
        tokens = torch.randint(1, VOCAB, (length,), generator=g)
        topical = torch.rand(length, generator=g) < TOPIC_SHARE
        tokens[topical] = 1 + y * band + torch.randint(0, band, (int(topical.sum()),), generator=g)
        sequences.append(tokens)
    return TextData(sequences, labels)


class Records:
    def __init__(self) -> None:
        self.points: list[dict[str, float]] = []

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.points.append({"step": step, **metrics})

    def close(self) -> None:
        pass


def make_model(args: argparse.Namespace) -> TextTransformer:
    """The same initial weights every time: heads of 64 dimensions, as BERT's."""
    torch.manual_seed(SEED)
    return TextTransformer(
        VOCAB, CLASSES, d_model=args.d_model, n_heads=args.d_model // 64, n_layers=args.layers, max_len=args.max_len
    )


def train_settings(args: argparse.Namespace, precision: str, **overrides: Any) -> TrainParams:
    settings: dict[str, Any] = {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "lr": 3e-4,
        "schedule": "cosine",
        "precision": precision,
        "device": args.device,
        "compile": args.compile,
        "progress": False,
        "log_every": 50,
        "resume": "never",
        "monitor": "val_accuracy",
        **overrides,
    }
    return TrainParams(**settings)


def build(args: argparse.Namespace, precision: str, workdir: Path, **overrides: Any) -> tuple[Trainer, Records]:
    records = Records()
    trainer = Trainer(
        make_model(args),
        train_settings(args, precision, **overrides),
        seed=SEED,
        device=torch.device(args.device),
        precision=resolve_precision(precision, torch.device(args.device)),  # fp8: a ParamsError where it cannot run
        objective=Objective("classification"),
        checkpoint_dir=workdir / precision,
        fingerprint=precision,
        logger=records,
    )
    return trainer, records


def steady(records: Records, key: str) -> float:
    """Median over the log points after the first (which includes warm-up and, with compile, compilation)."""
    values = [p[key] for p in records.points[1:] if key in p] or [p[key] for p in records.points if key in p]
    return float(torch.tensor(values).median()) if values else math.nan


def fresh_peak(device: torch.device) -> None:
    """Free what earlier runs left cached and start counting the peak anew."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_mb(device: torch.device) -> float:
    """The most memory tensors held since `fresh_peak` (torch.cuda.max_memory_allocated), in MiB; NaN on the CPU."""
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else math.nan


def train_each_precision(args: argparse.Namespace, train: TextData, val: TextData, workdir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    device = torch.device(args.device)
    for precision in ("fp32", "bf16", "fp16") if args.device == "cuda" else ("fp32", "bf16"):
        trainer, records = build(args, precision, workdir)
        fresh_peak(device)
        t0 = time.perf_counter()
        state = trainer.fit(train, val)
        wall = time.perf_counter() - t0
        last_loss = [p["train_loss"] for p in records.points if "train_loss" in p][-1]  # (the last point may be val's)
        out[precision] = {
            "val_accuracy": state.best_metric,
            "final_train_loss": last_loss,
            "tokens_per_s": steady(records, "tokens_per_s"),
            "mfu": steady(records, "mfu"),
            "peak_memory_mb": peak_mb(device),
            "skipped_updates": state.updates - state.applied,
            "updates": state.updates,
            "wall_s": wall,
        }
        del trainer
        print(f"  {precision}: {json.dumps(out[precision])}", file=sys.stderr, flush=True)
    return out


def no_sync_check(args: argparse.Namespace, train: TextData, workdir: Path) -> str:
    if args.device != "cuda":
        return "n/a on cpu"
    trainer, _ = build(args, "bf16", workdir / "nosync", epochs=1)
    data = trainer.prepare(train)
    windows = [[data.batch(torch.arange(i * 64, (i + 1) * 64))] for i in range(25)]
    for w in windows[:5]:  # warm-up outside the guard: first calls allocate and autotune
        trainer.train_step(w)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for w in windows[5:]:
            trainer.train_step(w)
        verdict = "ok: 20 train_step calls, no host sync"
    except RuntimeError as exc:
        verdict = f"FAILED: {exc}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return verdict


def applied(trainer: Trainer) -> int:
    """Updates applied so far (the device counter both decision paths keep)."""
    return trainer.counters.applied


def forced_skip_check(args: argparse.Namespace, train: TextData, workdir: Path) -> dict[str, Any]:
    """fp16: gradients made inf on updates 10, 11 and 30 -> exactly those (plus scaler probes) are skipped."""
    precision = "fp16"  # CPU autocast has fp16 too (slow, but the same GradScaler logic runs)
    trainer, _ = build(args, precision, workdir / "skip", epochs=1, max_steps=40, max_nonfinite=5)
    data = trainer.prepare(train)
    bad = {10, 11, 30}
    step = {"n": 0}
    weight = trainer.model.get_parameter("tok_emb.weight")
    weight.register_hook(lambda g: g * math.inf if step["n"] in bad else g)
    applied_before_bad = []
    for i in range(40):
        step["n"] = i
        before = applied(trainer)
        trainer.train_step([data.batch(torch.arange(i * 64, (i + 1) * 64))])
        after = applied(trainer)
        if i in bad:
            applied_before_bad.append(after - before)
    finite = all(bool(torch.isfinite(q).all()) for q in trainer.model.parameters())
    return {
        "forced_updates_applied": applied_before_bad,  # expect [0, 0, 0]
        "applied": applied(trainer),
        "updates": 40,
        "weights_finite": finite,
        "scale": float(trainer.scaler.get_scale()) if trainer.scaler.is_enabled() else None,
    }


def ours(
    args: argparse.Namespace,
    train: TextData,
    val: TextData,
    compile: bool,
    every: int,
    workdir: Path,
    precision: str = "bf16",
) -> dict[str, Any]:
    """The engine's fit() over one epoch of `train` (bf16 unless told): its own logged tokens/s and MFU, every `every`
    updates, and the validation accuracy at the end."""
    device = torch.device(args.device)
    trainer, records = build(args, precision, workdir, epochs=1, compile=compile, log_every=every)
    fresh_peak(device)
    state = trainer.fit(train, val)  # `val` is small: its one evaluation (after the last timed interval) costs little
    logged = [p for p in records.points if "tokens_per_s" in p]
    return {
        "val_accuracy": state.best_metric,
        "tokens_per_s": steady(records, "tokens_per_s"),
        "mfu": steady(records, "mfu"),
        "peak_memory_mb": peak_mb(device),
        "final_train_loss": logged[-1]["train_loss"],
        "intervals": len(logged),
    }


def raw_loop(args: argparse.Namespace, train: TextData, compile: bool, every: int) -> dict[str, Any]:
    """What `ours` trains, as a plain PyTorch loop: the same model and initial weights, the engine's sample order and
    padded batches (TextData.batch: padding on the host, pinned non-blocking copies), bf16 autocast, the loss of each
    window summed in fp32 and divided by its samples, clipping, fused AdamW without decay on biases and norms, and the
    same warmup + cosine schedule. The host reads the device once per `every` updates (the mean loss), as the
    engine's log does; tokens/s and MFU are measured over those intervals."""
    device = torch.device(args.device)
    p = train_settings(args, "bf16", epochs=1, compile=compile)
    fresh_peak(device)
    model = make_model(args).to(device)
    forward: Any = torch.compile(model) if compile else model
    decay = [q for q in model.parameters() if q.ndim >= 2]
    no_decay = [q for q in model.parameters() if q.ndim < 2]
    groups = [{"params": decay, "weight_decay": p.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=p.lr, fused=True)
    flops_of = flops.flops_per_batch(model)
    assert flops_of is not None
    peak = flops.peak_flops(device, torch.bfloat16)
    windows = train.epoch_order(SEED, 0).split(p.batch_size)
    total, warmup = len(windows), round(p.warmup_fraction * len(windows))
    loss_sum = torch.zeros((), device=device)
    intervals: list[dict[str, float]] = []
    start, tokens, work = time.perf_counter(), 0, 0.0
    model.train()
    for k, idx in enumerate(windows):
        batch = train.batch(idx)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = forward(**batch.inputs)
        loss = F.cross_entropy(out.float(), batch.target, reduction="sum") / batch.count
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), p.max_grad_norm or math.inf)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(p.schedule, k, total, warmup, p.lr, p.min_lr)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_sum += loss.detach()
        tokens += train.tokens(idx)
        work += flops_of(batch)
        if (k + 1) % every == 0:
            mean_loss = loss_sum.item() / every  # the interval's one read of the device: it waits for the GPU
            loss_sum.zero_()
            now = time.perf_counter()
            seconds = now - start
            mfu = work / seconds / peak if peak else math.nan
            intervals.append({"tokens_per_s": tokens / seconds, "mfu": mfu, "train_loss": mean_loss})
            start, tokens, work = now, 0, 0.0
    steady_part = intervals[1:] or intervals
    return {
        "tokens_per_s": float(torch.tensor([i["tokens_per_s"] for i in steady_part]).median()),
        "mfu": float(torch.tensor([i["mfu"] for i in steady_part]).median()),
        "peak_memory_mb": peak_mb(device),
        "final_train_loss": intervals[-1]["train_loss"],
        "intervals": len(intervals),
    }


def timed_text(args: argparse.Namespace) -> tuple[int, TextData, TextData, dict[str, Any]]:
    """What ours and the raw loop train on when timed against each other: a log interval of raw_steps / INTERVALS
    updates, one epoch of that many whole windows (no partial last one) on the device, a small val set, and the
    figures' header."""
    every = max(1, args.raw_steps // INTERVALS)
    steps = every * max(1, args.raw_steps // every)
    train = make_text(steps * args.batch_size, 2, args.max_len, args.min_len)
    val = make_text(64, 3, args.max_len, args.min_len)
    for data in (train, val):
        data.to(torch.device(args.device))
    return every, train, val, {"updates": steps, "batch_size": args.batch_size, "every": every}


def ours_vs_raw(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Eager and compiled: raw, then ours, on one epoch of raw_steps windows (whole ones: no partial last window)."""
    every, train, val, out = timed_text(args)
    # A first eager pass, not counted, so that neither timed run is the process's first over these batch widths
    # (kernel choices per shape, the caching allocator's blocks). Timed first, the raw loop ran at half the speed of
    # the engine run after it on an H200 (2026-11-26); this pass shows whether being first was the cause.
    out["warm_up"] = raw_loop(args, train, False, every)
    print(f"  warm-up (raw, eager, not counted): {json.dumps(finite_or_null(out['warm_up']))}", file=sys.stderr)
    for mode, compile in (("eager", False), ("compiled", True)):
        raw = raw_loop(args, train, compile, every)
        mine = ours(args, train, val, compile, every, workdir / f"ours-{mode}")
        out[mode] = {"ours": mine, "raw": raw, "ours_over_raw": mine["tokens_per_s"] / raw["tokens_per_s"]}
        print(f"  {mode}: {json.dumps(finite_or_null(out[mode]))}", file=sys.stderr, flush=True)
    return out


def engine_vs_raw(args: argparse.Namespace) -> dict[str, Any]:
    """bench/engine_overhead.py on this device, ours with train.compile: reduce-overhead (forward and backward as CUDA
    graphs), against its eager hand-written loop and Lightning, at batch 32, 128 and 512: its last line's figures.
    Without Lightning (the bench extra) ours and the raw loop still run; the Lightning rows say it was not installed."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import engine_overhead

    argv = ["--device", args.device, "--compile", "reduce-overhead", "--repeats", str(args.engine_repeats),
            "--n-train", str(args.engine_rows)]  # fmt: skip
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        engine_overhead.main(argv)
    print(out.getvalue(), file=sys.stderr)
    figures: dict[str, Any] = json.loads(out.getvalue().strip().splitlines()[-1])
    return {"command": "python bench/engine_overhead.py " + " ".join(argv), **figures}


def packed_vs_padded(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """bf16, compiled: the engine and the raw loop on padded batches, then both on packed ones (train.packing's
    layout for the text transformer: TextData.pack, rows as wide as each batch's longest sequence; the raw loop takes
    the same batches from TextData.batch), over the same raw_steps windows."""
    every, train, val, out = timed_text(args)
    for layout, width in (("padded", None), ("packed", LONGEST)):
        train.pack_width = width
        raw = raw_loop(args, train, True, every)
        mine = ours(args, train, val, True, every, workdir / f"pack-{layout}")
        out[layout] = {"ours": mine, "raw": raw, "ours_over_raw": mine["tokens_per_s"] / raw["tokens_per_s"]}
        print(f"  {layout}: {json.dumps(finite_or_null(out[layout]))}", file=sys.stderr, flush=True)
    return out


def fp8_vs_bf16(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The engine compiled, in bf16 then in fp8 (train.precision: fp8, torchao's float8 training), one epoch of
    n_train sequences from the same initial weights: validation accuracy and tokens/s. Where fp8 cannot run (not a
    Hopper GPU, no torchao) its params error is the result."""
    device = torch.device(args.device)
    train = make_text(args.n_train, 0, args.max_len, args.min_len)
    val = make_text(2_000, 1, args.max_len, args.min_len)
    for data in (train, val):
        data.to(device)
    every = 50
    out: dict[str, Any] = {"sequences": args.n_train}
    for precision in ("bf16", "fp8"):
        try:
            out[precision] = ours(args, train, val, True, every, workdir / f"fp8-{precision}", precision)
        except ParamsError as exc:  # its problems in one line (a table cell)
            out[precision] = {"skipped": "; ".join(f"{field}: {why}" for field, why in exc.problems)}
        print(f"  {precision}: {json.dumps(finite_or_null(out[precision]))}", file=sys.stderr, flush=True)
    return out


def driver_version() -> str:
    """The NVIDIA driver's version (nvidia-smi), or why it is unknown."""
    try:
        found = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown (no nvidia-smi)"
    return found.stdout.strip().splitlines()[0]


def share(value: float | None) -> str:
    """An MFU as a percentage; n/a where the device's peak is unknown (the CPU)."""
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.1%}"


def speed_table(figures: dict[str, Any]) -> list[str]:
    """Issue 47's GPU figures as markdown rows: what, ours, the yardstick, the ratio, the target."""
    rows = ["| what | ours | yardstick | ratio | target |", "|---|---:|---:|---:|---:|"]
    engine = figures["engine"]
    for bs, f in engine["per_batch_size"].items():
        ours_sps = f"{f['ours_samples_per_s']:,.0f}"
        rows.append(f"| MLP batch {bs}, reduce-overhead: samples/s vs raw CUDA loop | {ours_sps} "
                    f"| {f['raw_samples_per_s']:,.0f} | {f['ours_over_raw']:.3f} | ≥ 0.97 |")  # fmt: skip
        if f["ours_over_lightning"] is None:
            rows.append(f"| MLP batch {bs}, reduce-overhead: samples/s vs Lightning | not run: Lightning is not "
                        "installed (pip install -e '.[bench]') | | | ≥ 1.5 |")  # fmt: skip
        else:
            rows.append(f"| MLP batch {bs}, reduce-overhead: samples/s vs Lightning | {ours_sps} | "
                        f"{f['lightning_samples_per_s']:,.0f} | {f['ours_over_lightning']:.3f} | ≥ 1.5 |")  # fmt: skip
    packing = figures["packing"]
    for layout in ("padded", "packed"):
        f = packing[layout]
        rows.append(f"| text, {layout}, bf16 compiled: tokens/s vs raw loop ({layout}) | "
                    f"{f['ours']['tokens_per_s']:,.0f} | {f['raw']['tokens_per_s']:,.0f} | {f['ours_over_raw']:.3f} "
                    "| ≥ 0.97 |")  # fmt: skip
        mfu = f"{share(f['ours']['mfu'])} | {share(f['raw']['mfu'])} (raw)"
        rows.append(f"| text, {layout}, bf16 compiled: MFU | {mfu} | | ≥ 40% |")
    fp8 = figures["fp8"]
    if "skipped" in fp8["fp8"] or "skipped" in fp8["bf16"]:
        why = fp8["fp8"].get("skipped") or fp8["bf16"].get("skipped")
        rows.append(f"| fp8 vs bf16 | not run: {why} | | | |")
    else:
        a, b = fp8["fp8"], fp8["bf16"]
        rows.append(f"| fp8 vs bf16, compiled: tokens/s | {a['tokens_per_s']:,.0f} | {b['tokens_per_s']:,.0f} | "
                    f"{a['tokens_per_s'] / b['tokens_per_s']:.3f} | |")  # fmt: skip
        rows.append(f"| fp8 vs bf16: val accuracy | {a['val_accuracy']:.4f} | {b['val_accuracy']:.4f} | "
                    f"{100 * (a['val_accuracy'] - b['val_accuracy']):+.1f} points | within 0.5 points |")  # fmt: skip
    return rows


def speed(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Issue 47's GPU figures in one command: the engine against the raw CUDA loop and Lightning with the captured
    step (MLP, batch 32/128/512), padded against packed text in bf16 compiled (MFU), fp8 against bf16. With --record,
    the table goes to benchmarks/gpu-speed.md (device, date, driver, torch) and its headline to BENCHMARKS.md."""
    figures: dict[str, Any] = {}
    started = time.perf_counter()
    figures["engine"] = engine_vs_raw(args)
    figures["packing"] = packed_vs_padded(args, workdir)
    figures["fp8"] = fp8_vs_bf16(args, workdir)
    figures["seconds"] = round(time.perf_counter() - started, 1)
    return figures


def write_speed_page(figures: dict[str, Any], argv: list[str]) -> None:
    """benchmarks/gpu-speed.md from this run, and its headline (bench/record.py) for BENCHMARKS.md's table."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from record import command_line, record

    when = datetime.now(UTC).strftime("%Y-%m-%d")
    command = command_line(argv)
    page = [
        "# GPU speed: the captured step, packed text, fp8 (issue 47)",
        "",
        f"Written by `{command}` on {when}: {figures['device']}, driver {figures['driver']}, torch {figures['torch']} "
        f"(CUDA {figures['cuda']}), {figures['speed']['seconds']} s in all. Text: a transformer of {figures['model']} "
        "(its tokens per sequence), synthetic 4-topic sequences. Each figure is from this one run.",
        "",
        *speed_table(figures["speed"]),
        "",
        "The text rows: a text transformer of the sizes above, bf16, torch.compile, the same windows for ours and",
        "a hand-written loop that takes the same batches (`raw_loop`), tokens/s and MFU as medians over intervals but",
        "the first. The MLP rows: `bench/engine_overhead.py` (its own table is in this run's stderr).",
        "",
    ]
    (ROOT / "benchmarks" / "gpu-speed.md").write_text("\n".join(page))
    speed_figures = figures["speed"]
    engine = speed_figures["engine"]
    packed = speed_figures["packing"]["packed"]["ours"]["mfu"]
    against_lightning = engine["ours_over_lightning"]
    headline = (
        f"captured MLP ours/raw {engine['ours_over_raw']:.3f}, ours/Lightning "
        + ("not measured" if against_lightning is None else f"{against_lightning:.3f}")
        + f"; packed bf16 compiled MFU {share(packed)}"
    )
    met = "yes" if engine["ours_over_raw"] >= 0.97 and (packed or 0) >= 0.40 else "no"
    record("gpu-speed", what="GPU speed: captured step, packed text, fp8 (issue 47)", command=command,
           headline=headline, target="ours/raw ≥ 0.97; MFU ≥ 40%", met=met, page="benchmarks/gpu-speed.md")  # fmt: skip


def finite_or_null(obj: Any) -> Any:
    """NaN (MFU where the peak FLOP/s is unknown, e.g. on the CPU) as null, so the last line is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    return obj


def print_precisions(runs: dict[str, Any], nosync: str, skip: dict[str, Any]) -> None:
    print(
        f"{'precision':<10}{'val acc':>9}{'train loss':>12}{'tokens/s':>13}{'MFU':>8}{'peak MiB':>10}{'skipped':>9}"
        f"{'wall s':>8}"
    )
    for name, r in runs.items():
        print(
            f"{name:<10}{r['val_accuracy']:>9.4f}{r['final_train_loss']:>12.4f}{r['tokens_per_s']:>13,.0f}"
            f"{r['mfu']:>8.3f}{r['peak_memory_mb']:>10,.0f}{r['skipped_updates']:>9}{r['wall_s']:>8.1f}"
        )
    print(f"no host sync in train_step: {nosync}")
    print(f"forced inf on updates 10, 11, 30 (fp16): {skip}")


def print_vs_raw(result: dict[str, Any]) -> None:
    print(
        f"\nours vs a plain PyTorch loop, bf16: {result['updates']} updates of {result['batch_size']} sequences, "
        f"medians over intervals of {result['every']} updates but the first"
    )
    print(f"{'':<10}{'ours tok/s':>13}{'raw tok/s':>13}{'ours/raw':>10}{'ours MFU':>10}{'raw MFU':>9}{'ours MiB':>10}"
          f"{'raw MiB':>9}")  # fmt: skip
    for mode in ("eager", "compiled"):
        o, r = result[mode]["ours"], result[mode]["raw"]
        print(
            f"{mode:<10}{o['tokens_per_s']:>13,.0f}{r['tokens_per_s']:>13,.0f}{result[mode]['ours_over_raw']:>10.3f}"
            f"{o['mfu']:>10.3f}{r['mfu']:>9.3f}{o['peak_memory_mb']:>10,.0f}{r['peak_memory_mb']:>9,.0f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--min-len", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--n-train", type=int, default=20_000)
    ap.add_argument("--compile", action="store_true", help="the precision runs through torch.compile")
    ap.add_argument("--part", choices=["all", "precisions", "raw", "speed"], default="all")
    ap.add_argument("--engine-repeats", type=int, default=3, help="--part speed: bench/engine_overhead.py's repeats")
    ap.add_argument("--engine-rows", type=int, default=50_000, help="--part speed: bench/engine_overhead.py's rows")
    ap.add_argument("--record", action="store_true", help="--part speed: write benchmarks/gpu-speed.md and its row")
    ap.add_argument("--raw-steps", type=int, default=200, help="updates of each ours-vs-raw run")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA GPU visible (--device cpu runs a smoke test of this script)")
    figures: dict[str, Any] = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    figures |= {"torch": torch.__version__, "cuda": torch.version.cuda, "model": {"d_model": args.d_model,
                "layers": args.layers, "min_len": args.min_len, "max_len": args.max_len}}  # fmt: skip
    print(
        f"{figures['device']}, torch {torch.__version__}, text transformer d={args.d_model} L={args.layers}, "
        f"sequences of {args.min_len}-{args.max_len} tokens, batch {args.batch_size}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.part in ("all", "precisions"):
            train = make_text(args.n_train, 0, args.max_len, args.min_len)
            val = make_text(2_000, 1, args.max_len, args.min_len)
            for data in (train, val):
                data.to(torch.device(args.device))  # batches are padded on the host and copied (pinned, non-blocking)
            runs = train_each_precision(args, train, val, work)
            nosync = no_sync_check(args, train, work)
            skip = forced_skip_check(args, train, work)
            print(f"\n{args.n_train} sequences x {args.epochs} epochs, compile={args.compile}")
            print_precisions(runs, nosync, skip)
            figures |= {"compile": args.compile, "runs": runs, "no_sync": nosync, "forced_skip": skip}
        if args.part in ("all", "raw"):
            figures["vs_raw"] = ours_vs_raw(args, work)
            print_vs_raw(figures["vs_raw"])
        if args.part == "speed":
            figures["driver"] = driver_version() if args.device == "cuda" else "n/a"
            figures["speed"] = speed(args, work)
            print("\n".join(speed_table(figures["speed"])))
            if args.record:
                write_speed_page(finite_or_null(figures), sys.argv[1:])
    print(json.dumps(finite_or_null(figures)))


if __name__ == "__main__":
    main()
