"""`trainflow` command line. Exit codes: 0 ok, 2 invalid params or data (the message names what to fix), 1 other."""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from trainflow.errors import ServiceError, UserError
from trainflow.stages import STAGES

# Quiet, offline-safe defaults for the services we drive; any of them can be overridden from the environment.
ENV_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "DO_NOT_TRACK": "1",
}


def _overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-S",
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a parameter, YAML value, as `dvc exp run -S` (e.g. -S train.lr=3e-4 -S data.exclude=[a,b])",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    stage = sub.add_parser("stage", help="run one pipeline stage (what dvc.yaml calls)")
    stage.add_argument("name", choices=STAGES)
    _overrides(stage)
    run = sub.add_parser("run", help="run the whole pipeline through the Prefect flow (stages DVC sees as changed)")
    _overrides(run)
    predict = sub.add_parser(
        "predict",
        help="score a table with a registered or exported model; writes its rows plus the predictions",
        description="Score every row of --input with --model and write the rows plus a `prediction` column (and "
        "`proba_<class>` columns for classification) to --output, as csv, tsv, parquet or jsonl by its extension.",
    )
    predict.add_argument(
        "--model",
        required=True,
        help="models:/<name>@champion, models:/<name>/<version>, runs:/<run>/model, or an exported model directory",
    )
    predict.add_argument("--input", required=True, type=Path, help="a csv, tsv, parquet or jsonl file")
    predict.add_argument("--output", required=True, type=Path, help="where to write (.csv, .tsv, .parquet, .jsonl)")
    predict.add_argument("--batch-size", type=int, default=None, help="rows per forward pass (default 1024)")
    params = sub.add_parser("params", help="check params.yaml or print its JSON Schema")
    psub = params.add_subparsers(dest="action", required=True)
    check = psub.add_parser("check", help="validate params.yaml (with -S overrides); changes nothing")
    _overrides(check)
    schema = psub.add_parser("schema", help="print the JSON Schema of params.yaml")
    _overrides(schema)
    deploy = sub.add_parser(
        "deploy",
        help="serve the pipeline on a cron schedule from a Prefect server (PREFECT_API_URL); runs until Ctrl-C",
    )
    deploy.add_argument("--cron", help="cron expression, e.g. '0 3 * * *' (default: deploy.cron in params.yaml)")
    deploy.add_argument("--name", help="deployment name (default: deploy.name in params.yaml)")
    deploy.add_argument("--timezone", help="IANA time zone of the cron (default: deploy.timezone in params.yaml)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    try:
        return _dispatch(args)
    except (UserError, ServiceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted; finished outputs are intact, rerun to continue", file=sys.stderr)
        return 130
    except Exception:  # noqa: BLE001 - last-resort handler: show the traceback, exit 1
        traceback.print_exc()
        return 1


def _dispatch(args: argparse.Namespace) -> int:
    from trainflow.params import load_params, schema, write_overrides
    from trainflow.paths import Paths

    paths = Paths.default()
    if args.command == "params":
        params = load_params(paths.params, args.overrides)  # validates the overrides too
        if args.action == "schema":
            print(json.dumps(schema(), indent=2))
        else:
            print(f"{paths.params}: ok")
            if args.overrides:
                print(json.dumps(params.model_dump(), indent=2))
        return 0
    if args.command == "predict":
        from trainflow import tracking
        from trainflow.batch import predict_file
        from trainflow.predict import BATCH_SIZE

        if args.batch_size is not None and args.batch_size < 1:
            raise UserError(f"--batch-size must be at least 1, not {args.batch_size}")
        tracking.configure(paths.root)  # models:/ URIs resolve against the project's registry
        result = predict_file(args.model, args.input, args.output, args.batch_size or BATCH_SIZE)
        print(json.dumps(result, indent=2))
        return 0
    if args.command == "deploy":
        from flows.deploy import serve

        return serve(paths, cron=args.cron, name=args.name, timezone=args.timezone)
    load_params(paths.params, args.overrides)  # every problem is reported before anything is written
    write_overrides(paths.params, args.overrides)  # DVC's record stays true: the file holds what ran
    if args.command == "stage":
        from trainflow.stages import run_stage

        result = run_stage(args.name, load_params(paths.params), paths)
        print(json.dumps({args.name: result}, indent=2, default=str))
        return 0
    from flows.training_pipeline import summary, training_pipeline

    results = training_pipeline(root=str(paths.root), caller_reports_errors=True)
    print(summary(paths, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
