"""GPU checks of the engine: CUDA AMP (bf16, fp16 + GradScaler) against fp32, no host syncs, throughput and MFU.

On one CUDA GPU it trains the built-in text transformer on a synthetic 4-topic text task, the same seed and data for
each precision, and reports for each: final train loss, val accuracy, tokens/s and MFU (the engine's own figures,
engine/flops.py), plus the fp16 run's skipped updates (the GradScaler's overflow probes at the start). Then:
  - no host syncs: 20 `train_step` calls under `torch.cuda.set_sync_debug_mode("error")` (any op that makes the host
    wait for the GPU raises);
  - a forced non-finite gradient on 3 chosen updates under fp16: those updates are skipped on the device, the schedule
    index (`applied`) advances only on the others, and the weights stay finite.

    python bench/gpu_check.py [--layers 8] [--d-model 768] [--batch-size 128] [--epochs 2] [--compile]

`--device cpu` runs the same code on the CPU (fp32 and bf16; the forced skip in fp32, which the engine skips the same
way; no sync check) with a tiny model: a smoke test of this script, not a measurement:

    python bench/gpu_check.py --device cpu --layers 1 --d-model 64 --max-len 64 --batch-size 64 \\
        --n-train 2560 --epochs 1

The table goes to stdout; the last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from trainflow.engine.data import TextData
from trainflow.engine.objective import Objective
from trainflow.engine.precision import Precision
from trainflow.engine.trainer import Trainer
from trainflow.models.text import TextTransformer
from trainflow.params import TrainParams

VOCAB, CLASSES, TOPIC_SHARE = 8000, 4, 0.25


def make_text(n: int, seed: int, max_len: int) -> TextData:
    """Sequences of 16..max_len tokens; a quarter of each sequence's tokens come from its topic's vocabulary band."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    lengths = torch.randint(16, max_len + 1, (n,), generator=g)
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


def build(args: argparse.Namespace, precision: str, workdir: Path, **overrides: Any) -> tuple[Trainer, Records]:
    torch.manual_seed(0)
    model = TextTransformer(
        VOCAB, CLASSES, d_model=args.d_model, n_heads=args.d_model // 64, n_layers=args.layers, max_len=args.max_len
    )
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
    records = Records()
    trainer = Trainer(
        model,
        TrainParams(**settings),
        seed=0,
        device=torch.device(args.device),
        precision=Precision(precision, args.device),
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


def train_each_precision(args: argparse.Namespace, train: TextData, val: TextData, workdir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for precision in ("fp32", "bf16", "fp16") if args.device == "cuda" else ("fp32", "bf16"):
        trainer, records = build(args, precision, workdir)
        t0 = time.perf_counter()
        state = trainer.fit(train, val)
        wall = time.perf_counter() - t0
        last_loss = records.points[-1]["train_loss"]
        out[precision] = {
            "val_accuracy": state.best_metric,
            "final_train_loss": last_loss,
            "tokens_per_s": steady(records, "tokens_per_s"),
            "mfu": steady(records, "mfu"),
            "skipped_updates": state.updates - state.applied,
            "updates": state.updates,
            "wall_s": wall,
        }
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
    weight = trainer.model.tok_emb.weight  # type: ignore[union-attr]
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


def finite_or_null(obj: Any) -> Any:
    """NaN (MFU where the peak FLOP/s is unknown, e.g. on the CPU) as null, so the last line is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    return obj


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--n-train", type=int, default=20_000)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA GPU visible (--device cpu runs a smoke test of this script)")
    train, val = make_text(args.n_train, 0, args.max_len), make_text(2_000, 1, args.max_len)
    for data in (train, val):
        data.to(torch.device(args.device))  # batches are padded on the host and copied (pinned, non-blocking)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        runs = train_each_precision(args, train, val, work)
        nosync = no_sync_check(args, train, work)
        skip = forced_skip_check(args, train, work)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(
        f"\n{device}, torch {torch.__version__}, text transformer d={args.d_model} L={args.layers}, "
        f"batch {args.batch_size}, {args.n_train} sequences x {args.epochs} epochs, compile={args.compile}"
    )
    print(f"{'precision':<10}{'val acc':>9}{'train loss':>12}{'tokens/s':>13}{'MFU':>8}{'skipped':>9}{'wall s':>8}")
    for name, r in runs.items():
        print(
            f"{name:<10}{r['val_accuracy']:>9.4f}{r['final_train_loss']:>12.4f}{r['tokens_per_s']:>13,.0f}"
            f"{r['mfu']:>8.3f}{r['skipped_updates']:>9}{r['wall_s']:>8.1f}"
        )
    print(f"no host sync in train_step: {nosync}")
    print(f"forced inf on updates 10, 11, 30 (fp16): {skip}")
    print(
        json.dumps(
            finite_or_null(
                {
                    "device": device,
                    "torch": torch.__version__,
                    "compile": args.compile,
                    "runs": runs,
                    "no_sync": nosync,
                    "forced_skip": skip,
                }
            )
        )
    )


if __name__ == "__main__":
    main()
