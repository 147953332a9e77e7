"""Data layer throughput: trainflow's ingest + split vs pyarrow on a 5M-row CSV, peak memory, loader samples/s.

A 5,000,000-row x 20-column CSV (15 float columns, 3 int columns of which `label` is the 0/1 target, 2 short-string
categorical columns; ~0.5% empty cells in one float and one string column) is generated once and cached under
--workdir. Each measurement then runs in a fresh subprocess, so its peak RSS (VmHWM / ru_maxrss: interpreter and
imports included) is its own:

    pyarrow   pyarrow.csv.read_csv + pyarrow.parquet.write_table of the file (the floor for "CSV -> Parquet").
    ingest    trainflow.stages.run_stage("ingest") in a temp project whose data.source is the file (hard-linked into
              data/raw), data.target=label; then
    split     run_stage("split") on what ingest wrote.
    memory    the table's in-memory size: pyarrow Table.nbytes, pandas memory_usage(deep=True), and the same for the
              processed table trainflow wrote (data/processed/table.parquet).
    loader    trainflow.engine.loaders.TensorData over a float32 [5M, 20] tensor: batch(idx) for every window of 1024
              indices of epoch_order(n, seed, epoch), one epoch (and a second, warm one); samples/s.

Targets: (ingest + split) seconds <= 2x pyarrow's; peak RSS of ingest and of split <= 3x the Arrow table's nbytes;
loader >= 1M samples/s.

    .venv/bin/python bench/data_throughput.py [--workdir /tmp/trainflow-bench] [--rows 5000000]

The table goes to stdout and the last line is one JSON object; progress and trainflow's messages go to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PROJECT_FILES = ("params.yaml", "dvc.yaml", ".dvcignore", ".dvc/config")
FLOATS, INTS, CATS = 15, 3, 2
CHUNK = 500_000
TARGETS = {"time_ratio": 2.0, "rss_ratio": 3.0, "loader_samples_per_s": 1_000_000}


# --- measuring inside a step --------------------------------------------------------------------------------------


def rss() -> dict[str, int]:
    """Current and peak resident set size of this process, in bytes."""
    out = {"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[{"VmRSS": "rss", "VmHWM": "vm_hwm"}[key]] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def step_pyarrow(csv: Path, workdir: Path) -> dict[str, Any]:
    import pyarrow.csv as pv
    import pyarrow.parquet as pq

    before = rss()
    t0 = time.perf_counter()
    table = pv.read_csv(csv)
    t_read = time.perf_counter() - t0
    pq.write_table(table, workdir / "pyarrow.parquet")
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "read_seconds": t_read, "rss_after_imports": before["rss"], **rss()}


def step_stage(name: str, project: Path) -> dict[str, Any]:
    from trainflow.core.paths import Paths
    from trainflow.params import load_params
    from trainflow.stages import run_stage

    paths = Paths(project)
    params = load_params(paths.params)
    importlib.import_module(f"trainflow.stages.{name}")  # its imports are not the stage's time
    before = rss()
    t0 = time.perf_counter()
    summary = run_stage(name, params, paths)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "summary": summary, "rss_after_imports": before["rss"], **rss()}


def step_memory(csv: Path, project: Path) -> dict[str, Any]:
    import pyarrow.csv as pv
    import pyarrow.parquet as pq

    table = pv.read_csv(csv)
    out: dict[str, Any] = {"arrow_nbytes": table.nbytes, "rows": table.num_rows, "columns": table.num_columns}
    out["arrow_types"] = {f.name: str(f.type) for f in table.schema}
    frame = table.to_pandas()
    out["pandas_deep_bytes"] = int(frame.memory_usage(deep=True, index=False).sum())
    del frame, table
    processed = project / "data" / "processed" / "table.parquet"
    if processed.is_file():
        table = pq.read_table(processed)
        out["processed_arrow_nbytes"] = table.nbytes
        out["processed_types"] = {f.name: str(f.type) for f in table.schema}
        out["processed_pandas_deep_bytes"] = int(table.to_pandas().memory_usage(deep=True, index=False).sum())
    return out


def step_loader(rows: int, features: int, batch: int) -> dict[str, Any]:
    import torch

    from trainflow.engine.loaders import TensorData, epoch_order

    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, features, generator=g, dtype=torch.float32)
    y = torch.randint(0, 2, (rows,), generator=g)
    data = TensorData(x, y)
    epochs = []
    for epoch in range(2):
        t0 = time.perf_counter()
        order = epoch_order(len(data), 0, epoch)
        t_order = time.perf_counter() - t0
        seen = 0
        for idx in order.split(batch):
            b = data.batch(idx)
            seen += b.count
        seconds = time.perf_counter() - t0
        if seen != rows:
            raise RuntimeError(f"an epoch saw {seen} samples, not {rows}")
        epochs.append({"seconds": seconds, "order_seconds": t_order, "samples_per_s": rows / seconds})
    return {"epochs": epochs, "threads": torch.get_num_threads(), **rss()}


def run_step(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir)
    if args.step == "pyarrow":
        out = step_pyarrow(Path(args.csv), workdir)
    elif args.step in ("ingest", "split"):
        out = step_stage(args.step, Path(args.project))
    elif args.step == "memory":
        out = step_memory(Path(args.csv), Path(args.project))
    elif args.step == "loader":
        out = step_loader(args.rows, FLOATS + INTS + CATS, 1024)
    else:
        raise SystemExit(f"unknown step {args.step}")
    print(json.dumps(out, default=str), flush=True)
    return 0


# --- the parent ---------------------------------------------------------------------------------------------------


def generate(path: Path, rows: int) -> float:
    """The CSV, written in chunks with pyarrow.csv (deterministic). Returns seconds."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pv

    t0 = time.perf_counter()
    tmp = path.with_name(path.name + ".tmp")
    colors = np.array(["red", "green", "blue", "black", "white", "grey", "yellow", "orange"])
    codes = np.array([f"K{i:02d}" for i in range(40)])
    writer = None
    rng = np.random.default_rng(5_000_000)
    w = rng.normal(0, 1, FLOATS)
    try:
        for start in range(0, rows, CHUNK):
            n = min(CHUNK, rows - start)
            cols: dict[str, Any] = {}
            f = rng.normal(0, 1, (n, FLOATS))
            for j in range(FLOATS):
                scale = (1.0, 10.0, 1000.0, 0.01, 250.0)[j % 5]
                values = f[:, j] * scale if j % 3 else np.exp(f[:, j]) * scale  # some skewed, some symmetric
                cols[f"f{j:02d}"] = pa.array(np.round(values, 4), mask=(rng.random(n) < 0.005) if j == 3 else None)
            cols["count"] = pa.array(rng.poisson(3, n).astype(np.int64))
            cols["year"] = pa.array(rng.integers(1990, 2025, n).astype(np.int64))
            cat0 = rng.integers(0, len(colors), n)
            cols["color"] = pa.array(colors[cat0])
            cols["code"] = pa.array(codes[rng.integers(0, len(codes), n)], mask=rng.random(n) < 0.005)
            logit = f @ w / np.sqrt(FLOATS) + 0.3 * (cat0 == 2) + rng.logistic(0, 0.5, n)
            cols["label"] = pa.array((logit > 0).astype(np.int64))
            table = pa.table(cols)
            if writer is None:
                writer = pv.CSVWriter(str(tmp), table.schema)
            writer.write_table(table)
            print(f"  generated {start + n:,}/{rows:,} rows", file=sys.stderr, flush=True)
    finally:
        if writer is not None:
            writer.close()
    os.replace(tmp, path)
    return time.perf_counter() - t0


def subprocess_step(step: str, args: argparse.Namespace, **extra: str) -> dict[str, Any]:
    """Run one step in a fresh interpreter; returns its JSON, or {"error": ...}."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--step", step, "--workdir", args.workdir]
    cmd += ["--rows", str(args.rows)]
    for k, v in extra.items():
        cmd += [f"--{k}", v]
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    if "project" in extra:
        env["TRAINFLOW_ROOT"] = extra["project"]
    print(f"[{step}] running", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd,
            cwd=extra.get("project", args.workdir),
            env=env,
            capture_output=True,
            text=True,
            timeout=args.step_timeout,
        )
    except subprocess.TimeoutExpired as exc:
        err = (exc.stderr or b"")[-2000:]
        sys.stderr.write(err.decode() if isinstance(err, bytes) else err)
        return {"error": f"timed out after {args.step_timeout}s", "wall_seconds": time.perf_counter() - t0}
    sys.stderr.write(proc.stderr[-5000:])
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = [line for line in proc.stderr.strip().splitlines() if line.strip()][-1:] or [f"rc {proc.returncode}"]
        return {"error": tail[0][:500], "rc": proc.returncode, "wall_seconds": wall}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall_seconds"] = wall
    print(f"[{step}] {wall:.1f}s wall: {json.dumps(result, default=str)[:400]}", file=sys.stderr, flush=True)
    return result


def make_project(project: Path, csv: Path) -> None:
    from trainflow.params import write_overrides

    shutil.rmtree(project, ignore_errors=True)
    for rel in PROJECT_FILES:
        if (REPO / rel).is_file():
            (project / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, project / rel)
    raw = project / "data" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    try:
        os.link(csv, raw / csv.name)  # the same bytes, no copy, and a plain file under the project
    except OSError:
        os.symlink(csv, raw / csv.name)
    write_overrides(
        project / "params.yaml",
        [f"data.source=data/raw/{csv.name}", "data.target=label", "register.model_name=wide", "train.progress=false"],
    )


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workdir", default="/tmp/trainflow-bench", help="cache and temp project (default %(default)s)")
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--step-timeout", type=int, default=900, help="seconds before a step is given up on")
    ap.add_argument("--step", help=argparse.SUPPRESS)
    ap.add_argument("--csv", help=argparse.SUPPRESS)
    ap.add_argument("--project", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.step:
        return run_step(args)

    t_start = time.perf_counter()
    load_start = os.getloadavg()[0]  # other work on the machine moves every figure here
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    csv = workdir / f"wide_{args.rows}x{FLOATS + INTS + CATS}.csv"
    gen_seconds = None
    if not csv.is_file():
        print(f"generating {csv}", file=sys.stderr, flush=True)
        gen_seconds = generate(csv, args.rows)
    size = csv.stat().st_size
    with open(csv, "rb") as f:  # into the page cache, so no step pays for the first read from disk
        while f.read(1 << 24):
            pass
    project = workdir / "project"
    make_project(project, csv)

    res: dict[str, dict[str, Any]] = {}
    res["pyarrow"] = subprocess_step("pyarrow", args, csv=str(csv))
    res["ingest"] = subprocess_step("ingest", args, project=str(project))
    res["split"] = subprocess_step("split", args, project=str(project)) if "error" not in res["ingest"] else {}
    res["memory"] = subprocess_step("memory", args, csv=str(csv), project=str(project))
    res["loader"] = subprocess_step("loader", args)
    (workdir / "pyarrow.parquet").unlink(missing_ok=True)

    def ok(step: str) -> bool:
        return bool(res.get(step)) and "error" not in res[step]

    figures: dict[str, Any] = {"rows": args.rows, "columns": FLOATS + INTS + CATS, "csv_bytes": size}
    figures["generate_seconds"] = None if gen_seconds is None else round(gen_seconds, 1)
    passed: dict[str, bool | None] = {"time": None, "rss": None, "loader": None}
    if ok("pyarrow"):
        figures["pyarrow_seconds"] = round(res["pyarrow"]["seconds"], 2)
        figures["pyarrow_peak_rss"] = res["pyarrow"]["peak_rss"]
    if ok("ingest"):
        figures["ingest_seconds"] = round(res["ingest"]["seconds"], 2)
        figures["ingest_peak_rss"] = res["ingest"]["peak_rss"]
        figures["ingest_rss_after_imports"] = res["ingest"]["rss_after_imports"]
        figures["ingest_summary"] = res["ingest"]["summary"]
    if ok("split"):
        figures["split_seconds"] = round(res["split"]["seconds"], 2)
        figures["split_peak_rss"] = res["split"]["peak_rss"]
        figures["split_summary"] = res["split"]["summary"]
    if ok("ingest") and ok("split") and ok("pyarrow"):
        ours = res["ingest"]["seconds"] + res["split"]["seconds"]
        figures["ours_seconds"] = round(ours, 2)
        figures["time_ratio"] = round(ours / res["pyarrow"]["seconds"], 2)
        figures["ingest_time_ratio"] = round(res["ingest"]["seconds"] / res["pyarrow"]["seconds"], 2)
        passed["time"] = figures["time_ratio"] <= TARGETS["time_ratio"]
    if ok("memory"):
        m = res["memory"]
        figures |= {k: m[k] for k in ("arrow_nbytes", "pandas_deep_bytes") if k in m}
        figures |= {k: m[k] for k in ("processed_arrow_nbytes", "processed_pandas_deep_bytes") if k in m}
        peaks = [res[s]["peak_rss"] for s in ("ingest", "split") if ok(s)]
        if peaks and ok("split"):
            figures["ours_peak_rss"] = max(peaks)
            figures["rss_ratio"] = round(max(peaks) / m["arrow_nbytes"], 2)
            figures["rss_ratio_vs_pandas"] = round(max(peaks) / m["pandas_deep_bytes"], 2)
            passed["rss"] = figures["rss_ratio"] <= TARGETS["rss_ratio"]
    if ok("loader"):
        epochs = res["loader"]["epochs"]
        figures["loader_samples_per_s"] = round(epochs[0]["samples_per_s"])
        figures["loader_samples_per_s_warm"] = round(epochs[1]["samples_per_s"])
        figures["loader_epoch_order_seconds"] = round(epochs[0]["order_seconds"], 3)
        figures["loader_peak_rss"] = res["loader"]["peak_rss"]
        passed["loader"] = figures["loader_samples_per_s"] >= TARGETS["loader_samples_per_s"]

    def cell(key: str, fmt: Any = str) -> str:
        return fmt(figures[key]) if key in figures else "n/a"

    def verdict(key: str) -> str:
        return {True: "pass", False: "FAIL", None: "n/a"}[passed[key]]

    print(
        f"{args.rows:,} rows x {FLOATS + INTS + CATS} columns ({FLOATS} float, {INTS} int incl. label, {CATS} string), "
        f"CSV {size / 2**20:,.0f} MiB, {os.cpu_count()} CPUs, 1-min load average {load_start:.2f} at the start; "
        "each step in a fresh subprocess"
    )
    print()
    print("| measure | trainflow | reference | ratio | target | result |")
    print("|---|---:|---:|---:|---:|---|")
    print(
        f"| CSV -> Parquet + split, seconds | {cell('ours_seconds')} (ingest {cell('ingest_seconds')}, split "
        f"{cell('split_seconds')}) | pyarrow read_csv + write_table {cell('pyarrow_seconds')} | "
        f"{cell('time_ratio')}x | <= {TARGETS['time_ratio']:g}x | {verdict('time')} |"
    )
    print(
        f"| peak RSS | {cell('ours_peak_rss', gib)} (ingest {cell('ingest_peak_rss', gib)}, split "
        f"{cell('split_peak_rss', gib)}) | Arrow table nbytes {cell('arrow_nbytes', gib)} (pandas deep "
        f"{cell('pandas_deep_bytes', gib)}) | {cell('rss_ratio')}x ({cell('rss_ratio_vs_pandas')}x pandas) | "
        f"<= {TARGETS['rss_ratio']:g}x | {verdict('rss')} |"
    )
    print(
        f"| loader samples/s (TensorData.batch, windows of 1024) | {cell('loader_samples_per_s', '{:,}'.format)} "
        f"(warm epoch {cell('loader_samples_per_s_warm', '{:,}'.format)}) | - | - | >= 1,000,000 | "
        f"{verdict('loader')} |"
    )
    print()
    print(
        f"pyarrow step peak RSS {cell('pyarrow_peak_rss', gib)}; ingest RSS after imports "
        f"{cell('ingest_rss_after_imports', gib)}; processed table (trainflow's types) "
        f"{cell('processed_arrow_nbytes', gib)} in Arrow, {cell('processed_pandas_deep_bytes', gib)} in pandas."
    )
    for step, r in res.items():
        if r and "error" in r:
            print(f"{step}: ERROR {r['error']}")
    result = {
        **figures,
        "targets": TARGETS,
        "pass": passed,
        "all_pass": all(v is True for v in passed.values()),
        "errors": {s: r["error"] for s, r in res.items() if r and "error" in r},
        "steps": res,
        "loadavg_1min_start_end": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "total_runtime_s": round(time.perf_counter() - t_start, 1),
    }
    print(json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
