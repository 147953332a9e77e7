"""`trainflow deploy`: the cron, name and time zone given (None by default) handed to flows/deploy.py's serve, whose
exit code the command returns."""

from __future__ import annotations

from typing import Any

import pytest
from support.cli import fake_module, recorder

from trainflow import cli
from trainflow.core.paths import Paths


def test_deploy_serves_with_the_cron_name_and_timezone_given_none_by_default(
    project: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Any] = []
    fake_module(monkeypatch, "flows.deploy", serve=recorder(calls, 0))
    assert cli.main(["deploy"]) == 0
    fake_module(monkeypatch, "flows.deploy", serve=recorder(calls, 3))
    assert cli.main(["deploy", "--cron", "0 4 * * *", "--name", "n", "--timezone", "Europe/Oslo"]) == 3
    assert calls == [
        ((Paths(project.root),), {"cron": None, "name": None, "timezone": None}),
        ((Paths(project.root),), {"cron": "0 4 * * *", "name": "n", "timezone": "Europe/Oslo"}),
    ]
