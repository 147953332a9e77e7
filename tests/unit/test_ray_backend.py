"""tune.backend: ray where Ray is not installed (CI's default tier): a clear error whose advice exists (the extra)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from trainflow.core.errors import UserError
from trainflow.tune import ray_backend

REPO = Path(__file__).resolve().parents[2]


def test_without_ray_the_backend_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(UserError, match=r"pip install -e '\.\[ray\]'.*or set tune.backend: optuna"):
        ray_backend._require_ray()
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("ray[tune]") for req in extras["ray"])  # what the message tells users to install
