"""deploy/team/compose.yaml (not run here: no images can be pulled) sets the team's servers up as the slow tier's team
tests do (tests/support/team.py's names): the same databases, bucket, artifact and DVC locations, MLflow in proxied
mode with the trainflow-auth app and the same default permission, and every secret from the environment file."""

from __future__ import annotations

import configparser
import re

import yaml
from support.projects import REPO
from support.team import ARTIFACTS, AUTH_APP, DATABASES, DEFAULT_PERMISSION, DVC_REMOTE

TEAM = REPO / "deploy/team"


def test_the_compose_file_starts_the_servers_as_the_tests_do() -> None:
    compose = yaml.safe_load((TEAM / "compose.yaml").read_text())
    services = compose["services"]
    mlflow = services["mlflow"]["command"]
    assert mlflow[:2] == ["mlflow", "server"]
    flags = dict(arg.removeprefix("--").partition("=")[::2] for arg in mlflow[2:])
    assert flags["artifacts-destination"] == ARTIFACTS
    assert "serve-artifacts" in flags  # proxied: the clients hold no bucket credentials
    assert flags["app-name"] == AUTH_APP
    assert re.fullmatch(r"postgresql\+psycopg2://\w+@postgres/" + DATABASES[0], flags["backend-store-uri"])
    assert "AWS_ACCESS_KEY_ID" in services["mlflow"]["environment"]
    prefect = services["prefect"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    assert prefect.startswith("postgresql+asyncpg://") and prefect.endswith(f"/{DATABASES[1]}")
    made = re.findall(r"CREATE DATABASE (\w+);", (TEAM / "init-databases.sql").read_text())
    assert made == list(DATABASES)
    assert f"mc mb --ignore-existing team/{ARTIFACTS.split('/')[2]}" in services["bucket"]["entrypoint"]
    assert DVC_REMOTE.startswith(f"s3://{ARTIFACTS.split('/')[2]}/")  # the DVC remote in the same bucket (docs)


def test_the_access_control_settings_are_the_tests_and_no_secret_is_in_a_file_git_tracks() -> None:
    auth = configparser.ConfigParser()
    auth.read(TEAM / "basic_auth.ini")
    assert auth["mlflow"]["default_permission"] == DEFAULT_PERMISSION
    text = (TEAM / "compose.yaml").read_text()
    secrets = re.findall(r"(?:PASSWORD|SECRET\w*|ACCESS_KEY_ID): (.+)", text)
    assert secrets and all(value.startswith("${") for value in secrets), secrets
    example = dict(line.split("=", 1) for line in (TEAM / "example.env").read_text().splitlines() if "=" in line)
    assert example and not any(example.values())  # the template holds names, never values
    assert "/deploy/team/.env" in (REPO / ".gitignore").read_text()
