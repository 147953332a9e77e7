"""`trainflow stage NAME`: one stage of the pipeline, whatever DVC thinks of it (dvc.yaml runs each stage this way),
its result as JSON; params.yaml already holds the -S overrides (overrides.py)."""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING

from trainflow.core.errors import UserError

if TYPE_CHECKING:
    from trainflow.core.paths import Paths


def command(args: argparse.Namespace, paths: Paths) -> int:
    from trainflow.params import load_params
    from trainflow.stages import run_stage

    if args.accept_schema and args.name != "ingest":
        raise UserError("--accept-schema applies to `trainflow stage ingest` only")
    options = {"accept_schema": True} if args.accept_schema else {}
    result = run_stage(args.name, load_params(paths.params), paths, **options)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 alone speaks
        print(json.dumps({args.name: result}, indent=2, default=str))
    return 0
