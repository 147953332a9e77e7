"""The champion gate on pairs of real models (issue 27): how often does it promote a challenger that is no better, and
how often one that is?

On the default pipeline's data (builtin:digits: 269 test rows), with the split held fixed:
- **no real effect**: 20 pairs of models that differ only in the initialisation seed (model i+1 challenges model i);
- **truly better**: 20 pairs where the champion is deliberately under-trained (`train.epochs` 2 instead of 40) and the
  challenger is the fully trained model of the same seed.
Each pair is decided by the paired rule (`register.decide: paired`, the default: the bootstrap's 95% lower bound of
the improvement above 0) and by the point rule (the challenger's accuracy above the champion's), on the same outputs.

    .venv/bin/python bench/gate.py [--pairs 20]      # ~10 min on 2 cores (41 full trainings, 20 short ones)

Prints one line per pair, then the summary table (the one in BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from conftest import make_project  # noqa: E402  (a project holding this checkout's committed pipeline)

from trainflow.gate import Scored, compare, decide  # noqa: E402
from trainflow.params import load_params, write_overrides  # noqa: E402
from trainflow.paths import Paths  # noqa: E402
from trainflow.predict import ExportedModel  # noqa: E402
from trainflow.stages import run_stage  # noqa: E402
from trainflow.stages.register import scored  # noqa: E402


def trained(paths: Paths, overrides: list[str]) -> tuple[float, Scored]:
    """Train with `overrides` (the split as it is) and score the exported model on the test split, as register does."""
    shutil.rmtree(paths.checkpoints, ignore_errors=True)
    write_overrides(paths.params, overrides)
    params = load_params(paths.params)
    run_stage("train", params, paths)
    metrics, rows = scored(ExportedModel.load(paths.final), params, paths)
    return float(metrics["accuracy"]), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="trainflow-gate-") as tmp:
        root = make_project(Path(tmp) / "proj", {"train.progress": "false"})
        paths = Paths(root)
        for stage in ("ingest", "split"):
            run_stage(stage, load_params(paths.params), paths)
        full = [trained(paths, [f"seed={s}", "train.epochs=40"]) for s in range(args.pairs + 1)]
        short = [trained(paths, [f"seed={s}", "train.epochs=2"]) for s in range(args.pairs)]
        seed = 42  # the bootstrap's seed (params.yaml's seed)
        counts = {"no real effect": [0, 0], "truly better": [0, 0]}
        for kind, pairs in (
            ("no real effect", [(full[i + 1], full[i]) for i in range(args.pairs)]),
            ("truly better", [(full[i], short[i]) for i in range(args.pairs)]),
        ):
            for i, ((new_acc, new), (old_acc, old)) in enumerate(pairs):
                c = compare("accuracy", new, old, confidence=0.95, seed=seed)
                paired, _ = decide(c, "better", 0.0)
                point = new_acc > old_acc
                counts[kind][0] += paired
                counts[kind][1] += point
                m = c.mcnemar or {}
                print(f"{kind:15s} pair {i:2d}: challenger {new_acc:.4f} champion {old_acc:.4f} improvement "
                      f"{c.improvement:+.4f} [{c.low:+.4f}, {c.high:+.4f}] McNemar p {m.get('p_value', 1):.3f}: "
                      f"paired {'promotes' if paired else 'keeps'}, point {'promotes' if point else 'keeps'}",
                      flush=True)  # fmt: skip
        rows = len(full[0][1].labels)
    print()
    print(f"builtin:digits, {rows} test rows, {args.pairs} pairs each, {time.monotonic() - started:.0f} s")
    print()
    print("| pairs | paired gate promotes | point gate promotes |")
    print("|---|---:|---:|")
    for kind, (paired_n, point_n) in counts.items():
        print(f"| {kind} | {paired_n} of {args.pairs} | {point_n} of {args.pairs} |")


if __name__ == "__main__":
    main()
