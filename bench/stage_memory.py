"""Where a stage's memory peaks: runs `trainflow stage <name>` in this process while a thread samples RssAnon (the
memory the process holds itself) every 5 ms with the main thread's Python stack, and prints the peak seen under each
stack of trainflow's own frames, highest first (issue 26: finding what grows with the rows).

    cd <project> && /path/to/.venv/bin/python /path/to/bench/stage_memory.py <stage> [--top 25]

Linux only (/proc/self/status). The sampling costs a few percent of a core.
"""

from __future__ import annotations

import argparse
import collections
import sys
import threading
import time
import traceback


def rss_anon_mib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon"):
                return int(line.split()[1]) // 1024
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stage")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    main_thread = threading.main_thread().ident
    peaks: dict[str, int] = collections.defaultdict(int)

    def watch() -> None:
        while True:
            anon = rss_anon_mib()
            frame = sys._current_frames().get(main_thread or 0)
            if frame is not None:
                stack = traceback.extract_stack(frame)
                key = " > ".join(f"{f.name}:{f.lineno}" for f in stack if "/trainflow/" in f.filename)
                peaks[key] = max(peaks[key], anon)
            time.sleep(0.005)

    threading.Thread(target=watch, daemon=True).start()
    from trainflow.cli import main as cli

    try:
        return int(cli(["stage", args.stage]) or 0)
    finally:
        print(f"peak RssAnon (MiB) by stack, the {args.top} highest:", file=sys.stderr)
        for key, peak in sorted(peaks.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"{peak:>7,} {key[-200:]}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
