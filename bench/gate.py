"""The paired promotion gate's level and power: how often it promotes a challenger that is no better, and one that is.

Default: the null-rate table. For every metric `register.gate_metric` accepts, at n test rows in {10, 20, 50, 269},
`--sims` simulated pairs (300) drawn by a generator of two exchangeable models (neither is better: which one is the
challenger does not matter), each decided by trainflow.registry.gate.compare/decide (`promote_if: better`, margin 0,
95%):
- regression (r2, rmse, mae): labels N(0, 1); each model's errors Gaussian N(0, 1), or Student t with 2 degrees of
  freedom (heavy tails: infinite variance);
- classification (accuracy, log_loss, f1_macro, roc_auc, pr_auc, ece): 2 or 3 classes equally likely; each model sees
  noisy logits z = s * onehot(label) + N(0, 1) per class (its own noise, s = 1.5) and outputs their calibrated
  posterior softmax(s * z).
Each null cell's promote rate must be at most the level (5%) plus 2 Monte-Carlo standard errors of a proportion at
5% (2.5 points at 300 simulations); a cell above it is marked. Beside it, the power on a real improvement of the
same generator: regression errors scaled by 0.8 (Gaussian: the challenger's rmse 20% lower); classification, the
challenger at s = 2.5 and calibrated, the champion at s = 1.5 and overconfident (logits doubled). "test" is the
test's own rejection rate, the minimum number of rows aside (the gate keeps the champion below gate.MIN_ROWS).
A last table is outside the exchangeable null: two regression models with the same expected squared (or absolute)
error, Gaussian against Laplace errors, whose differences are skewed; no test of a mean holds its level there on a
few rows (module docstring of trainflow.registry.gate).

    .venv/bin/python bench/gate.py                      # the tables, a few minutes on 2 cores
    .venv/bin/python bench/gate.py --old 7f142e6        # the same simulation against the gate of a git revision
    .venv/bin/python bench/gate.py --real-models        # pairs of trained digits models (~10 min)

`--permutations` (default 199) is the number of random swaps for f1_macro, roc_auc, pr_auc and ece, whose every
swap recomputes both metrics (the gate itself uses gate.PERMUTATIONS); a Monte-Carlo p-value that counts the
observed pattern holds its level at any number of swaps, fewer only cost power. With --old, the same number is the
old bootstrap's resample count for those metrics (their per-resample metric vectorised here, the values evaluate's).

--real-models: on the default pipeline's data (builtin:digits: 269 test rows), with the split held fixed, 20 pairs of
models that differ only in the initialisation seed (model i+1 challenges model i), and 20 pairs where the champion is
under-trained (`train.epochs` 2 instead of 40) and the challenger is the fully trained model of the same seed; each
decided by the paired rule and by the point rule (the challenger's accuracy above the champion's).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainflow.registry import gate  # noqa: E402
from trainflow.registry.gate import Scored  # noqa: E402

LEVEL = 0.05
SIZES = (10, 20, 50, 269)
REGRESSION = ("r2", "rmse", "mae")
CLASSIFICATION = ("accuracy", "log_loss", "f1_macro", "roc_auc", "pr_auc", "ece")
Pair = tuple[Scored, Scored]  # (challenger, champion)


# --- generators: (null pair, improved pair) of n rows ---------------------------------------------------------------


def regression(errors: Callable[[np.random.Generator, int], np.ndarray]) -> Callable[..., tuple[Pair, Pair]]:
    def draw(rng: np.random.Generator, n: int) -> tuple[Pair, Pair]:
        y = rng.normal(0, 1, n)
        new, old, better = errors(rng, n), errors(rng, n), 0.8 * errors(rng, n)
        return (Scored(y, y + new), Scored(y, y + old)), (Scored(y, y + better), Scored(y, y + old))

    return draw


def classification(classes: int, signal: float = 1.5, better: float = 2.5) -> Callable[..., tuple[Pair, Pair]]:
    def model(rng: np.random.Generator, y: np.ndarray, s: float, temperature: float = 1.0) -> Scored:
        z = s * np.eye(classes)[y] + rng.normal(0, 1, (len(y), classes))
        logits = temperature * s * z  # s * z: the log posterior odds of these logits, so softmax of it is calibrated
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        return Scored(y, p / p.sum(axis=1, keepdims=True))

    def draw(rng: np.random.Generator, n: int) -> tuple[Pair, Pair]:
        y = rng.integers(0, classes, n)
        null = model(rng, y, signal), model(rng, y, signal)
        return null, (model(rng, y, better), model(rng, y, signal, temperature=2.0))

    return draw


def laplace_vs_gaussian(metric: str) -> Callable[..., tuple[Pair, Pair]]:
    """Not exchangeable: the challenger's errors Laplace, the champion's Gaussian, with the same expected squared
    error (rmse) or absolute error (mae)."""
    scale = 1 / math.sqrt(2) if metric != "mae" else math.sqrt(2 / math.pi)  # Laplace(b): E e^2 = 2 b^2, E|e| = b

    def draw(rng: np.random.Generator, n: int) -> tuple[Pair, Pair]:
        y = rng.normal(0, 1, n)
        new, old = rng.laplace(0, scale, n), rng.normal(0, 1, n)
        return (Scored(y, y + new), Scored(y, y + old)), (Scored(y, y + 0.8 * new), Scored(y, y + old))

    return draw


GENERATORS: dict[str, tuple[tuple[str, ...], Callable[..., tuple[Pair, Pair]]]] = {
    "gaussian errors": (REGRESSION, regression(lambda rng, n: rng.normal(0, 1, n))),
    "t(2) errors": (REGRESSION, regression(lambda rng, n: rng.standard_t(2, n))),
    "2 classes": (CLASSIFICATION, classification(2)),
    "3 classes": (CLASSIFICATION, classification(3)),
}
SKEWED = {
    "laplace vs gaussian, equal mse": (("rmse",), laplace_vs_gaussian("rmse")),
    "laplace vs gaussian, equal mae": (("mae",), laplace_vs_gaussian("mae")),
}


# --- the old gate (a git revision's trainflow/registry/gate.py), for the before/after table
# ---------------------------------


def old_gate(revision: str) -> ModuleType:
    """trainflow/registry/gate.py as it was at `revision`, imported as a module of its own; the metrics it computed one
    bootstrap resample at a time with sklearn (f1_macro, roc_auc, pr_auc, ece) computed for all resamples at once,
    the same values, so the table takes minutes."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{revision}:trainflow/registry/gate.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp(prefix="trainflow-old-gate-")) / "old_gate.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_gate", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_gate"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    original = module.resampled

    def resampled(metric: str, scored: Scored, idx: np.ndarray) -> np.ndarray:
        if module.per_row(metric, scored) is not None or metric == "r2":
            return original(metric, scored, idx)
        labels, proba = scored.labels[idx], scored.outputs[idx]
        if metric in ("f1_macro", "ece"):
            return gate.batched(metric, labels, proba)
        return ranked(metric, labels, proba)

    module.resampled = resampled
    return module


def ranked(metric: str, labels: np.ndarray, proba: np.ndarray) -> np.ndarray:
    """metrics.ranked_metrics of each resample (labels [p, n], proba [p, n, k]), sorting each resample's scores."""
    from scipy.stats import rankdata

    k = proba.shape[2]
    values = []
    for c in [1] if k == 2 else range(k):
        hit, score = labels == c, proba[:, :, c].astype(np.float64)
        positives = hit.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            if metric == "roc_auc":
                negatives = hit.shape[1] - positives
                u = np.sum(np.where(hit, rankdata(score, axis=1), 0.0), axis=1) - positives * (positives + 1) / 2
                values.append(np.where((positives > 0) & (negatives > 0), u / (positives * negatives), np.nan))
                continue
            order = np.argsort(-score, axis=1, kind="stable")
            s, y = np.take_along_axis(score, order, axis=1), np.take_along_axis(hit, order, axis=1)
            n = s.shape[1]
            tp = np.cumsum(y, axis=1)
            last = np.concatenate([s[:, 1:] != s[:, :-1], np.ones((len(s), 1), dtype=bool)], axis=1)
            end = np.minimum.accumulate(np.where(last, np.arange(n), n)[:, ::-1], axis=1)[:, ::-1]
            precision = np.take_along_axis(tp, end, axis=1) / (end + 1)
            values.append(np.where(positives > 0, np.sum(np.where(y, precision, 0.0), axis=1) / positives, np.nan))
    v = np.stack(values)
    finite = np.isfinite(v)
    with np.errstate(invalid="ignore", divide="ignore"):  # no class scored: NaN, as evaluate's
        return np.where(finite, v, 0.0).sum(axis=0) / finite.sum(axis=0)


# --- the table -------------------------------------------------------------------------------------------------------


def rates(module: ModuleType, cell: str, metric: str, draw: Callable[..., tuple[Pair, Pair]], n: int, sims: int,
          permutations: int) -> dict[str, float]:  # fmt: skip
    """The promote rate on null pairs, the test's own rejection rate (rows aside) and the promote rate on improved
    pairs, over `sims` simulations seeded by the cell (generator, metric, n): each cell draws its own stream, so no
    two cells share their luck."""
    rng = np.random.default_rng([n, *map(ord, f"{cell}/{metric}")])
    swaps = metric not in gate.MEANS
    extra: dict[str, Any] = {"resamples": permutations} if swaps else {}
    promoted = rejected = powered = 0
    for sim in range(sims):
        null, improved = draw(rng, n)
        c = module.compare(metric, *null, confidence=1 - LEVEL, seed=sim, **extra)
        promoted += module.decide(c, "better", 0.0)[0]
        rejected += c.low > 0 and (c.mcnemar is None or c.mcnemar["p_better"] < LEVEL)
        powered += module.decide(module.compare(metric, *improved, confidence=1 - LEVEL, seed=sim, **extra), "better",
                                 0.0)[0]  # fmt: skip
    return {"null": promoted / sims, "test": rejected / sims, "power": powered / sims}


def table(module: ModuleType, generators: dict[str, Any], sims: int, sizes: tuple[int, ...], permutations: int,
          title: str) -> dict[str, float]:  # fmt: skip
    """One row per (generator, metric), one cell per n; then how many cells are above the bound, against how many a
    test of exactly the level puts there by chance (each cell is above it with the binomial's tail probability).
    Returns that summary (for --record): cells, above, pooled, bound."""
    from scipy.stats import binom

    bound = LEVEL + 2 * math.sqrt(LEVEL * (1 - LEVEL) / sims)
    print(f"\n{title}: {sims} simulations per cell; a null rate above {bound:.1%} (5% + 2 MC standard errors) is "
          "marked !\n")  # fmt: skip
    print("| generator | metric | " + " | ".join(f"n={n}: null / test / power" for n in sizes) + " |")
    print("|---|---|" + "---:|" * len(sizes))
    tests: list[float] = []
    for name, (metrics, draw) in generators.items():
        for metric in metrics:
            started = time.monotonic()
            cells = []
            for n in sizes:
                r = rates(module, name, metric, draw, n, sims, permutations)
                tests.append(r["test"])
                mark = " !" if r["null"] > bound else ""
                cells.append(f"{r['null']:.1%}{mark} / {r['test']:.1%} / {r['power']:.0%}")
            print(f"| {name} | {metric} | " + " | ".join(cells) + f" |  <!-- {time.monotonic() - started:.0f} s -->",
                  flush=True)  # fmt: skip
    if tests:
        above = sum(t > bound for t in tests)
        chance = binom.sf(math.floor(bound * sims), sims, LEVEL)  # P(a cell of an exact 5% test is above the bound)
        error = math.sqrt(LEVEL * (1 - LEVEL) / sims / len(tests))
        print(f"\nThe test (rows aside) above {bound:.1%} in {above} of {len(tests)} cells; a test of exactly 5% is "
              f"there in {chance:.1%} of cells ({chance * len(tests):.1f} expected). Pooled over all cells: "
              f"{np.mean(tests):.2%} (standard error {error:.2%}).")  # fmt: skip
    pooled = float(np.mean(tests)) if tests else 0.0
    return {"cells": len(tests), "above": sum(t > bound for t in tests), "pooled": pooled, "bound": bound}


# --- pairs of real models --------------------------------------------------------------------------------------------


def real_models(pairs: int) -> dict[str, list[int]]:
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from support.projects import make_project  # a project holding this checkout's committed pipeline

    from trainflow.artifacts.predict import ExportedModel
    from trainflow.core.paths import Paths
    from trainflow.params import load_params, write_overrides
    from trainflow.stages import run_stage
    from trainflow.stages.register import scored

    def trained(paths: Paths, overrides: list[str]) -> tuple[float, Scored]:
        """Train with `overrides` (the split as it is) and score the exported model on the test split, as register
        does."""
        shutil.rmtree(paths.checkpoints, ignore_errors=True)
        write_overrides(paths.params, overrides)
        params = load_params(paths.params)
        run_stage("train", params, paths)
        metrics, rows = scored(ExportedModel.load(paths.final), paths, params.evaluate.batch_size, params.data)
        return float(metrics["accuracy"]), rows

    torch.set_num_threads(1)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="trainflow-gate-") as tmp:
        root = make_project(Path(tmp) / "proj", {"train.progress": "false"})
        paths = Paths(root)
        for stage in ("ingest", "split"):
            run_stage(stage, load_params(paths.params), paths)
        full = [trained(paths, [f"seed={s}", "train.epochs=40"]) for s in range(pairs + 1)]
        short = [trained(paths, [f"seed={s}", "train.epochs=2"]) for s in range(pairs)]
        seed = 42  # the gate's seed (params.yaml's seed)
        counts = {"no real effect": [0, 0], "truly better": [0, 0]}
        for kind, chosen in (
            ("no real effect", [(full[i + 1], full[i]) for i in range(pairs)]),
            ("truly better", [(full[i], short[i]) for i in range(pairs)]),
        ):
            for i, ((new_acc, new), (old_acc, old)) in enumerate(chosen):
                c = gate.compare("accuracy", new, old, confidence=0.95, seed=seed)
                paired, _ = gate.decide(c, "better", 0.0)
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
    print(f"builtin:digits, {rows} test rows, {pairs} pairs each, {time.monotonic() - started:.0f} s")
    print()
    print("| pairs | paired gate promotes | point gate promotes |")
    print("|---|---:|---:|")
    for kind, (paired_n, point_n) in counts.items():
        print(f"| {kind} | {paired_n} of {pairs} | {point_n} of {pairs} |")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sims", type=int, default=300, help="simulated pairs per cell")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="test rows, comma-separated")
    parser.add_argument("--permutations", type=int, default=199, help="random swaps (f1_macro, roc_auc, pr_auc, ece)")
    parser.add_argument("--metrics", help="only these metrics, comma-separated")
    parser.add_argument("--old", metavar="REVISION", help="decide with trainflow/registry/gate.py of this git revision")
    parser.add_argument("--real-models", action="store_true", help="pairs of trained digits models instead")
    parser.add_argument("--pairs", type=int, default=20, help="--real-models: pairs of each kind")
    parser.add_argument("--record", action="store_true", help="write the headline to bench/results/ (bench/record.py)")
    args = parser.parse_args()
    if args.record and args.old:
        parser.error("--record records this checkout's gate, not --old's")
    if args.real_models:
        counts = real_models(args.pairs)
        if args.record:
            from record import command_line, record

            (no_effect, point_no_effect), (better, _) = counts["no real effect"], counts["truly better"]
            record(
                "gate-real-pairs",
                what="The champion gate on real pairs of models",
                command=command_line(),
                headline=f"promoted: no effect {no_effect} of {args.pairs}, truly better {better} of {args.pairs} "
                f"(point gate: {point_no_effect} of {args.pairs})",
                target="—",
                met="—",
            )
        return
    sizes = tuple(int(s) for s in args.sizes.split(","))
    only = set(args.metrics.split(",")) if args.metrics else None

    def chosen(generators: dict[str, Any]) -> dict[str, Any]:
        return {k: (tuple(m for m in ms if only is None or m in only), d) for k, (ms, d) in generators.items()}

    module: ModuleType = gate if args.old is None else old_gate(args.old)
    which = "this checkout's gate" if args.old is None else f"the gate of {args.old}"
    started = time.monotonic()
    null = table(module, chosen(GENERATORS), args.sims, sizes, args.permutations, f"Exchangeable (null) pairs, {which}")
    skewed = table(module, chosen(SKEWED), args.sims, sizes, args.permutations,
                   f"Not exchangeable: equal expected loss, differently shaped errors, {which}")  # fmt: skip
    print(f"\n{time.monotonic() - started:.0f} s in all")
    if args.record:
        from record import command_line, record

        held = {"exchangeable nulls": null["pooled"] <= LEVEL, "Laplace vs Gaussian": skewed["pooled"] <= LEVEL}
        yes, no = [k for k, v in held.items() if v], [k for k, v in held.items() if not v]
        met = "yes" if not no else "no" if not yes else f"partly: held on {', '.join(yes)}, not on {', '.join(no)}"
        record(
            "gate-level",
            what="The paired gate's level on null pairs",
            command=command_line(),
            headline=f"pooled over {null['cells']} cells {null['pooled']:.2%}; {null['above']} of {null['cells']} "
            f"cells marked (Laplace vs Gaussian: {skewed['pooled']:.2%}, {skewed['above']} of {skewed['cells']})",
            target=f"level {LEVEL:.0%} (a cell marked above {null['bound']:.1%})",
            met=met,
        )


if __name__ == "__main__":
    main()
