"""Small tables: trainflow's default training budget against scikit-learn baselines on the same split.

For each table (scikit-learn's bundled diabetes, iris, wine and breast_cancer, and `crashes`, 37 rows drawn from
diabetes with a fixed seed: a stand-in for seaborn's car_crashes, nothing is downloaded) this builds a temp project
from this repo's params.yaml and dvc.yaml, runs ingest and split once per seed (split.seed and seed both set to it),
then train and evaluate once per setting, from scratch, in-process (MLflow to a temp SQLite store). It reports the
test metric (r2 or accuracy, from reports/metrics.json), the updates and epochs trained, and the seconds train took,
beside ridge / logistic regression and HistGradientBoosting fitted here on the same train split's feature matrix
(the exported model's own preprocessing) and scored on the same test rows.

    .venv/bin/python bench/small_tables.py [--tables crashes diabetes] [--seeds 0 1 2]
        [--setting before train.epochs=40] [--setting after]   # a label, then its -S overrides (none: params.yaml)

The table goes to stdout, the last line is one JSON object; trainflow's messages go to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
PROJECT_FILES = ("params.yaml", "dvc.yaml", ".dvcignore", ".dvc/config")
TABLES = {
    "crashes": "data/raw/crashes.csv",
    "diabetes37": "data/raw/diabetes37.csv",
    "diabetes": "builtin:diabetes",
    "iris": "builtin:iris",
    "wine": "builtin:wine",
    "breast_cancer": "builtin:breast_cancer",
    "digits": "builtin:digits",  # the default pipeline's: 20 updates an epoch
}
SMALL_ROWS = 37


def crashes(n: int = SMALL_ROWS, seed: int = 0) -> pd.DataFrame:
    """A table shaped like seaborn's car_crashes (drivers in fatal collisions per billion miles, by state): `target`
    (the total) is nearly a sum of its parts, as there, so a linear model explains almost all of it."""
    rng = np.random.default_rng(seed)
    total = rng.normal(15.8, 4.1, n).clip(5, 25)
    frame = pd.DataFrame({
        "speeding": 0.31 * total + rng.normal(0, 1.2, n), "alcohol": 0.31 * total + rng.normal(0, 0.9, n),
        "not_distracted": 0.86 * total + rng.normal(0, 0.9, n), "no_previous": 0.87 * total + rng.normal(0, 0.6, n),
        "ins_premium": rng.normal(887, 178, n) - 8 * (total - 15.8), "ins_losses": rng.normal(134, 24, n),
    })  # fmt: skip
    frame["target"] = total
    return frame.round(3)


def project(dest: Path, table: str, seed: int) -> Path:
    for rel in PROJECT_FILES:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest / rel)
    # model.code (trainflow/models) is hashed into the resume fingerprint: the project holds it, as a clone does
    shutil.copytree(REPO / "trainflow" / "models", dest / "trainflow" / "models",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    (dest / "data" / "raw").mkdir(parents=True, exist_ok=True)
    if table == "crashes":
        crashes().to_csv(dest / TABLES[table], index=False)
    if table == "diabetes37":
        from sklearn.datasets import load_diabetes

        frame = load_diabetes(as_frame=True).frame
        frame.sample(n=SMALL_ROWS, random_state=0).to_csv(dest / TABLES[table], index=False)
    from trainflow.params import write_overrides

    write_overrides(dest / "params.yaml", [f"data.source={TABLES[table]}", f"seed={seed}", f"split.seed={seed}",
                                           "train.progress=false"])  # fmt: skip
    return dest


def run_stage(root: Path, name: str) -> dict[str, Any]:
    from trainflow.core.paths import Paths
    from trainflow.params import load_params
    from trainflow.stages import run_stage as run

    paths = Paths(root)
    with contextlib.redirect_stdout(sys.stderr):
        return dict(run(name, load_params(paths.params), paths) or {})


def baselines(root: Path) -> dict[str, float]:
    """Ridge / logistic regression and HistGradientBoosting on the model's own feature matrix of the train split,
    scored on the test split: r2 or accuracy."""
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.metrics import accuracy_score, r2_score

    from trainflow.core.paths import Paths
    from trainflow.data.preprocess import Preprocessor

    paths = Paths(root)
    pre = Preprocessor.load(paths.final)
    train, test = (paths.split(s).read() for s in ("train", "test"))
    x, y = pre.features(train), pre.labels(train)
    xt, yt = pre.features(test), pre.labels(test)
    if pre.task == "regression":
        fits = {"linear": Ridge(), "boosting": HistGradientBoostingRegressor(random_state=0)}
        return {k: float(r2_score(yt, m.fit(x, y).predict(xt))) for k, m in fits.items()}
    fits = {"linear": LogisticRegression(max_iter=1000), "boosting": HistGradientBoostingClassifier(random_state=0)}
    return {k: float(accuracy_score(yt, m.fit(x, y).predict(xt))) for k, m in fits.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables", nargs="+", choices=list(TABLES), default=list(TABLES))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--setting", nargs="+", action="append", metavar="LABEL [KEY=VALUE ...]")
    ap.add_argument("--record", action="store_true", help="write the headline to bench/results/ (bench/record.py)")
    args = ap.parse_args(argv)
    settings = {s[0]: s[1:] for s in args.setting or [["params.yaml"]]}
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import torch

    torch.set_num_threads(1)
    from trainflow.core.paths import Paths
    from trainflow.params import write_overrides

    work = Path(tempfile.mkdtemp(prefix="trainflow-small-tables-"))
    rows: list[dict[str, Any]] = []
    cwd = Path.cwd()
    try:
        for table in args.tables:
            for seed in args.seeds:
                root = project(work / f"{table}-{seed}", table, seed)
                os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{root / 'mlflow.db'}"
                os.chdir(root)
                paths = Paths(root)
                for stage in ("ingest", "split"):
                    run_stage(root, stage)
                written = paths.params.read_text()
                base: dict[str, float] | None = None
                for label, overrides in settings.items():
                    paths.params.write_text(written)
                    if overrides:
                        write_overrides(paths.params, overrides)
                    shutil.rmtree(paths.checkpoints, ignore_errors=True)
                    start = time.perf_counter()
                    trained = run_stage(root, "train")
                    seconds = time.perf_counter() - start
                    metrics = json.loads(paths.metrics.read_text()) if run_stage(root, "evaluate") else {}
                    metric = "r2" if "r2" in metrics else "accuracy"
                    base = base or baselines(root)
                    rows.append({"table": table, "seed": seed, "setting": label, "metric": metric,
                                 "value": metrics[metric], "updates": trained["updates"], "epochs": trained["epochs"],
                                 "best_update": trained["best_update"], "stopped_early": trained["stopped_early"],
                                 "train_s": round(seconds, 1), "n_test": metrics["n_test"],
                                 **{f"baseline_{k}": v for k, v in base.items()}})  # fmt: skip
                    print(json.dumps(rows[-1]), file=sys.stderr)
    finally:
        os.chdir(cwd)
        shutil.rmtree(work, ignore_errors=True)
    frame = pd.DataFrame(rows)
    summary = frame.groupby(["table", "setting"], sort=False).agg(
        metric=("metric", "first"), value=("value", "mean"), linear=("baseline_linear", "mean"),
        boosting=("baseline_boosting", "mean"), updates=("updates", "mean"), epochs=("epochs", "mean"),
        train_s=("train_s", "mean"), n_test=("n_test", "first"),
    )  # fmt: skip
    with pd.option_context("display.width", 200, "display.float_format", "{:.3f}".format):
        print(f"mean over seeds {args.seeds}")
        print(summary.to_string())
    print(json.dumps({"rows": rows, "load": os.getloadavg()[0], "threads": 1, "np": np.__version__}))
    if args.record:
        from record import command_line, record

        last = list(settings)[-1]  # the setting a comparison ends with: the current default (`after`)
        shown = summary.xs(last, level="setting")
        values = " / ".join(f"{v:.3f}" for v in shown["value"])
        linear = " / ".join(f"{v:.3f}" for v in shown["linear"])
        record(
            "small-tables",
            what="Small tables: the default training budget vs scikit-learn",
            command=command_line(argv),
            headline=f"{' / '.join(dict.fromkeys(shown['metric']))} {last}: {values}; linear baseline {linear} "
            f"({', '.join(shown.index)}; seeds {' '.join(map(str, args.seeds))})",
            target="—",
            met="—",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
