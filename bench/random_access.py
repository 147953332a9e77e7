"""Random access by sample index, the way trainflow's engine reads a table (issue 26: data larger than memory).

The engine's sample order is one permutation of the indices per (seed, epoch), cut into windows and per-rank shards,
so exact accumulation and resume across world sizes need a store that serves any batch of indices. This times, on
the same rows and the same random batches of 256 indices, the stores that could hold a split too big for memory:

- torch in memory: what TensorData does today (the baseline);
- a numpy memmap of the preprocessed float32 matrix (np.save + mmap_mode="r"): every page it touches is mapped into
  the process, so its RSS grows to the file;
- the same .npy file read a row at a time with `pread` (trainflow's `RowFile`, what streamed training reads with);
- memory-mapped Arrow IPC, `Table.take` (what Hugging Face `datasets` keeps underneath);
- Parquet with 64k-row groups through `pyarrow.dataset.take` (a row group is decoded for every index in it);
- Hugging Face `datasets` (`Dataset.with_format("numpy")[idx]`), if it is installed (it is not a dependency).

Each reader's batch is checked against the matrix itself. The files sit in the page cache (written just before), so
this is the best case for every store; a split bigger than memory reads at the disk's random-read speed.

    .venv/bin/python bench/random_access.py [--rows 2000000] [--features 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pds
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import torch

from trainflow.engine.loaders import RowFile

BATCH = 256


def rate(read: Callable[[np.ndarray], np.ndarray], batches: list[np.ndarray], budget_s: float) -> float:
    """Samples per second reading `batches` in order, for at most `budget_s` (slow stores read a prefix)."""
    read(batches[0])  # warm
    start, n = time.perf_counter(), 0
    for idx in batches:
        read(idx)
        n += len(idx)
        if time.perf_counter() - start > budget_s:
            break
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=10.0, help="seconds per reader per repeat, at most")
    a = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.rows, a.features), dtype=np.float32)
    order = torch.randperm(a.rows, generator=torch.Generator().manual_seed(1)).numpy()
    batches = [order[i : i + BATCH] for i in range(0, a.rows, BATCH)]
    folder = Path(tempfile.mkdtemp(prefix="random-access-"))

    readers: dict[str, Callable[[np.ndarray], np.ndarray]] = {}
    xt = torch.from_numpy(x)
    readers["torch in memory (today)"] = lambda i: xt[torch.from_numpy(i)].numpy()
    np.save(folder / "x.npy", x)
    xm = np.load(folder / "x.npy", mmap_mode="r")
    readers["numpy memmap"] = lambda i: xm[i]
    rows = RowFile(np.load(folder / "x.npy", mmap_mode="r"))
    readers["pread per row (trainflow's RowFile)"] = rows.take
    table = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), a.features)})

    def matrix(t: pa.Table) -> np.ndarray:
        return t.column("x").combine_chunks().values.to_numpy().reshape(-1, a.features)

    with pa.OSFile(str(folder / "x.arrow"), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=65536)
    mapped = ipc.open_file(pa.memory_map(str(folder / "x.arrow"))).read_all()
    readers["Arrow IPC mmap, take"] = lambda i: matrix(mapped.take(pa.array(i)))
    pq.write_table(table, folder / "x.parquet", row_group_size=65536)
    parquet = pds.dataset(folder / "x.parquet", format="parquet")
    readers["Parquet (64k row groups), take"] = lambda i: matrix(parquet.take(pa.array(i)))
    try:
        import datasets  # type: ignore[import-not-found]

        datasets.Dataset(table).save_to_disk(str(folder / "hf"))
        hf = datasets.load_from_disk(str(folder / "hf")).with_format("numpy")
        readers[f"HF datasets {datasets.__version__}"] = lambda i: np.asarray(hf[i]["x"])
    except ImportError:
        print("(Hugging Face datasets is not installed: skipped)")

    for name, read in readers.items():
        assert np.array_equal(read(batches[5]), x[batches[5]]), name
    runs: dict[str, list[float]] = {name: [] for name in readers}
    for _ in range(a.repeats):  # interleaved, so a slow spell of the machine hits every reader alike
        for name, read in readers.items():
            runs[name].append(rate(read, batches, a.budget_s))
    base = statistics.median(runs["torch in memory (today)"])
    print(f"\n{a.rows:,} rows x {a.features} float32, random batches of {BATCH}, median of {a.repeats}")
    print("| store | samples/s | vs torch in memory |\n|---|---:|---:|")
    for name, rates in runs.items():
        median = statistics.median(rates)
        print(f"| {name} | {median:,.0f} | {median / base:.3f} |")


if __name__ == "__main__":
    main()
