"""`trainflow data add` and `trainflow data watch`: new data files into data.source (trainflow/data/arrival.py), a
line for each saying what became of it."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainflow.core.paths import Paths


def command(args: argparse.Namespace, paths: Paths) -> int:
    from trainflow.data import arrival

    if args.action == "watch":
        try:
            arrival.watch(paths, args.inbox, args.interval, args.once)
        except KeyboardInterrupt:
            print("trainflow data watch: stopped", file=sys.stderr)
            return 130
        return 0
    for a in arrival.add(paths, args.files, emit=not args.no_event):
        if not a.new:
            print(f"data add: byte-identical to {a.file}, already in data.source: nothing added, no retrain")
            continue
        told = f"; event {arrival.EVENT} sent" if a.event else ""
        print(f"data add: added {a.file} ({a.rows} rows, sha256 {a.sha256[:16]}){told}")
    return 0
