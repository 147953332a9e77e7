"""Data larger than memory, images (issue 26): a generated folder of class folders bigger than data.memory_budget_mb
runs ingest -> split -> train -> evaluate streamed, beside the same folder held in memory, with each stage's peak
RSS, wall time and the test accuracy of both.

The images are --size x --size RGB PNGs of noise around a brightness and a tint that depend on the class (4 classes,
so the accuracy says whether anything was learnt); noise does not compress, so the folder is about 3 x size^2 bytes
an image. Generated once under --workdir. Each stage runs in a fresh subprocess (bench/out_of_core.py's `--step`),
so its peak RSS (ru_maxrss) and peak RssAnon are its own:

    streamed  data.memory_budget_mb --budget: ingest spills the images in chunks, the split and the typed table are
              written a block of images at a time, train reads one file of the encoded images by offset and decodes
              each batch in the background, evaluate scores a block at a time.
    memory    data.memory_budget_mb null (a quarter of this machine's memory): every stage holds the images.

Both train a cnn of channels [16, 32] for --epochs epochs (batch 128): their weights, and so their accuracy, are
the same bit for bit (the tests check that on small folders; the last lines here compare the two model files).

    .venv/bin/python bench/out_of_core_images.py [--images 120000] [--size 32] [--budget 64] [--workdir DIR]

The table goes to stdout and the last line is one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from out_of_core import run  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STAGES = ("ingest", "split", "train", "evaluate")
PROJECT_FILES = ("dvc.yaml", "params.yaml", ".dvcignore", ".gitignore")


def generate(folder: Path, count: int, size: int) -> None:
    import numpy as np
    from PIL import Image

    from trainflow.core.progress import progress

    rng = np.random.default_rng(0)
    tints = np.array([[40, 0, 0], [0, 40, 0], [0, 0, 40], [20, 20, 0]])
    bar = progress(count, desc="generating images", unit="image")
    for i in range(count):
        label = i % 4
        base = 90 + 25 * label + tints[label]
        pixels = np.clip(rng.normal(base, 60, (size, size, 3)), 0, 255).astype(np.uint8)
        (folder / f"class{label}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(folder / f"class{label}" / f"{i:07d}.png")
        bar.update(1)
    bar.close()


def project(workdir: Path, name: str, folder: Path, budget: str, epochs: int) -> Path:
    from trainflow.params import write_overrides

    root = workdir / name
    shutil.rmtree(root, ignore_errors=True)
    (root / "data").mkdir(parents=True)
    for rel in PROJECT_FILES:
        if (REPO / rel).is_file():
            shutil.copy2(REPO / rel, root / rel)
    (root / "data/raw").symlink_to(folder.parent)  # the same files for both projects, no copy
    (root / "trainflow").symlink_to(REPO / "trainflow")  # model.code: the built-in models' source
    write_overrides(root / "params.yaml", [
        f"data.source=data/raw/{folder.name}", f"data.memory_budget_mb={budget}", "model.name=cnn",
        "model.cnn_channels=[16,32]",
        f"train.epochs={epochs}", "train.batch_size=128", "train.progress=false", "register.model_name=images",
    ])  # fmt: skip
    return root


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default="/tmp/trainflow-ooc-images")
    ap.add_argument("--images", type=int, default=120_000)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--budget", default="64", help="data.memory_budget_mb of the streamed project (MiB)")
    ap.add_argument("--epochs", type=int, default=1)
    args = ap.parse_args(argv)
    workdir = Path(args.workdir)
    folder = workdir / "raw" / f"images_{args.images}_{args.size}"
    if not folder.is_dir():
        generate(folder, args.images, args.size)
    size = sum(p.stat().st_size for p in folder.rglob("*.png"))
    load = os.getloadavg()[0]
    res: dict[str, dict[str, Any]] = {}
    roots = {}
    for name, budget in (("streamed", args.budget), ("memory", "null")):
        roots[name] = project(workdir, name, folder, budget, args.epochs)
        for stage in STAGES:
            res[f"{name} {stage}"] = run(stage, args, project=str(roots[name]))
            if "error" in res[f"{name} {stage}"]:
                break

    def ok(step: str) -> bool:
        return step in res and "error" not in res[step]

    print(f"{args.images:,} images of {args.size}x{args.size} RGB in 4 class folders, {size / 2**20:,.0f} MiB of PNG; "
          f"streamed with data.memory_budget_mb {args.budget}; {os.cpu_count()} CPUs, 1-min load average {load:.2f} "
          "at the start")  # fmt: skip
    print()
    print("| stage | streamed s | streamed peak RSS (GiB) | streamed peak RssAnon (GiB) | in memory s | "
          "in memory peak RSS (GiB) | in memory peak RssAnon (GiB) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for stage in STAGES:
        cells = []
        for name in ("streamed", "memory"):
            r = res.get(f"{name} {stage}", {})
            cells += [f"{r['seconds']:.0f}", f"{r['peak_rss'] / 2**30:.2f}", f"{r['peak_anon'] / 2**30:.2f}"] if ok(
                f"{name} {stage}") else ["ERROR " + r.get("error", "not run")[:80], "", ""]  # fmt: skip
        print(f"| {stage} | {' | '.join(cells)} |")
    figures: dict[str, Any] = {"images": args.images, "size": args.size, "folder_bytes": size,
                               "budget_mb": args.budget, "load_start": load}  # fmt: skip
    for name, root in roots.items():
        metrics = root / "reports/metrics.json"
        if metrics.is_file():
            figures[f"{name}_metrics"] = json.loads(metrics.read_text())
        model = root / "models/final/model.safetensors"
        if model.is_file():
            figures[f"{name}_model_sha256"] = hashlib.sha256(model.read_bytes()).hexdigest()
    if "streamed_metrics" in figures and "memory_metrics" in figures:
        same = figures.get("streamed_model_sha256") == figures.get("memory_model_sha256")
        print(f"\ntest accuracy: streamed {figures['streamed_metrics']['accuracy']:.5f}, in memory "
              f"{figures['memory_metrics']['accuracy']:.5f} ({figures['memory_metrics']['n_test']:,} test images); "
              f"model.safetensors {'identical' if same else 'DIFFERENT'}")  # fmt: skip
    if ok("streamed train") and ok("memory train"):
        s, m = res["streamed train"].get("samples_per_s"), res["memory train"].get("samples_per_s")
        if s and m:
            figures["train_ratio"] = s / m
            print(f"training samples/s: streamed {s:,.0f}, in memory {m:,.0f} = {s / m:.2f}x")
    print(json.dumps({**figures, "steps": res}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
