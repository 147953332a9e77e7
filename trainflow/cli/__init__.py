"""The `trainflow` command: main() parses the command line (parser.py: every command, option and help text), hands it
to the command's module (stage, run, params, predict, models, verify, tune, data, deploy; overrides.py writes the -S
overrides of stage and run into params.yaml) and turns how it ended into one line and its exit code: 0 ok, 2 invalid
params or data (the message names what to fix), 75 training preempted (a signal or train.max_time: checkpointed, a
rerun resumes), 130 interrupted, 141 a reader that stopped early, 1 other. The command modules import what does the
work inside their functions, so `trainflow --help` stays instant."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from collections.abc import Sequence

from trainflow.cli import data, deploy, models, overrides, params, predict, tune, verify
from trainflow.cli.parser import build_parser
from trainflow.core.errors import Preempted, ServiceError, UserError

__all__ = ["build_parser", "main"]

# Quiet, offline-safe defaults for the services we drive; any of them can be overridden from the environment.
ENV_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "DO_NOT_TRACK": "1",
}


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
        for note in getattr(exc, "__notes__", ()):  # what to do next, added on the way out (overrides.py)
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

    paths = Paths.default()
    commands = {"params": params, "predict": predict, "models": models, "tune": tune, "verify": verify, "data": data,
                "deploy": deploy}  # fmt: skip
    if args.command in commands:
        result: int = commands[args.command].command(args, paths)
        return result
    return overrides.run_with_overrides(args, paths)  # `trainflow stage` and `trainflow run`
