"""`trainflow models list --all` names every registered model, and a --name the registry lacks is answered with the
names it holds: a user who registered under `register.model_name: auto` (named after the data) can find the name."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trainflow import cli, tracking
from trainflow.core.errors import UserError
from trainflow.registry import registry


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory, _empty_mlflow_store: Path) -> Path:
    """A store holding three names, made by hand so the expected table is known without trainflow's register: "b" has
    3 versions and champion 2, "a" one version and no champion, "c" none. Made once (from conftest's migrated empty
    store), copied for each test."""
    from mlflow.tracking import MlflowClient

    db = tmp_path_factory.mktemp("registered") / "mlflow.db"
    shutil.copyfile(_empty_mlflow_store, db)
    client = MlflowClient(f"sqlite:///{db}")
    source = (db.parent / "model").as_uri()
    for name, versions, champion, kind in (
        ("b", 3, 2, ("y", "regression")),
        ("a", 1, None, None),
        ("c", 0, None, None),
    ):
        client.create_registered_model(name)
        for _ in range(versions):
            client.create_model_version(name, source)
        if champion is not None:
            client.set_registered_model_alias(name, "champion", str(champion))
        if kind is not None:
            client.set_registered_model_tag(name, "target", kind[0])
            client.set_registered_model_tag(name, "task", kind[1])
    return db


@pytest.fixture
def store(registered: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The project's own store (tracking.configure's default: mlflow.db at the root), a copy of `registered`."""
    shutil.copyfile(registered, tmp_path / "mlflow.db")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracking.configure(tmp_path)
    return tmp_path


def test_models_list_all_names_every_registered_model(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert registry.registered_models() == [
        {"name": "a", "versions": 1, "newest": 1, "champion": None, "target": "", "task": ""},
        {"name": "b", "versions": 3, "newest": 3, "champion": 2, "target": "y", "task": "regression"},
        {"name": "c", "versions": 0, "newest": None, "champion": None, "target": "", "task": ""},
    ]
    assert cli.main(["models", "list", "--all"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "3 registered models",
        "name  versions  newest  champion  target  task",
        "a     1         1       -         -       -",
        "b     3         3       2         y       regression",
        "c     0         -       -         -       -",
    ]


def test_a_name_the_registry_lacks_is_answered_with_the_names_it_holds(store: Path) -> None:
    with pytest.raises(UserError) as missing:
        registry.list_versions("nosuch")
    assert f"no registered model 'nosuch' in the tracking store sqlite:///{store}" in str(missing.value)
    assert "(it holds 'a', 'b', 'c'); register one first" in str(missing.value)
    assert "`trainflow models list --all` lists them" in str(missing.value)


def test_list_all_and_a_name_are_not_both_given(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["models", "list", "--all", "--name", "a"]) == 2
    assert "give --name or --all, not both" in capsys.readouterr().err
