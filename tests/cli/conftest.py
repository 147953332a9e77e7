"""The CLI tests' fixture: a project to run commands in."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cli import CONFIGURED

from trainflow import tracking
from trainflow.core.paths import Paths
from trainflow.params import write_overrides


@pytest.fixture
def project(params_file: Path, monkeypatch: pytest.MonkeyPatch) -> Paths:
    """The committed params.yaml with register.model_name set, as the cwd; the MLflow setup recorded, not done."""
    write_overrides(params_file, ["register.model_name=penguins"])
    monkeypatch.chdir(params_file.parent)
    monkeypatch.setattr(tracking, "configure", lambda root: CONFIGURED.append(root))
    CONFIGURED.clear()
    return Paths(params_file.parent)
