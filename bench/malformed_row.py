"""A malformed row in the middle of a multi-GiB CSV, streamed (issue 26): ingest reports its file and line, leaves
nothing half-written (no data/processed, no spill), and the fix its message gives works when followed.

The CSV is data_throughput.py's (--rows rows, 15M: about 2.1 GiB), generated once under --workdir; a copy gets one
line in the middle with a field too many. Ingest runs in a project with data.memory_budget_mb --budget (so it
streams), in its own process (`trainflow stage ingest`). Then the line is removed, as the message says to, and
ingest runs again.

    .venv/bin/python bench/malformed_row.py [--rows 15000000] [--budget 256] [--workdir /tmp/trainflow-malformed]

Prints what it checked, with times; exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data_throughput import generate, make_project  # noqa: E402

TRAINFLOW = Path(sys.executable).parent / "trainflow"


def break_line(source: Path, dest: Path) -> tuple[int, str]:
    """Copy `source` to `dest` with a field added to the line in the middle; returns (its line number, the line)."""
    size = source.stat().st_size
    with source.open("rb") as f, dest.open("wb") as out:
        head = f.read(size // 2)
        cut = head.rfind(b"\n") + 1
        out.write(head[:cut])
        line_no = head[:cut].count(b"\n") + 1
        rest = head[cut:] + f.readline()
        bad = rest.rstrip(b"\n") + b",999\n"
        out.write(bad)
        shutil.copyfileobj(f, out, 16 << 20)
    return line_no, bad.decode().rstrip("\n")


def remove_line(path: Path, line_no: int) -> None:
    tmp = path.with_suffix(".fixed")
    with path.open("rb") as f, tmp.open("wb") as out:
        for i, line in enumerate(f, 1):
            if i != line_no:
                out.write(line)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=15_000_000)
    ap.add_argument("--budget", default="256")
    ap.add_argument("--workdir", default="/tmp/trainflow-malformed")
    args = ap.parse_args(argv)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    clean = work / f"wide_{args.rows}.csv"
    if not clean.is_file():
        print(f"generating {clean}", file=sys.stderr, flush=True)
        generate(clean, args.rows)
    project = work / "project"
    broken = work / "broken.csv"
    line_no, bad = break_line(clean, broken)
    make_project(project, broken)
    from trainflow.params import write_overrides

    write_overrides(project / "params.yaml", [f"data.memory_budget_mb={args.budget}"])
    raw = project / "data/raw" / broken.name
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    failures = []

    def check(ok: bool, what: str) -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            failures.append(what)

    size = raw.stat().st_size
    print(f"{raw.name}: {size / 2**30:.2f} GiB, {args.rows:,} rows; line {line_no:,} has a field too many: "
          f"{bad[:60]}...")  # fmt: skip
    t0 = time.perf_counter()
    run = subprocess.run([str(TRAINFLOW), "stage", "ingest"], cwd=project, env=env, capture_output=True, text=True)
    took = time.perf_counter() - t0
    message = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else ""
    print(f"ingest exited {run.returncode} after {took:.0f} s: {message}")
    check(run.returncode != 0, "ingest fails (non-zero exit)")
    check(f"data/raw/{raw.name}, line {line_no}" in message, f"the message names the file and line {line_no:,}")
    check("read a column at a time from a spill on disk" in run.stderr, "ingest streamed")
    check(not (project / "data/processed").exists(), "no data/processed (nothing half-written)")
    leftovers = [p for p in (project / "data").rglob("*") if ".spill" in p.parts or p.name.startswith(".tmp")]
    check(not leftovers, "no spill or temporary files left")
    remove_line(raw, line_no)  # the fix the message gives: remove (or repair) that line
    t0 = time.perf_counter()
    again = subprocess.run([str(TRAINFLOW), "stage", "ingest"], cwd=project, env=env, capture_output=True, text=True)
    print(f"after removing the line: ingest exited {again.returncode} after {time.perf_counter() - t0:.0f} s")
    check(again.returncode == 0 and (project / "data/processed/table.parquet").is_file(), "the fix works")
    if again.returncode == 0:
        import pyarrow.parquet as pq

        rows = pq.ParquetFile(project / "data/processed/table.parquet").metadata.num_rows
        check(rows == args.rows - 1, f"the processed table has every other row ({rows:,})")
    else:
        print(again.stderr[-2000:])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
