"""The pipeline run in this process: its stages one after another, and the `trainflow` command in a project."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainflow import cli
from trainflow.core.paths import Paths
from trainflow.params import load_params
from trainflow.stages import STAGES, run_stage


def run_all(root: Path, stages: tuple[str, ...] = STAGES) -> dict[str, dict]:
    paths = Paths(root)
    return {s: run_stage(s, load_params(paths.params), paths) for s in stages}


def trainflow(root: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.chdir(root)
    return cli.main(list(args))
