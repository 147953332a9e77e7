"""Canonical artifact paths, relative to the project root. dvc.yaml, the CLI, the tasks and the tests use these."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PARAMS_FILE = "params.yaml"
SPLITS = ("train", "val", "test")  # data/splits/<name>.parquet, or a streamed split's numbers in rows.npy (0, 1, 2)


def restore(out: str, stage: str) -> str:
    """How to repair a damaged output of `stage`: the copy DVC committed, or the stage run again."""
    return (
        f"restore the version DVC committed with `dvc checkout --force {out}`, or write it again with "
        f"`trainflow stage {stage}`"
    )


def find_root(start: Path | None = None) -> Path:
    """The project root: $TRAINFLOW_ROOT, else the nearest directory upwards holding params.yaml, else the cwd."""
    if env := os.environ.get("TRAINFLOW_ROOT"):
        return Path(env).resolve()
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / PARAMS_FILE).is_file():
            return d
    return here


@dataclass(frozen=True)
class Paths:
    root: Path

    @classmethod
    def default(cls) -> Paths:
        return cls(find_root())

    @property
    def params(self) -> Path:
        return self.root / PARAMS_FILE

    @property
    def processed(self) -> Path:
        return self.root / "data" / "processed"

    @property
    def table(self) -> Path:
        return self.processed / "table.parquet"

    @property
    def schema(self) -> Path:
        return self.processed / "schema.json"

    @property
    def splits(self) -> Path:
        return self.root / "data" / "splits"

    def split_file(self, name: str) -> Path:
        """The file of its own that a split held in memory is written to (a streamed one is not; read a split of either
        kind with trainflow.data.stream.Split.stored)."""
        return self.splits / f"{name}.parquet"

    def read_table(self) -> Any:
        """data/processed/table.parquet as a DataFrame; a damaged file is an error saying how to restore it."""
        from trainflow.core.io import read_parquet

        return read_parquet(self.table, restore("data/processed", "ingest"))

    @property
    def split_schema(self) -> Path:
        """The schema travels with the splits, so later stages depend on data/splits alone."""
        return self.splits / "schema.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "models" / "checkpoints"

    @property
    def final(self) -> Path:
        return self.root / "models" / "final"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def metrics(self) -> Path:
        return self.reports / "metrics.json"

    @property
    def per_class(self) -> Path:
        """evaluate's precision, recall, F1 and support of each class on the test split (header only: regression)."""
        return self.reports / "per_class.csv"

    @property
    def train_run(self) -> Path:
        return self.reports / "train_run.json"

    @property
    def plots(self) -> Path:
        return self.reports / "plots"

    @property
    def profile(self) -> Path:
        """train.profile's traces (Chrome trace JSON, one per rank) of the last run that profiled. Not a DVC output
        (a trace differs on every run) and not in git (/reports/)."""
        return self.reports / "profile"

    @property
    def tensorboard(self) -> Path:
        """tracking.tensorboard: event files, a subfolder per run (tune/<study>/trial_NNNN/... for sweep trials).
        Not a DVC output (runs accumulate here; DVC would delete them before each run) and not in git (/reports/)."""
        return self.reports / "tensorboard"

    @property
    def test_plots(self) -> Path:
        """evaluate's plots, replaced as one folder: confusion matrix or predicted vs actual."""
        return self.plots / "test"

    @property
    def registration(self) -> Path:
        return self.reports / "registration.json"
