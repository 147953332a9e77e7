"""models/final/model.onnx against the torch model (issue 29, item 1): for each model family, train it briefly
through ingest -> split -> train, then score the test split with `trainflow predict`'s code twice, with torch and
with ONNX Runtime (`ExportedModel.on_onnx`), after the same preprocessing, in batches of 1024:

    mlp               the default pipeline (builtin:digits, 64 pixel features, 10 classes)
    text_transformer  5,000 generated SMS-like messages (bench/text_defaults.py's sms set), padded batches
    text_bag          the same messages, token pairs on (model.kwargs buckets: 4096)
    cnn               1,200 generated 16x16 RGB images of coloured squares, 3 classes
    hf-bert           a tiny random BERT (2 layers, width 32) written here, on 2,000 generated reviews

It prints the largest |ONNX Runtime - torch| over the test split's outputs (class probabilities) with the target
(<= 1e-5), whether the predicted classes agree, and each runtime's rows/s (median of 5 passes of `trainflow
predict`'s scoring from the raw rows: a table's graph preprocesses them itself, torch after trainflow's preprocessing;
text is tokenised and images decoded the same way for both).

    .venv/bin/python bench/export_parity.py [--workdir /tmp/trainflow-onnx] [--cases mlp cnn ...]

The table goes to stdout and the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # tiny_bert: the tests' tiny random BERT, written without a download
from data_throughput import make_project  # noqa: E402
from text_defaults import sms  # noqa: E402

REPEATS = 5
TEXT = ["data.text_column=text", "features.max_length=48"]
CASES: dict[str, list[str]] = {
    "mlp": [],
    "text_transformer": [*TEXT, "model.name=text_transformer", "model.d_model=64", "model.n_layers=2"],
    "text_bag": [*TEXT, "model.name=text_bag", 'model.kwargs={"buckets": 4096}'],
    "cnn": ["model.name=cnn", "model.cnn_channels=[16, 32]"],
    "hf-bert": ["data.text_column=text", "features.max_length=32", "model.name=hf:pretrained/tiny-bert"],
}


def data(case: str, work: Path) -> Path | None:
    """The case's generated source (None: the default builtin:digits)."""
    import pandas as pd

    if case == "mlp":
        return None
    if case == "cnn":
        from PIL import Image
        from support.images import COLOURS

        folder = work / "squares"
        if not folder.is_dir():
            rng = np.random.default_rng(0)
            for name, colour in COLOURS.items():
                (folder / name).mkdir(parents=True)
                for i in range(400):
                    x = rng.integers(0, 80, (16, 16, 3))
                    top, left, size = rng.integers(0, 10), rng.integers(0, 10), rng.integers(4, 7)
                    x[top : top + size, left : left + size] = colour
                    Image.fromarray(x.astype(np.uint8)).save(folder / name / f"{i:03d}.png")
        return folder
    csv = work / f"{case}.csv"
    if case == "hf-bert":
        from support.reviews import reviews

        reviews(2000).to_csv(csv, index=False)
    else:
        texts, labels = sms(np.random.default_rng(0), 5000)
        pd.DataFrame({"text": texts, "label": labels}).to_csv(csv, index=False)
    return csv


def run_case(case: str, work: Path) -> dict[str, Any]:
    import pandas as pd

    from trainflow.artifacts.predict import ExportedModel
    from trainflow.core.paths import Paths
    from trainflow.params import load_params, write_overrides
    from trainflow.stages import run_stage

    root = work / case
    source = data(case, work)
    settings = ["train.epochs=3", "train.progress=false", f"register.model_name={case}"]
    if source is not None and source.is_file():
        make_project(root, source)  # the repo's pipeline on data/raw/<the csv>, target `label`
    else:  # the default builtin:digits, or a folder of class folders
        placeholder = work / "unused.csv"
        placeholder.write_text("label\n")
        make_project(root, placeholder)
        (root / "data/raw/unused.csv").unlink()
        settings += ["data.source=builtin:digits", "data.target=target"]
        if source is not None:
            shutil.copytree(source, root / "data/raw" / source.name)
            settings[-2:] = [f"data.source=data/raw/{source.name}"]
    if case == "hf-bert":
        from support.reviews import FILLER, NEGATIVE, POSITIVE
        from support.tiny_models import tiny_bert

        tiny_bert(root / "pretrained/tiny-bert", [*POSITIVE, *NEGATIVE, *FILLER, "."])
    (root / "trainflow").symlink_to(HERE.parent / "trainflow")  # model.code's source
    write_overrides(root / "params.yaml", [*settings, *CASES[case]])
    paths = Paths(root)
    t0 = time.perf_counter()
    for stage in ("ingest", "split", "train"):
        run_stage(stage, load_params(paths.params), paths)
    train_s = time.perf_counter() - t0
    test = pd.read_parquet(paths.split_file("test"))
    torch_model = ExportedModel.load(paths.final)
    onnx_model = torch_model.on_onnx()
    expected = torch_model.outputs(test, base=root)
    got = onnx_model.outputs(test, base=root)
    # Throughput: `trainflow predict`'s scoring of the test split, each runtime from the raw rows: torch after
    # trainflow's preprocessing; ONNX Runtime with the tables' preprocessing and the images' normalising in its graph
    # (text: both after the same tokenising; images: both after the same decoding).

    def rows_per_s(model: Any) -> float:
        times = []
        for _ in range(REPEATS):
            t = time.perf_counter()
            model.outputs(test, base=root)
            times.append(time.perf_counter() - t)
        return len(test) / statistics.median(times)

    torch_rate, onnx_rate = rows_per_s(torch_model), rows_per_s(onnx_model)
    return {
        "rows": len(test), "max_abs_diff": float(np.max(np.abs(got - expected))),
        "same_classes": bool(np.array_equal(got.argmax(axis=1), expected.argmax(axis=1))),
        "torch_rows_per_s": torch_rate, "onnx_rows_per_s": onnx_rate, "train_s": train_s,
        "onnx_bytes": (paths.final / "model.onnx").stat().st_size,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workdir", default="/tmp/trainflow-onnx")
    ap.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    args = ap.parse_args(argv)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
    import torch

    results = {}
    for case in args.cases:
        results[case] = run_case(case, work)
        print(f"  {case}: {json.dumps(results[case])}", file=sys.stderr, flush=True)
    print(f"torch {torch.__version__}, onnxruntime {__import__('onnxruntime').__version__}, {os.cpu_count()} CPUs, "
          f"batches of 1024, test split, throughput median of {REPEATS} passes")  # fmt: skip
    print(f"{'model':<18}{'rows':>6}{'max |ORT-torch|':>17}{'classes':>9}{'torch rows/s':>14}{'ORT rows/s':>12}"
          f"{'ORT/torch':>11}{'graph KiB':>11}")  # fmt: skip
    for case, r in results.items():
        print(f"{case:<18}{r['rows']:>6}{r['max_abs_diff']:>17.1e}{'same' if r['same_classes'] else 'DIFFER':>9}"
              f"{r['torch_rows_per_s']:>14,.0f}{r['onnx_rows_per_s']:>12,.0f}"
              f"{r['onnx_rows_per_s'] / r['torch_rows_per_s']:>11.2f}{r['onnx_bytes'] / 1024:>11.0f}")  # fmt: skip
    ok = all(r["max_abs_diff"] <= 1e-5 and r["same_classes"] for r in results.values())
    print(json.dumps({"ok": ok, "torch": torch.__version__, "cases": results}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
