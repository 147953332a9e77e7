"""`trainflow tune`: the hyperparameter sweep of params.yaml's tune: section, in this process (after ingest and split,
if DVC sees them changed) or as flow runs of a Prefect deployment; the result as JSON."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from trainflow.core.errors import UserError

if TYPE_CHECKING:
    from trainflow.core.paths import Paths


def command(args: argparse.Namespace, paths: Paths) -> int:
    from trainflow import tune
    from trainflow.params import load_params

    for flag in ("trials", "workers"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise UserError(f"--{flag} must be at least 1, not {getattr(args, flag)}")
    tune.check_overrides(args.overrides)
    if args.apply and not args.deployment:
        # `--apply` alone, after a sweep run with -S: the study was measured under those -S and refuses other params,
        # so it is reopened with them (they are not written into params.yaml: only the best trial's values are).
        found = tune.recorded(load_params(paths.params), paths)
        if found is not None and found[0] and not args.overrides:
            args.overrides = found[0]
            print(f"tune --apply: study {load_params(paths.params).tune.study!r} was run with -S "
                  f"{' -S '.join(found[0])}; reopened with them", file=sys.stderr)  # fmt: skip
        if found is not None and args.trials is None:
            args.trials = found[1]  # every trial it holds, none added
    params = load_params(paths.params, args.overrides)
    if args.deployment:
        from flows.sweep import sweep

        result = sweep(
            root=str(paths.root),
            overrides=args.overrides,
            trials=args.trials,
            workers=args.workers,
            deployment=args.deployment,
            apply=args.apply,
        )
        print(json.dumps(result, indent=2, default=str))
        return 0
    prepare_data(paths)
    result = tune.run(
        params, paths, trials=args.trials, workers=args.workers, apply=args.apply, overrides=args.overrides
    )
    print(json.dumps(result, indent=2, default=str))
    return 0


def prepare_data(paths: Paths) -> None:
    """Ingest and split, each only if DVC sees it changed (then `dvc commit`ted, as `trainflow run` does): a sweep's
    trials train on data/splits. It holds the workspace meanwhile (trainflow.core.workspace): a second waits here."""
    if not (paths.root / ".dvc").is_dir():
        return  # not a DVC project: the splits must exist (tune.check says so)
    from tasks import dvc
    from trainflow.core import workspace
    from trainflow.params import load_params
    from trainflow.stages import run_stage

    with workspace.hold(paths.root, "trainflow tune (ingest and split)"):
        for stage in ("ingest", "split"):
            if dvc.changed(paths.root, stage):
                print(f"[trainflow] {stage}: running", file=sys.stderr, flush=True)
                run_stage(stage, load_params(paths.params), paths)
                dvc.commit(paths.root, stage)
