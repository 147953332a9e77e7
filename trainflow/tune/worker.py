"""A sweep worker process: `python -m trainflow.tune.worker` with {"root", "params", "budget"[, "max_trials"]} as JSON
on stdin. Started by `trainflow tune` (tune.workers of them) and by the Prefect sweep flow's tasks."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    from trainflow.core.errors import ServiceError, UserError
    from trainflow.core.paths import Paths
    from trainflow.params import PipelineParams, with_values
    from trainflow.stages import importable
    from trainflow.tune import work
    from trainflow.tune.study import hashes

    spec = json.loads(sys.stdin.read())
    root = Path(spec["root"])
    importable(root)  # a user model imports from the project
    params = with_values(PipelineParams.model_validate(spec["params"]), {"train.progress": False}, "tune worker")
    try:
        ran = work(params, root, int(spec["budget"]), *hashes(params, Paths(root)), spec.get("max_trials"))
    except (UserError, ServiceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps({"trials_run": ran}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
