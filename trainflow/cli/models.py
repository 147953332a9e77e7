"""`trainflow models`: the registered model's versions (`list`, as a table), `promote` and `rollback` of the champion
alias, and `show`, a version's model card."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from trainflow.core.errors import UserError

if TYPE_CHECKING:
    from trainflow.core.paths import Paths


def command(args: argparse.Namespace, paths: Paths) -> int:
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
