"""Reading a table from disk for training: trainflow's RowFile beside Hugging Face `datasets`, LitData and MosaicML
Streaming, on the same rows, in one process (issue 26, "choose the library on purpose").

A table of --rows rows x 70 float32 features and an int64 label (the shape bench/streamed_train_rate.py trains on) is
written once in each library's own format, then read in a shuffled order as batches of 1,024 rows, the way each is
meant to be used for training:

    trainflow   x.npy + y.npy (what the train stage writes); MemmapData.batch of each window of the engine's
                epoch order (a permutation of every row by (seed, epoch)), the next batch read in a background thread.
    datasets    Dataset.save_to_disk (Arrow, memory-mapped when loaded); `ds[idx]` (numpy format) of the same
                windows of the same permutation (datasets' own `shuffle` is an index mapping too).
    litdata     litdata.optimize into chunks of 64 MiB; StreamingDataset(shuffle=True, seed) through its
                StreamingDataLoader (batch 1024, no workers): its own order, chunks shuffled, rows within them.
    mosaic      MDSWriter shards of 64 MiB; StreamingDataset(shuffle=True, shuffle_seed, batch_size=1024) through a
                torch DataLoader (no workers): its own order (py1e shuffle over shards).

Each reads --batches batches after one warm-up batch; the median of --repeats runs is printed as rows/s, with the
ratio to trainflow's. The write time of each format is printed too. Run it in a venv that has the three peers (they
are not trainflow's dependencies), e.g. one that imports .venv's packages through a .pth file:

    python bench/peers_streaming.py [--rows 500000] [--batches 200] [--repeats 3] [--workdir DIR]

The table goes to stdout and the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainflow.engine.loaders import MemmapData, epoch_order  # noqa: E402

FEATURES, BATCH = 70, 1024
CHUNK = "64MB"


def table(rows: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((rows, FEATURES), dtype=np.float32), rng.integers(0, 2, rows)


def timed(batches: Iterator[tuple[Any, Any]], count: int) -> float:
    """Rows per second over `count` batches, after one warm-up batch; every batch is touched (summed)."""
    next(batches)
    started, rows = time.perf_counter(), 0
    for _ in range(count):
        x, y = next(batches)
        float(np.asarray(x).sum())  # the rows are really there
        rows += len(y)
    elapsed = time.perf_counter() - started
    batches.close()  # ends the reader's iteration (its threads) before the next run  # type: ignore[attr-defined]
    return rows / elapsed


def ours(work: Path, x: np.ndarray, y: np.ndarray) -> tuple[float, Callable[[], Iterator[tuple[Any, Any]]]]:
    t0 = time.perf_counter()
    np.save(work / "x.npy", x)
    np.save(work / "y.npy", y)
    written = time.perf_counter() - t0

    def batches() -> Iterator[tuple[Any, Any]]:
        data = MemmapData(np.load(work / "x.npy", mmap_mode="r"), np.load(work / "y.npy", mmap_mode="r"))
        order = data.epoch_order(0, 0)
        for k in range(len(order) // BATCH):
            b = data.batch(order[k * BATCH : (k + 1) * BATCH])
            yield b.inputs["x"], b.target

    return written, batches


def hf(work: Path, x: np.ndarray, y: np.ndarray) -> tuple[float, Callable[[], Iterator[tuple[Any, Any]]]]:
    import datasets

    datasets.disable_progress_bars()
    t0 = time.perf_counter()
    # a fixed-size list of float32 (Arrow's fixed_size_list): numpy format gives [n, FEATURES] arrays
    features = datasets.Features({"x": datasets.Sequence(datasets.Value("float32"), length=FEATURES),
                                  "y": datasets.Value("int64")})  # fmt: skip
    ds = datasets.Dataset.from_dict({"x": x, "y": y}, features=features)
    ds.save_to_disk(str(work / "hf"))
    written = time.perf_counter() - t0
    del ds

    def batches() -> Iterator[tuple[Any, Any]]:
        ds = datasets.load_from_disk(str(work / "hf")).with_format("numpy")
        order = epoch_order(len(ds), 0, 0).numpy()
        for k in range(len(order) // BATCH):
            rows = ds[order[k * BATCH : (k + 1) * BATCH]]
            yield rows["x"], rows["y"]

    return written, batches


def lit_samples(part: tuple[str, int, int]) -> Iterator[dict[str, Any]]:
    """litdata.optimize's fn (a module-level function: its worker process imports it): rows start..stop of the
    table it reads from the .npy files."""
    work, start, stop = part
    x, y = np.load(Path(work) / "x.npy", mmap_mode="r"), np.load(Path(work) / "y.npy", mmap_mode="r")
    for i in range(start, stop):
        yield {"x": np.array(x[i]), "y": int(y[i])}


def lit(work: Path, x: np.ndarray, y: np.ndarray) -> tuple[float, Callable[[], Iterator[tuple[Any, Any]]]]:
    import litdata

    np.save(work / "x.npy", x)  # what lit_samples reads (trainflow's files are the same)
    np.save(work / "y.npy", y)
    parts = [(str(work), lo, min(lo + 50_000, len(y))) for lo in range(0, len(y), 50_000)]
    t0 = time.perf_counter()
    litdata.optimize(fn=lit_samples, inputs=parts, output_dir=str(work / "lit"), chunk_bytes=CHUNK, num_workers=1,
                     mode="overwrite")  # fmt: skip
    written = time.perf_counter() - t0

    def batches() -> Iterator[tuple[Any, Any]]:
        ds = litdata.StreamingDataset(str(work / "lit"), shuffle=True, seed=0)
        for b in litdata.StreamingDataLoader(ds, batch_size=BATCH, num_workers=0):
            yield b["x"], b["y"]

    return written, batches


def mosaic(work: Path, x: np.ndarray, y: np.ndarray) -> tuple[float, Callable[[], Iterator[tuple[Any, Any]]]]:
    from streaming import MDSWriter, StreamingDataset

    t0 = time.perf_counter()
    with MDSWriter(out=str(work / "mds"), columns={"x": f"ndarray:float32:{FEATURES}", "y": "int64"},
                   size_limit=CHUNK) as writer:  # fmt: skip
        for i in range(len(y)):
            writer.write({"x": x[i], "y": y[i]})
    written = time.perf_counter() - t0

    def batches() -> Iterator[tuple[Any, Any]]:
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        ds = StreamingDataset(local=str(work / "mds"), shuffle=True, shuffle_seed=0, batch_size=BATCH)
        for b in torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=0):
            yield b["x"], b["y"]

    return written, batches


READERS = {"trainflow": ours, "datasets": hf, "litdata": lit, "mosaic": mosaic}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", default="/tmp/trainflow-peers")
    ap.add_argument("--only", nargs="*", default=list(READERS))
    args = ap.parse_args(argv)
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    x, y = table(args.rows)
    versions: dict[str, str] = {}
    for name, module in (("datasets", "datasets"), ("litdata", "litdata"), ("mosaic", "streaming")):
        try:
            versions[name] = __import__(module).__version__
        except ImportError:
            versions[name] = "not installed"
    res: dict[str, dict[str, Any]] = {}
    for name in args.only:
        if versions.get(name) == "not installed":
            continue
        print(f"[{name}] writing", file=sys.stderr, flush=True)
        written, batches = READERS[name](work, x, y)
        rates = []
        for _ in range(args.repeats):
            rates.append(timed(batches(), args.batches))
            print(f"[{name}] {rates[-1]:,.0f} rows/s", file=sys.stderr, flush=True)
        res[name] = {"write_s": written, "rows_per_s": statistics.median(rates), "runs": rates}
    base = res.get("trainflow", {}).get("rows_per_s")
    print(f"{args.rows:,} rows x {FEATURES} float32 + an int64 label, batches of {BATCH}, {args.batches} batches "
          f"timed, median of {args.repeats}; torch {torch.__version__}, "
          + ", ".join(f"{k} {v}" for k, v in versions.items()))  # fmt: skip
    print()
    print("| reader | write (s) | rows/s (median) | vs trainflow |")
    print("|---|---:|---:|---:|")
    for name, r in res.items():
        ratio = f"{r['rows_per_s'] / base:.2f}x" if base else ""
        print(f"| {name} | {r['write_s']:.1f} | {r['rows_per_s']:,.0f} | {ratio} |")
    print(json.dumps({"rows": args.rows, "versions": versions, "results": res}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
