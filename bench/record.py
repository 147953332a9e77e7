"""Record a bench's headline in bench/results/<name>.json, the file bench/render.py turns into a row of the current
table in BENCHMARKS.md.

    from record import command_line, record  # bench/ is on sys.path when a bench runs as `python bench/<x>.py`

    record("noop-run", what="A `trainflow run` with nothing to do", command=command_line(),
           headline=f"median {median:.2f} s", target="< 5 s", met="yes" if median < 5 else "no")

The commit (`git rev-parse --short HEAD`, "-dirty" when the checkout has changes besides results and pages), today's
date (UTC) and the machine (CPU model and cores, and the GPU when torch sees one) are filled in. The benches call it
only under their `--record` flag, so running a bench never rewrites the committed results by accident. A field is
markdown, as it appears in its table cell ("|" is escaped by the renderer); a plain command is put in a code span.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
NOT_CODE = ("bench/results", "BENCHMARKS.md", "benchmarks")  # left out of the "-dirty" check


def git_commit() -> str:
    """The short hash of HEAD, with "-dirty" when the working tree differs from it; the results, BENCHMARKS.md and the
    pages aside (what recording and rendering write: one bench recorded must not mark the next one's commit dirty).
    "unknown" outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
        status = subprocess.run(["git", "status", "--porcelain", "--", ".", *(f":(exclude){p}" for p in NOT_CODE)],
                                cwd=ROOT, capture_output=True, text=True, check=True).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if status.strip() else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return " ".join(line.partition(":")[2].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def gpu_name() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    count = torch.cuda.device_count()
    return f"{count} × {torch.cuda.get_device_name(0)}" if count > 1 else torch.cuda.get_device_name(0)


def machine_description() -> str:
    """E.g. "AMD EPYC 9454 48-Core Processor, 2 cores; NVIDIA H200": the cores this process may use."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    described = f"{cpu_model()}, {cores} cores"
    gpu = gpu_name()
    return f"{described}; {gpu}" if gpu else described


def shown_path(path: str) -> str:
    """`path` relative to the checkout when it is inside it (`.venv/bin/python`, `bench/gate.py`), else as given.
    Links are not followed: .venv/bin/python is a link out of the checkout."""
    try:
        return Path(os.path.abspath(path)).relative_to(ROOT).as_posix()
    except ValueError:
        return path


def command_line(args: list[str] | None = None) -> str:
    """The command as typed to rerun this bench: this interpreter (`.venv/bin/python` when it is the checkout's, else
    `python`), the script, then `args` (by default the command line's), without `--record`."""
    python = shown_path(sys.executable)
    if Path(python).is_absolute():
        python = "python"
    args = sys.argv[1:] if args is None else args
    return shlex.join([python, shown_path(sys.argv[0]), *(arg for arg in args if arg != "--record")])


def record(name: str, *, what: str, command: str, headline: str, target: str, met: str, machine: str | None = None,
           page: str | None = None) -> Path:  # fmt: skip
    """Write bench/results/<name>.json and return its path. `page` defaults to the one the file already names, else
    benchmarks/<name>.md."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"a result's name is a file name: {name!r}")
    path = RESULTS / f"{name}.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    entry = {
        "what": what,
        "command": command if "`" in command else f"`{command}`",
        "headline": headline,
        "target": target,
        "met": met,
        "commit": git_commit(),
        "date": datetime.now(UTC).date().isoformat(),
        "machine": machine or machine_description(),
        "page": page or old.get("page") or f"benchmarks/{name}.md",
        "source": f"recorded by {shown_path(sys.argv[0]) if sys.argv and sys.argv[0] else 'bench/record.py'}",
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(entry, indent=2, ensure_ascii=False) + "\n")
    tmp.replace(path)
    print(f"recorded bench/results/{path.name}: `.venv/bin/python bench/render.py` puts it in BENCHMARKS.md",
          file=sys.stderr)  # fmt: skip
    return path
