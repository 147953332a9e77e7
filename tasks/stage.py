"""What every stage task does: load params.yaml from the project root and call the stage function."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainflow.core.paths import Paths
from trainflow.params import load_params
from trainflow.stages import run_stage


def run(name: str, root: str) -> dict[str, Any]:
    paths = Paths(Path(root))
    return run_stage(name, load_params(paths.params), paths)
