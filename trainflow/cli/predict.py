"""`trainflow predict`: a table scored with a registered or exported model, its rows plus the predictions written to
--output; what predict_file did as JSON."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from trainflow.core.errors import UserError

if TYPE_CHECKING:
    from trainflow.core.paths import Paths


def command(args: argparse.Namespace, paths: Paths) -> int:
    from trainflow import tracking
    from trainflow.artifacts.batch_predict import predict_file
    from trainflow.artifacts.predict import BATCH_SIZE

    if args.batch_size is not None and args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, not {args.batch_size}")
    tracking.configure(paths.root)  # models:/ URIs resolve against the project's registry
    from trainflow.stages import importable

    importable(paths.root)  # a model directory of a user model imports its module from the project
    result = predict_file(
        args.model, args.input, args.output, args.batch_size or BATCH_SIZE, args.memory_budget_mb, args.runtime
    )
    print(json.dumps(result, indent=2))
    return 0
