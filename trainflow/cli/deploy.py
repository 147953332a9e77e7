"""`trainflow deploy`: the pipeline served on a cron schedule from a Prefect server (flows/deploy.py), until Ctrl-C."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainflow.core.paths import Paths


def command(args: argparse.Namespace, paths: Paths) -> int:
    from flows.deploy import serve

    return serve(paths, cron=args.cron, name=args.name, timezone=args.timezone)
