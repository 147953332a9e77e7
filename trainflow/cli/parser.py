"""What users can type: every `trainflow` command, option and help text, in one place (the frozen surface: each
command's --help is pinned in tests/cli/test_help.py and printed as the CLI reference by docs/hooks.py). It builds the
parser and nothing else: what a command does is in its own module."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from trainflow.stages import STAGES

DESCRIPTION = (
    "`trainflow` command line. Exit codes: 0 ok, 2 invalid params or data (the message names what to fix), 75 training"
    "\npreempted (a signal or train.max_time: checkpointed, a rerun resumes), 1 other."
)
OVERRIDES_WRITTEN = (
    "-S KEY=VALUE sets a parameter of params.yaml (dotted path, YAML value, as `dvc exp run -S`): it is validated, "
    "then written into params.yaml (comments kept) so DVC's record of what ran stays true. If the command then fails "
    "on your params or data (exit code 2), params.yaml is put back as it was, and if stages had already run with the "
    "overrides, the message names them and what to run to make the outputs consistent again."
)
OUTPUTS = (
    "Outputs: data/processed/ (typed table, schema), data/splits/ (train/val/test), models/checkpoints/ (resume "
    "state), models/final/ (the model: safetensors + JSON), reports/metrics.json, reports/plots/, "
    "reports/registration.json; MLflow runs and the registry in mlflow.db (or MLFLOW_TRACKING_URI)."
)


def _overrides(parser: argparse.ArgumentParser, written: bool = True) -> None:
    what = "written into params.yaml, then used" if written else "not written anywhere"
    parser.add_argument(
        "-S",
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a parameter, YAML value, as `dvc exp run -S` ({what}); e.g. -S train.lr=3e-4 "
        "-S data.exclude=[a,b]; repeat for more",
    )


def package_version() -> str:
    """The installed trainflow's version (its package metadata); the source's own outside an installed copy."""
    import importlib.metadata  # not free to import: only for --version, so `trainflow --help` stays instant

    try:
        return importlib.metadata.version("trainflow")
    except importlib.metadata.PackageNotFoundError:
        from trainflow import __version__

        return __version__


class _VersionAction(argparse.Action):
    """argparse's `version` action, with the version looked up only when --version is given."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(f"{parser.prog} {package_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainflow", description=DESCRIPTION)
    parser.add_argument("--version", action=_VersionAction, help="print trainflow's version and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    stage = sub.add_parser(
        "stage",
        help="run one pipeline stage (what dvc.yaml calls)",
        description="Run one stage of the pipeline, whatever DVC thinks of it (dvc.yaml runs each stage this way). "
        + OVERRIDES_WRITTEN,
        epilog=OUTPUTS,
    )
    stage.add_argument("name", choices=STAGES, help="ingest, split, train, evaluate or register")
    stage.add_argument(
        "--accept-schema",
        action="store_true",
        help="ingest: take the data's columns and labels as they are now, without the drift check against the "
        "previous ingest (after the source changed on purpose)",
    )
    _overrides(stage)
    run = sub.add_parser(
        "run",
        help="run the whole pipeline through the Prefect flow (stages DVC sees as changed)",
        description="Run ingest, split, train, evaluate and register as a Prefect flow, each stage only if DVC sees "
        "it changed (then `dvc commit`ted, so `dvc status` stays clean), then push the outputs to the DVC remote "
        "(deploy.push). Ends with a summary: the inferred task, the metrics, the model, the registry decision. "
        + OVERRIDES_WRITTEN,
        epilog=OUTPUTS,
    )
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
    predict.add_argument(
        "--runtime",
        choices=["torch", "onnx"],
        default="torch",
        help="score with the torch model (default) or with its model.onnx in ONNX Runtime",
    )
    predict.add_argument(
        "--memory-budget-mb",
        type=float,
        default=None,
        help="a Parquet --input bigger than this once read is streamed a block at a time (default: a quarter of "
        "this machine's memory)",
    )
    params = sub.add_parser("params", help="check params.yaml or print its JSON Schema")
    psub = params.add_subparsers(dest="action", required=True)
    check = psub.add_parser(
        "check",
        help="validate params.yaml (with -S overrides); changes nothing",
        description="Validate params.yaml with the -S overrides; changes nothing. Valid: exit 0, the resolved params "
        "(every field, defaults included) as JSON on stdout, e.g. `trainflow params check | jq .train.lr`. Invalid: "
        "exit 2, every problem with its dotted path on stderr, nothing on stdout.",
    )
    _overrides(check, written=False)
    schema = psub.add_parser("schema", help="print the JSON Schema of params.yaml")
    _overrides(schema, written=False)
    models = sub.add_parser(
        "models",
        help="the registered model's versions: list them, promote one to champion, roll the champion back",
        description="The MLflow registry of register.model_name (or --name): `list` shows every version with its "
        "aliases, test metrics and data hash; `promote VERSION` makes a version the champion by hand; `rollback` "
        "gives the champion back to the version that held it before. Each change is tagged on the version with its "
        "reason.",
    )
    msub = models.add_subparsers(dest="action", required=True)
    for action, text in (
        ("list", "every version, newest first"),
        ("promote", "make VERSION the champion"),
        ("rollback", "champion back to the previous champion"),
        ("show", "print the model card of a version (NAME@ALIAS or NAME/VERSION)"),
    ):
        cmd = msub.add_parser(action, help=text)
        if action == "show":
            cmd.add_argument("model", help="NAME@champion, NAME/VERSION (or models:/...)")
            cmd.add_argument("--html", type=Path, help="also write the card's self-contained HTML page here")
            continue
        cmd.add_argument("--name", help="registered model name (default: register.model_name in params.yaml)")
        if action == "list":
            cmd.add_argument("--all", action="store_true", help="every registered model name instead, one row each")
        if action == "promote":
            cmd.add_argument("version", type=int, help="the version to make champion")
        if action != "list":
            cmd.add_argument("--reason", default="(no reason given)", help="why; recorded as a tag on the version")
    verify = sub.add_parser(
        "verify",
        help="retrain a registered version from its commit, params and data; check it comes out byte for byte",
        description="Prove a registered version reproduces: the code of its git commit with the params it was "
        "trained with, the splits it was trained on out of the DVC cache (each file checked against DVC's md5), the "
        "train stage run in a temporary folder, and the exported model's hash compared with the version's. Exit 0 "
        "when it matches.",
    )
    verify.add_argument("model", help="NAME@champion, NAME@challenger, NAME/VERSION (or models:/...)")
    verify.add_argument(
        "--commit",
        help="retrain from this commit's code (e.g. HEAD), for a version trained from changes committed after it",
    )
    tune = sub.add_parser(
        "tune",
        help="hyperparameter sweep (Optuna): trials of the tune: section, results in reports/tune/",
        description="Run the study of params.yaml's tune: section to its budget: each trial trains on data/splits "
        "(ingest and split run first if DVC sees them changed) in models/tune/<study>/trial_NNNN, is pruned when "
        "unpromising, and is tracked as a child of the study's MLflow run. A rerun continues the study and resumes "
        "trials a killed worker left. Writes reports/tune/trials.csv, best_params.yaml and plots. -S overrides apply "
        "to this sweep only: params.yaml is never rewritten, except by --apply.",
    )
    _overrides(tune, written=False)
    tune.add_argument("--trials", type=int, help="total trials of the study (default: tune.trials)")
    tune.add_argument("--workers", type=int, help="trials at the same time, as processes (default: tune.workers)")
    tune.add_argument(
        "--apply",
        action="store_true",
        help="write the best trial's params into params.yaml (comments kept), with register.tags naming the study "
        "and trial; the next `trainflow run` trains and registers them through the usual gate",
    )
    tune.add_argument(
        "--deployment",
        metavar="FLOW/NAME",
        help="run the trials as flow runs of this deployment of flows/sweep.py:tune_worker on a Prefect work pool "
        "(workers on many machines; needs PREFECT_API_URL and a tune.storage database), e.g. tune_worker/tune-worker",
    )
    data = sub.add_parser(
        "data",
        help="new data: add a file to data.source (tracked with DVC; a Prefect event starts the deployed retrain)",
        description="`add FILE...` reads each file as ingest will (a malformed row or other columns: refused, nothing "
        "added), copies it into the folder data.source names (or its glob's folder), `dvc add`s it and emits the "
        "Prefect event trainflow.data.added, which `trainflow deploy`'s deployment retrains on. A file byte-identical "
        "to one already there is not added and starts nothing. `watch INBOX` adds each file that lands in INBOX and "
        "moves it to INBOX/added/ (or INBOX/rejected/ with a .why.txt).",
    )
    dsub = data.add_subparsers(dest="action", required=True)
    data_add = dsub.add_parser("add", help="add files to data.source and tell the deployment")
    data_add.add_argument("files", nargs="+", type=Path, metavar="FILE")
    data_add.add_argument("--no-event", action="store_true", help="add the files without emitting the Prefect event")
    data_watch = dsub.add_parser("watch", help="add every file that lands in a folder (polls; Ctrl-C stops)")
    data_watch.add_argument("inbox", type=Path, help="the folder files arrive in (outside data/raw/)")
    data_watch.add_argument("--interval", type=float, default=5.0, help="seconds between polls (default 5)")
    data_watch.add_argument("--once", action="store_true", help="handle the files there now, then exit")
    deploy = sub.add_parser(
        "deploy",
        help="serve the pipeline on a cron schedule from a Prefect server (PREFECT_API_URL); runs until Ctrl-C",
    )
    deploy.add_argument("--cron", help="cron expression, e.g. '0 3 * * *' (default: deploy.cron in params.yaml)")
    deploy.add_argument("--name", help="deployment name (default: deploy.name in params.yaml)")
    deploy.add_argument("--timezone", help="IANA time zone of the cron (default: deploy.timezone in params.yaml)")
    return parser
