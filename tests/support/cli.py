"""What the CLI tests (tests/cli) share: the work a command hands on replaced by recorders of the calls, so that each
test runs the command in-process in milliseconds; stand-in modules; a version as the registry lists it."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

CONFIGURED: list[Path] = []  # the roots tracking.configure was called with, under tests/cli/conftest.py's project


def recorder(calls: list[Any], result: Any = None) -> Any:
    def record(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        if isinstance(result, BaseException):
            raise result
        return result

    return record


def fake_module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: Any) -> None:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)


def registry_version(number: int, **more: Any) -> dict[str, Any]:
    return {
        "version": number,
        "aliases": [],
        "metrics": {"accuracy": 0.951219, "n_test": 41.0},  # as the registry's tags give them back: floats
        "data_hash": "0123456789abcdef.dir",
        "run_id": "abcdef0123456789",
        "champion_change": "",
        **more,
    }
