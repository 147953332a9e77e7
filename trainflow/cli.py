"""`trainflow` command line. Exit codes: 0 ok, 2 invalid params or data (the message names what to fix), 75 training
preempted (a signal or train.max_time: checkpointed, a rerun resumes), 1 other."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trainflow.core.errors import Preempted, ServiceError, UserError
from trainflow.stages import STAGES

if TYPE_CHECKING:
    from trainflow.core.paths import Paths

# Quiet, offline-safe defaults for the services we drive; any of them can be overridden from the environment.
ENV_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "DO_NOT_TRACK": "1",
}


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
    parser = argparse.ArgumentParser(prog="trainflow", description=__doc__)
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


SIGPIPE_EXIT = 141  # 128 + SIGPIPE: what a shell shows for a program stopped by a closed pipe


def main(argv: Sequence[str] | None = None) -> int:
    """Every command; a reader that stops early (`trainflow models list | head -1`) ends it quietly, exit 141."""
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # a closed pipe shows here, not as a traceback at the interpreter's exit
    except BrokenPipeError:
        # Python ignores SIGPIPE, so a write to a closed pipe raises. Point stdout at /dev/null, or the interpreter's
        # own flush at exit fails on what is still buffered and prints "Exception ignored ... BrokenPipeError".
        with contextlib.suppress(OSError, ValueError):  # ValueError: stdout replaced by one without a descriptor
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)  # stdout's descriptor is a copy of it now
        return SIGPIPE_EXIT


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    try:
        with _stage_watch(args, program=argv is None), _run_signals(args, program=argv is None):
            return _dispatch(args)
    except Preempted as exc:  # not an error: the checkpoint is written, a rerun resumes
        print(f"preempted: {exc}", file=sys.stderr)
        return exc.exit_code
    except (UserError, ServiceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        for note in getattr(exc, "__notes__", ()):  # what to do next, added on the way out (see _dispatch)
            print(note, file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:  # in `trainflow run`, any of its stop signals (flows/interrupts.py: Interrupted)
        message = getattr(exc, "message", "interrupted; finished outputs are intact, rerun to continue")
        code = int(getattr(exc, "exit_code", 130))
        if argv is None and hasattr(exc, "exit_code"):
            # A stopped `trainflow run` is done: its outputs are written and renamed, Prefect's services flushed
            # (interrupts.handled). What is left would free the abandoned work (the traceback's frames, then the
            # interpreter's teardown) and run its finalizers: a half-made progress callback's __del__ once printed a
            # traceback after the one line.
            from flows.interrupts import end_now

            end_now(code, message)
        print(message, file=sys.stderr)
        return code
    except BrokenPipeError:
        raise  # the reader went away: main() ends quietly
    except Exception:  # noqa: BLE001 - last-resort handler: show the traceback, exit 1
        traceback.print_exc()
        return 1


def _stage_watch(args: argparse.Namespace, program: bool) -> contextlib.AbstractContextManager[object]:
    """`trainflow stage train`: its preemption signals caught from here, before anything heavy is imported
    (train.preempt_signals' default until the stage reads params.yaml; trainflow.engine.preempt). Until the workspace
    is held nothing is written, so one ends the process at once, exit 75; under torchrun the ranks stop together, at
    the stage's first check. `program`: this process is the command (not a caller of `main`), so the handlers stay to
    its end."""
    if args.command != "stage" or args.name != "train":
        return contextlib.nullcontext()
    from trainflow.engine.preempt import DEFAULT_SIGNALS, Watch

    watch = Watch(DEFAULT_SIGNALS, held=program)
    watch.nothing_written = "RANK" not in os.environ
    return watch


def _run_signals(args: argparse.Namespace, program: bool) -> contextlib.AbstractContextManager[object]:
    """`trainflow run`: SIGINT, SIGTERM and SIGUSR1 end it at any moment within seconds, exit 75 or 130, one line
    (flows/interrupts.py); in training the train stage's own Watch catches them first. `program`: this process is the
    command, so after a finished run they end it at once, exit 0."""
    if args.command != "run":
        return contextlib.nullcontext()
    from flows.interrupts import handled

    return handled(held=program)


def _dispatch(args: argparse.Namespace) -> int:
    from trainflow.core.paths import Paths
    from trainflow.params import load_params, schema, write_overrides

    paths = Paths.default()
    if args.command == "params":
        params = load_params(paths.params, args.overrides)  # validates the overrides too
        if args.action == "schema":
            print(json.dumps(schema(), indent=2))
        else:
            print(f"{paths.params}: ok" + (" with the -S overrides" if args.overrides else ""), file=sys.stderr)
            print(json.dumps(params.model_dump(mode="json"), indent=2))  # stdout is JSON alone, for jq and scripts
        return 0
    if args.command == "predict":
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
    if args.command == "models":
        return _models(args, paths)
    if args.command == "tune":
        return _tune(args, paths)
    if args.command == "verify":
        return _verify(args, paths)
    if args.command == "data":
        return _data(args, paths)
    if args.command == "deploy":
        from flows.deploy import serve

        return serve(paths, cron=args.cron, name=args.name, timezone=args.timezone)
    from trainflow.core import workspace
    from trainflow.engine import preempt

    load_params(paths.params, args.overrides)  # every problem is reported before anything is written
    # One run per workspace; the lock covers the -S write too, so a waiting run never changes the params under one
    # that is running.
    command = "trainflow run" if args.command == "run" else f"trainflow stage {args.name}"
    with workspace.hold(paths.root, command):
        if (watch := preempt.current()) is not None:
            watch.nothing_written = False  # from here, a signal is acted on where the stage can stop cleanly
        before = paths.params.read_bytes()
        lock_before = locked_stages(paths.root) if args.overrides else {}
        write_overrides(paths.params, args.overrides)  # DVC's record stays true: the file holds what ran
        try:
            return _run(args, paths)
        except UserError as exc:
            if args.overrides and paths.params.read_bytes() != before:  # the overrides led to the error: not kept
                from trainflow.core.io import atomic_path

                with atomic_path(paths.params) as tmp:
                    tmp.write_bytes(before)
                print(f"{paths.params}: put back as it was before -S (the command failed on them)", file=sys.stderr)
                if advice := rebuild_advice(args.overrides, lock_before, locked_stages(paths.root)):
                    exc.add_note(advice)
            raise


def locked_stages(root: Path) -> dict[str, object]:
    """dvc.lock's record of each stage (what ran, with which params, giving which outputs); {} without one."""
    import yaml

    try:
        lock = yaml.safe_load((root / "dvc.lock").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    stages = lock.get("stages") if isinstance(lock, dict) else None
    return stages if isinstance(stages, dict) else {}


def rebuild_advice(overrides: Sequence[str], before: dict[str, object], after: dict[str, object]) -> str | None:
    """What to run after a `trainflow run -S` that failed once some stages had run (and been recorded) with the -S
    params: params.yaml is put back, so their outputs and those of the stages after them come from two sets of params
    (new splits beside the old model). None when no stage's record changed."""
    ran = [s for s in STAGES if s in after and after[s] != before.get(s)]
    if not ran:
        return None
    records = [after[stage] for stage in ran]
    outs = [str(o["path"]) for r in records if isinstance(r, dict) for o in r.get("outs", []) if "path" in o]
    later = STAGES[STAGES.index(ran[-1]) + 1 :]
    said = _and(ran)
    mixed = (
        f", while those of {_and(later)} are still from the params before: they do not fit together (e.g. new "
        "splits beside the old model, which `trainflow stage evaluate` can fail on)"
        if later
        else ", not from params.yaml as it is now"
    )
    sets = " ".join(f"-S {shlex.quote(o)}" for o in overrides)
    return (
        f"Before the failure, {said} ran with the -S params and DVC recorded them: "
        f"{', '.join(outs) or 'their outputs'} now come from those params{mixed}. To rebuild every output from "
        f"params.yaml as it is now, run `trainflow run` (or `dvc repro`): it reruns {said} and whatever depends on "
        f"them. To keep the -S params instead, fix what failed, then run `trainflow run {sets}`."
    )


def _and(names: Sequence[str]) -> str:
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)


def _tune(args: argparse.Namespace, paths: Paths) -> int:
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


def _models(args: argparse.Namespace, paths: Paths) -> int:
    from trainflow import tracking
    from trainflow.params import load_params
    from trainflow.registry import registry

    tracking.configure(paths.root)
    if args.action == "show":
        return _show_card(args)
    if args.action == "list" and args.all:
        if args.name:
            raise UserError("models list: --all lists every registered model; give --name or --all, not both")
        print(names_table(registry.registered_models()))
        return 0
    name = args.name or load_params(paths.params).register.model_name
    if args.action == "promote":
        result = registry.promote(name, args.version, args.reason)
    elif args.action == "rollback":
        result = registry.rollback(name, args.reason)
    else:
        print(models_table(name, registry.list_versions(name)))
        return 0
    print(f"{name}: champion is now version {result['champion']} (was {result['previous_champion']})")
    return 0


def _show_card(args: argparse.Namespace) -> int:
    """`trainflow models show NAME@ALIAS`: the version's model card, from its MLflow run (card/card.md)."""
    import tempfile

    import mlflow.artifacts
    from mlflow.exceptions import MlflowException

    from trainflow.registry.verify import version_of

    version = version_of(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            got = Path(mlflow.artifacts.download_artifacts(run_id=version.run_id, artifact_path="card", dst_path=tmp))
        except (MlflowException, OSError):
            got = Path(tmp) / "none"
        if not (got / "card.md").is_file():
            raise UserError(f"{args.model}: version {version.version} has no model card (registered before cards); "
                            "`trainflow stage register` writes one for the run it registers")  # fmt: skip
        print((got / "card.md").read_text(encoding="utf-8"))
        if args.html is not None:
            shutil.copyfile(got / "card.html", args.html)
            print(f"models show: the HTML card is in {args.html}", file=sys.stderr)
    return 0


def _data(args: argparse.Namespace, paths: Paths) -> int:
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


def _verify(args: argparse.Namespace, paths: Paths) -> int:
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


def models_table(name: str, versions: list[dict[str, object]]) -> str:
    """`trainflow models list`: one row per version, the test metrics as columns, then what it predicts (target and
    task, from the version's tags) and on which data. The baselines' metrics (trainflow.baselines) are left to the
    model card: a column each would bury the versions' own."""
    from trainflow.baselines import PREFIX

    metrics = sorted({m for v in versions for m in v["metrics"] if not m.startswith(PREFIX)})  # type: ignore[attr-defined]
    header = ["version", "aliases", *metrics, "target", "task", "data_hash", "run", "became champion"]
    rows = []
    for v in versions:
        got: dict[str, float] = v["metrics"]  # type: ignore[assignment]
        cells = [str(v["version"]), ",".join(v["aliases"]) or "-"]  # type: ignore[arg-type]
        cells += [metric_cell(m, got[m]) if m in got else "-" for m in metrics]
        cells += [str(v.get("target") or "-"), str(v.get("task") or "-")]
        cells += [str(v["data_hash"])[:12] or "-", str(v["run_id"])[:12], str(v["champion_change"]) or "-"]
        rows.append(cells)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [f"{name}: {len(versions)} version{'s' if len(versions) != 1 else ''}"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    return "\n".join(lines)


def names_table(models: list[dict[str, object]]) -> str:
    """`trainflow models list --all`: one row per registered model name."""
    header = ["name", "versions", "newest", "champion", "target", "task"]
    rows = [[str(m[k]) if m[k] not in (None, "") else "-" for k in header] for m in models]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [f"{len(models)} registered model{'s' if len(models) != 1 else ''}"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    return "\n".join(lines)


def metric_cell(name: str, value: float) -> str:
    """A count (n_test: the registry keeps every metric as a float) as an integer, any other metric to 4 decimals."""
    if name.startswith("n_") and float(value).is_integer():
        return str(int(value))
    return f"{value:.4f}"


def _run(args: argparse.Namespace, paths: Paths) -> int:
    """`trainflow stage` or `trainflow run`, with params.yaml already holding the overrides."""
    from trainflow.params import load_params

    if args.command == "stage":
        from trainflow.stages import run_stage

        if args.accept_schema and args.name != "ingest":
            raise UserError("--accept-schema applies to `trainflow stage ingest` only")
        options = {"accept_schema": True} if args.accept_schema else {}
        result = run_stage(args.name, load_params(paths.params), paths, **options)
        if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 alone speaks
            print(json.dumps({args.name: result}, indent=2, default=str))
        return 0
    from trainflow.stages.report import summary

    if prefect_api_url() is None:
        from tasks import dvc

        if not dvc.changed_stages(paths.root):
            # Nothing to run: answer quickly, without starting Prefect's local server, which would take most of the
            # time (BENCHMARKS.md, "A `trainflow run` with nothing to do"). On a Prefect server the flow runs anyway,
            # so every run is recorded there.
            push_unchanged(paths)
            print(summary(paths, {stage: {"skipped": True} for stage in STAGES}))
            return 0
        from flows.local_server import start_temporary_server

        start_temporary_server()  # Prefect's local mode, with a server that cannot outlive this run
    from flows.training_pipeline import training_pipeline
    from tasks.train import PREEMPTED_STATE

    state = training_pipeline(root=str(paths.root), caller_reports_errors=True, return_state=True)
    if state.name == PREEMPTED_STATE:  # checkpointed, resumable
        raise Preempted(state.message or "train: preempted")
    results = state.result()  # a stage's error is raised here, as the flow raised it
    assert isinstance(results, dict)
    print(summary(paths, results))
    return 0


def prefect_api_url() -> str | None:
    """PREFECT_API_URL from the environment or the active Prefect profile, read without importing Prefect (slow)."""
    if url := os.environ.get("PREFECT_API_URL"):
        return url
    import tomllib

    home = Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
    try:
        profiles = tomllib.loads((home / "profiles.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return None
    active = os.environ.get("PREFECT_PROFILE") or profiles.get("active", "local")
    url = profiles.get("profiles", {}).get(active, {}).get("PREFECT_API_URL")
    return str(url) if url else None


def push_unchanged(paths: Paths) -> None:
    """deploy.push for a run with nothing to do: the outputs may still be missing from the remote (a push that
    failed last time), and pushing what is there costs little."""
    from tasks import dvc
    from trainflow.params import load_params

    if not load_params(paths.params).deploy.push:
        return
    remote = dvc.default_remote(paths.root)
    if remote is None:
        return
    try:
        sent = dvc.push(paths.root, remote)
    except UserError:
        raise  # a full remote (DiskFullError) says so itself
    except Exception as exc:  # noqa: BLE001 - any failure of the remote: say which, and that nothing is lost
        raise ServiceError(
            f"push to DVC remote {remote!r} failed ({type(exc).__name__}: {exc}); the outputs are intact here: "
            "rerun `trainflow run` (or `dvc push`) once the remote answers"
        ) from exc
    print(f"[trainflow] push: {sent} file(s) sent to DVC remote {remote!r}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
