"""`trainflow stage` and `trainflow run` with -S: the overrides validated, then written into params.yaml while the
workspace is held (DVC's record of what ran stays true); when the command fails on them, params.yaml is put back, and
if stages had already run and been recorded with them, the error's notes say what to run."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trainflow.cli import run, stage
from trainflow.core.errors import UserError
from trainflow.stages import STAGES

if TYPE_CHECKING:
    from trainflow.core.paths import Paths


def run_with_overrides(args: argparse.Namespace, paths: Paths) -> int:
    """`trainflow stage` or `trainflow run`, with the -S overrides written into params.yaml."""
    from trainflow.core import workspace
    from trainflow.engine import preempt
    from trainflow.params import load_params, write_overrides

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
            if args.overrides and exc.params_in_question and paths.params.read_bytes() != before:  # not kept
                from trainflow.core.io import atomic_path

                with atomic_path(paths.params) as tmp:
                    tmp.write_bytes(before)
                print(f"{paths.params}: put back as it was before -S (the command failed on them)", file=sys.stderr)
                if advice := rebuild_advice(args.overrides, lock_before, locked_stages(paths.root)):
                    exc.add_note(advice)
            raise


def _run(args: argparse.Namespace, paths: Paths) -> int:
    """`trainflow stage` or `trainflow run`, with params.yaml already holding the overrides."""
    if args.command == "stage":
        return stage.command(args, paths)
    return run.command(args, paths)


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
