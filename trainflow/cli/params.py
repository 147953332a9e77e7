"""`trainflow params check` (the resolved params as JSON on stdout, or every problem on stderr) and `trainflow params
schema` (the JSON Schema of params.yaml); neither writes anything."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainflow.core.paths import Paths


def command(args: argparse.Namespace, paths: Paths) -> int:
    from trainflow.params import load_params, schema

    params = load_params(paths.params, args.overrides)  # validates the overrides too
    if args.action == "schema":
        print(json.dumps(schema(), indent=2))
    else:
        print(f"{paths.params}: ok" + (" with the -S overrides" if args.overrides else ""), file=sys.stderr)
        print(json.dumps(params.model_dump(mode="json"), indent=2))  # stdout is JSON alone, for jq and scripts
    return 0
