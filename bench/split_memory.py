"""Peak memory of the keyed split of a table bigger than memory (issue 26): the whole-column assignment (`split.assign`
over the table read a column at a time: what the split stage streamed with before) against the bucketed one
(`split_stream.assign`), on processed tables of N rows (a row key, 16 float columns, a 3-class text label).

Each measurement runs in a fresh process started from this (small) one: a child's ru_maxrss starts from its parent's
peak, so a parent that built the data would inflate it. The table: peak RSS of the step, its increase over the
process after imports, and bytes per row of that increase.

    .venv/bin/python bench/split_memory.py [--rows 2000000 8000000 32000000] [--workdir /tmp/trainflow-split-memory]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def make(path: Path, n: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainflow.data.schema import ROW_KEY

    rng = np.random.default_rng(0)
    cols = {ROW_KEY: pa.array(rng.integers(0, 2**63, n, dtype=np.int64).astype(np.uint64))}
    for i in range(16):
        cols[f"f{i}"] = pa.array(rng.normal(size=n))
    cols["label"] = pa.array(rng.choice(np.array(["ham", "spam", "other"], dtype=object), n))
    pq.write_table(pa.table(cols), path, row_group_size=1 << 20)


def step(which: str, path: Path, n: int) -> dict[str, float | str | int]:
    from trainflow.data import split_stream, stream
    from trainflow.data.schema import Schema
    from trainflow.data.split import assign
    from trainflow.params import SplitParams

    features = [f"f{i}" for i in range(16)]
    schema = Schema(source="t", target="label", task="classification", features=features,
                    kinds=dict.fromkeys(features, "numeric"), classes=["ham", "other", "spam"], n_rows=n)  # fmt: skip
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    if which == "whole":
        result = assign(stream.ParquetColumns(path), schema, SplitParams(seed=0))
    else:
        work = path.with_name("work")
        dest = path.with_name("assignment.parquet")
        result = split_stream.assign(path, schema, SplitParams(seed=0), None, dest, work)
        work.rmdir()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"which": which, "rows": n, "seconds": seconds, "peak": peak, "added": peak - base,
            "test_rows": int((result.split == 2).sum())}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[2_000_000, 8_000_000, 32_000_000])
    ap.add_argument("--workdir", default="/tmp/trainflow-split-memory")
    ap.add_argument("--step", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.step:
        print(json.dumps(step(args.step[0], Path(args.step[1]), int(args.step[2]))))
        return 0
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in args.rows:
        path = workdir / f"table_{n}.parquet"
        if not path.is_file():
            print(f"generating {path}", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                            f"from split_memory import make; from pathlib import Path; make(Path({str(path)!r}), {n})"],
                           check=True)  # fmt: skip
        for which in ("whole", "buckets"):
            out = subprocess.run([sys.executable, __file__, "--step", which, str(path), str(n)], check=True,
                                 capture_output=True, text=True).stdout  # fmt: skip
            rows.append(json.loads(out.strip().splitlines()[-1]))
    print("| rows | assignment | seconds | peak RSS (MiB) | added (MiB) | bytes per row added | test rows |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['rows']:,} | {r['which']} | {r['seconds']:.1f} | {r['peak'] / 2**20:,.0f} | "
              f"{r['added'] / 2**20:,.0f} | {r['added'] / r['rows']:.1f} | {r['test_rows']:,} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
