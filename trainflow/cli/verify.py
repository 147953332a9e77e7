"""`trainflow verify`: a registered version retrained from its commit, params and data; exit 0 when the model comes
out byte for byte the registered one, else 1 with what differed."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainflow.core.paths import Paths


def command(args: argparse.Namespace, paths: Paths) -> int:
    from trainflow import tracking
    from trainflow.registry.verify import verify

    tracking.configure(paths.root)
    result = verify(args.model, paths.root, args.commit)
    what = f"{result['model']} (commit {result['git_commit'][:12]}, data {result['data_hash']})"
    if result["verified"]:
        print(f"verify: {what} reproduces: the retrained model is byte for byte the registered one "
              f"(sha256 {result['model_sha256'][:16]})")  # fmt: skip
        return 0
    differ = f"; test metrics differ: {', '.join(result['metrics_differ'])}" if result["metrics_differ"] else ""
    env = result["environment_differs"]
    if env is None:
        why = ("the environment it was trained in was not recorded (an older trainflow), so what differed is the "
               "training itself: another device or precision (bit-exact on a CPU, or on one GPU with "
               "train.deterministic), or other library versions")  # fmt: skip
    elif env:
        why = (f"the environment differs from the one it was trained in: {'; '.join(env)}. Training is bit-exact in "
               "one environment: verify it where it was trained, or retrain and register it here")  # fmt: skip
    else:
        why = ("so is the environment recorded with it, so the training itself was not deterministic: bit-exact on "
               "a CPU, and on one GPU with train.deterministic")  # fmt: skip
    print(f"error: verify: {what} did not reproduce: the retrained model's sha256 is {result['retrained_sha256'][:16]}"
          f", the registered one's {result['model_sha256'][:16]}{differ}. The data, code and params were checked "
          f"before retraining and are the ones it was trained with; {why}", file=sys.stderr)  # fmt: skip
    return 1
