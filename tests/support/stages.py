"""The pipeline run in this process: its stages one after another, and the `trainflow` command in a project."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainflow import cli
from trainflow.core.paths import Paths
from trainflow.engine.fingerprint import fingerprint
from trainflow.params import PipelineParams, load_params
from trainflow.stages import STAGES, run_stage
from trainflow.stages.train import Training


def run_all(root: Path, stages: tuple[str, ...] = STAGES) -> dict[str, dict]:
    paths = Paths(root)
    return {s: run_stage(s, load_params(paths.params), paths) for s in stages}


def trainflow(root: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.chdir(root)
    return cli.main(list(args))


def training(params: PipelineParams) -> Training:
    """The sections a training reads, picked out of the whole params as the stage dispatcher picks them."""
    return Training(**params.sections(Training.names()))


def fingerprint_of(params: PipelineParams, data: str, root: Path) -> str:
    """The resume fingerprint of `params` as written (the train stage resolves train.shuffle first)."""
    return fingerprint(
        seed=params.seed, model=params.model, features=params.features, train=params.train, data=data, root=root
    )
