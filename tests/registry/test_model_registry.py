"""The model registry (trainflow.registry.registry) on a SQLite store in tmp_path: the registration dict, the version
tags and the aliases after each decision (first version, worse, better, lower-is-better, a champion re-scored or not),
reruns and interrupted attempts, the kind of model a name holds, promote and rollback, `models list`, and what
a registry call that got no answer says. Each value is written out by hand from the inputs."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.projects import model_run

from trainflow import tracking
from trainflow.artifacts import manifest
from trainflow.core.errors import ServiceError, UserError
from trainflow.params import RegisterParams
from trainflow.registry import gate, registry


def test_a_failed_registry_call_says_what_where_and_that_nothing_changed(tmp_path: Path) -> None:
    uri = tracking.configure(tmp_path)
    error = registry.registry_failed("looking up x", OSError("refused"), "Try again")
    assert isinstance(error, ServiceError)
    assert str(error) == (
        f"looking up x: the MLflow tracking store at {uri} did not answer (OSError: refused). That is no answer "
        "about what the registry holds, so nothing was decided and the champion alias is as it was. Try again."
    )


class Store:
    """This test's registry (a SQLite store in tmp_path) and registrations of stand-in models into model "m"."""

    def __init__(self, root: Path) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = tracking.configure(root)
        self.root = root
        self.client = MlflowClient()
        self.experiment = tracking.ensure_experiment("trainflow", root)

    def run(self) -> str:
        return model_run(self.client, self.experiment, self.root / "models")

    def register(
        self,
        metrics: dict[str, float],
        tags: dict[str, str] | None = None,
        run_id: str | None = None,
        params: RegisterParams | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        run_id = run_id or self.run()
        kwargs = {"test_hash": "h", "rescore": unexpected_rescore, **kwargs}
        params = params or RegisterParams(model_name="m", decide="point")
        return registry.register(f"runs:/{run_id}/model", run_id, params, metrics, tags or {}, **kwargs)

    def aliases(self) -> dict[str, str]:
        return {a: str(v) for a, v in self.client.get_registered_model("m").aliases.items()}

    def model_tags(self) -> dict[str, str]:
        return dict(self.client.get_registered_model("m").tags)

    def version_tags(self, version: int) -> dict[str, str]:
        """The version's tags but the manifest of its files (`test_the_first_registration_...` checks that)."""
        tags = self.client.get_model_version("m", str(version)).tags
        return {k: v for k, v in tags.items() if not k.startswith(manifest.HEAD_TAG)}


def unexpected_rescore(uri: str) -> Any:
    raise AssertionError(f"{uri} re-scored, but the test split is the same")


CHANGE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00 (.*)", re.S)


def change(tags: dict[str, str]) -> str:
    """A champion_change tag without its time stamp (checked to be an ISO time in UTC to the second)."""
    match = CHANGE.fullmatch(tags.pop(registry.CHANGE_TAG))
    assert match is not None
    return match.group(1)


def test_the_first_registration_is_champion_with_every_tag_and_the_kind_of_the_name(tmp_path: Path) -> None:
    store = Store(tmp_path)
    run_id = store.run()
    lineage = {"target": "species", "task": "classification", "data_hash": "d1"}
    result = store.register({"accuracy": 0.75, "n_test": 40}, lineage, run_id=run_id)
    assert result == {
        "model_name": "m",
        "version": 1,
        "model_uri": "models:/m/1",
        "gate_metric": "accuracy",
        "value": 0.75,
        "previous_champion": None,
        "previous_value": None,
        "previous_metrics": None,
        "rescored": False,
        "champion": True,
        "champion_version": 1,
        "decision": "version 1 is the first champion of m",
        "decide": "point",
        "comparison": None,
        "test_rows": None,
        "tags": {**lineage, "test_data_hash": "h"},
    }
    tags = store.version_tags(1)
    assert change(tags) == "register: version 1 is the first champion of m"
    assert tags == {
        **lineage,
        "test_data_hash": "h",
        "metric.accuracy": "0.75",
        "metric.n_test": "40.0",
        "registry_decision": "version 1 is the first champion of m",
        "decided_against": "none",
    }
    assert store.aliases() == {"champion": "1", "challenger": "1"}
    assert store.model_tags() == {"target": "species", "task": "classification", "champion_history": "[1]"}
    # The manifest of the version's files (the stand-in model holds an MLmodel alone), in the registry.
    every = store.client.get_model_version("m", "1").tags
    assert manifest.recorded(every, "version 1") == {"MLmodel": hashlib.sha256(b"flavors: {}\n").hexdigest()}
    assert store.client.get_model_version("m", "1").run_id == run_id


def test_a_worse_version_is_challenger_only_and_the_decision_says_by_how_much(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.register({"accuracy": 0.75})
    params = RegisterParams(model_name="m", decide="point", min_improvement=0.05)
    result = store.register({"accuracy": 0.79}, params=params)
    decision = (
        "accuracy 0.79 does not beat champion version 1's 0.75 (same test split) by more than min_improvement 0.05: "
        "stays version 1"
    )
    assert result == {
        "model_name": "m",
        "version": 2,
        "model_uri": "models:/m/2",
        "gate_metric": "accuracy",
        "value": 0.79,
        "previous_champion": 1,
        "previous_value": 0.75,
        "previous_metrics": {"accuracy": 0.75},
        "rescored": False,
        "champion": False,
        "champion_version": 1,
        "decision": decision,
        "decide": "point",
        "comparison": None,
        "test_rows": None,
        "tags": {"test_data_hash": "h"},
    }
    assert store.aliases() == {"champion": "1", "challenger": "2"}
    assert store.version_tags(2) == {
        "test_data_hash": "h",
        "metric.accuracy": "0.79",
        "registry_decision": decision,
        "decided_against": "1",
    }
    assert store.model_tags() == {"champion_history": "[1]"}


def test_a_better_version_takes_the_champion_and_joins_the_history(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.register({"accuracy": 0.75})
    result = store.register({"accuracy": 0.8125})
    decision = (
        "accuracy 0.8125 beats champion version 1's 0.75 (same test split) by more than min_improvement 0: "
        "champion moves to version 2"
    )
    assert (result["champion"], result["champion_version"], result["previous_champion"]) == (True, 2, 1)
    assert result["decision"] == decision
    tags = store.version_tags(2)
    assert change(tags) == f"register: {decision}"
    assert store.aliases() == {"champion": "2", "challenger": "2"}
    assert store.model_tags() == {"champion_history": "[1, 2]"}


def test_a_lower_is_better_gate_promotes_the_lower_value(tmp_path: Path) -> None:
    store = Store(tmp_path)
    params = RegisterParams(model_name="m", decide="point", gate_metric="log_loss")
    store.register({"accuracy": 0.9, "log_loss": 0.5}, params=params)
    result = store.register({"accuracy": 0.8, "log_loss": 0.25}, params=params)
    assert result["champion"] is True and result["gate_metric"] == "log_loss" and result["value"] == 0.25
    assert result["decision"] == (
        "log_loss 0.25 beats champion version 1's 0.5 (same test split) by more than min_improvement 0: "
        "champion moves to version 2"
    )


def test_a_champion_measured_on_another_split_is_rescored_and_decided_on_that(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.register({"accuracy": 0.95}, test_hash="old")
    asked: list[str] = []

    def rescore(uri: str) -> Any:
        asked.append(uri)
        # its rows, as the paired rule would need them (a point decision only counts them)
        return {"accuracy": 0.5, "n_test": 10.0}, gate.Scored(np.zeros(10), np.zeros((10, 2)))

    result = store.register({"accuracy": 0.6}, test_hash="new", rescore=rescore)
    assert asked == ["models:/m/1"]
    assert result["rescored"] is True
    assert result["previous_metrics"] == {"accuracy": 0.5, "n_test": 10.0} and result["previous_value"] == 0.5
    assert result["decision"] == (
        "accuracy 0.6 beats champion version 1's 0.5 (re-scored on the new test split) by more than min_improvement "
        "0: champion moves to version 2"
    )
    assert result["tags"] == {"test_data_hash": "new"}
    assert store.aliases() == {"champion": "2", "challenger": "2"}


def test_a_champion_tagged_without_the_gate_metric_is_rescored_even_on_the_same_split(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.register({"accuracy": 0.95})
    params = RegisterParams(model_name="m", decide="point", gate_metric="f1_macro")

    def rescore(uri: str) -> Any:
        return {"f1_macro": 0.25}, None  # scored from its tags' split: no rows

    result = store.register({"accuracy": 0.6, "f1_macro": 0.5}, params=params, rescore=rescore)
    assert result["rescored"] is False and result["previous_metrics"] == {"f1_macro": 0.25}
    assert result["decision"].startswith("f1_macro 0.5 beats champion version 1's 0.25 (same test split)")


def test_a_champion_without_the_gate_metric_stays_and_the_decision_says_why(tmp_path: Path) -> None:
    """The decision is recorded on the version and returned, and the champion stays. (register() raised KeyError
    building its result, from previous[gate] of a champion without the gate metric, after it had written the tags.)"""
    store = Store(tmp_path)
    store.register({"accuracy": 0.95}, test_hash="old")
    run_id = store.run()
    result = store.register({"accuracy": 0.99}, run_id=run_id, test_hash="new", rescore=lambda uri: ({"r2": 0.1}, None))
    decision = (
        "champion stays version 1: it has no accuracy on this test data (it predicts something else), so the two are "
        "not compared; to serve version 2 instead, run `trainflow models promote 2`"
    )
    assert result["decision"] == decision
    assert (result["champion"], result["champion_version"], result["previous_champion"]) == (False, 1, 1)
    assert (result["previous_value"], result["previous_metrics"]) == (None, {"r2": 0.1})
    assert store.version_tags(2) == {
        "test_data_hash": "new",
        "metric.accuracy": "0.99",
        "registry_decision": decision,
        "decided_against": "1",
    }
    assert store.aliases() == {"champion": "1", "challenger": "2"}
    again = store.register({"accuracy": 0.99}, run_id=run_id, test_hash="new")
    assert (again["champion"], again["champion_version"]) == (False, 1)
    assert again["decision"] == (
        "already registered as version 2 by an earlier run of register, nothing changed (its decision then: "
        f"{decision})"
    )


def test_a_champion_that_fails_to_rescore_stays_and_says_how_to_promote_anyway(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.register({"accuracy": 0.95}, test_hash="old")

    def rescore(uri: str) -> Any:
        raise KeyError("column x")

    result = store.register({"accuracy": 0.99}, test_hash="new", rescore=rescore)
    decision = (
        "champion stays version 1: it could not be re-scored on the new test split (KeyError: 'column x'); to "
        "promote version 2 anyway, run `trainflow models promote 2 --name m --reason ...` (it keeps the history a "
        "rollback needs)"
    )
    assert (result["champion"], result["rescored"], result["previous_metrics"]) == (False, False, None)
    assert result["decision"] == decision
    assert store.version_tags(2)["registry_decision"] == decision
    assert store.aliases() == {"champion": "1", "challenger": "2"}


def test_a_store_that_stops_answering_while_the_champion_is_re_scored_decides_nothing_and_says_rerun(
    tmp_path: Path,
) -> None:
    """The champion's files cannot be fetched (the store is down): not "the champion stays", but a ServiceError that
    names the store and says to rerun register; no decision tag is written."""
    import mlflow

    store = Store(tmp_path)
    store.register({"accuracy": 0.95}, test_hash="old")

    def down(uri: str) -> Any:
        raise ConnectionError("connection reset")

    with pytest.raises(ServiceError) as exc:
        store.register({"accuracy": 0.99}, test_hash="new", rescore=down)
    assert str(exc.value).endswith(
        f"the MLflow tracking store at {mlflow.get_tracking_uri()} did not answer (ConnectionError: connection "
        "reset). That is no answer about what the registry holds, so nothing was decided and the champion alias is "
        "as it was. Rerun `trainflow stage register` (or the flow) once it answers: the rerun completes this "
        "registration, and a run never registers a second version."
    )
    assert "registry_decision" not in store.version_tags(2)
    assert store.aliases()["champion"] == "1"


def test_a_rerun_of_a_decided_run_registers_nothing_and_reports_the_registry_as_it_is(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.register({"accuracy": 0.75})
    run_id = store.run()
    store.register({"accuracy": 0.5}, run_id=run_id)
    again = store.register({"accuracy": 0.5}, {"target": "y"}, run_id=run_id, test_hash="h2")
    assert again == {
        "model_name": "m",
        "version": 2,
        "model_uri": "models:/m/2",
        "gate_metric": "accuracy",
        "value": 0.5,
        "previous_champion": None,
        "previous_value": None,
        "previous_metrics": None,
        "rescored": False,
        "champion": False,
        "champion_version": 1,
        "decision": "already registered as version 2 by an earlier run of register, nothing changed (its decision "
        "then: accuracy 0.5 does not beat champion version 1's 0.75 (same test split) by more than min_improvement 0:"
        " stays version 1)",
        "decide": None,
        "comparison": None,
        "test_rows": None,
        "tags": {"target": "y", "test_data_hash": "h2"},
    }
    assert len(store.client.search_model_versions("name='m'")) == 2


def test_an_attempt_that_failed_before_deciding_is_completed_on_its_version(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.register({"accuracy": 0.75})
    run_id = store.run()
    source = f"{store.client.get_run(run_id).info.artifact_uri}/model"
    store.client.create_model_version("m", source, run_id=run_id)  # version 2: created, never decided
    result = store.register({"accuracy": 0.9}, {"data_hash": "d"}, run_id=run_id)
    assert (result["version"], result["champion"], result["previous_champion"]) == (2, True, 1)
    tags = store.version_tags(2)
    change(tags)
    assert tags == {
        "data_hash": "d",
        "test_data_hash": "h",
        "metric.accuracy": "0.9",
        "registry_decision": result["decision"],
        "decided_against": "1",
    }
    assert len(store.client.search_model_versions("name='m'")) == 2


def test_an_interrupted_attempt_that_had_set_the_champion_is_recorded_as_such(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.register({"accuracy": 0.75})
    run_id = store.run()
    source = f"{store.client.get_run(run_id).info.artifact_uri}/model"
    store.client.create_model_version("m", source, run_id=run_id)
    store.client.set_registered_model_alias("m", "champion", "2")
    result = store.register({"accuracy": 0.1}, run_id=run_id)
    assert result["decision"] == "version 2 is the champion of m (set by an interrupted attempt)"
    assert (result["champion"], result["champion_version"], result["previous_champion"]) == (True, 2, None)
    assert store.model_tags() == {"champion_history": "[1, 2]"}


def test_the_same_model_from_another_run_is_not_registered_again(tmp_path: Path) -> None:
    store = Store(tmp_path)
    first = store.register({"accuracy": 0.75}, {"model_sha256": "abc", "data_hash": "d1"})
    assert first["version"] == 1
    again = store.register({"accuracy": 0.75}, {"model_sha256": "abc", "data_hash": "d2"}, test_hash="h9")
    assert again["version"] == 1 and again["champion"] is True and again["champion_version"] == 1
    assert again["tags"] == {"model_sha256": "abc", "data_hash": "d1", "test_data_hash": "h9"}
    assert again["decision"].startswith("no new version: run ")
    assert again["decision"].endswith(
        " exported byte for byte the model of version 1, nothing changed (its decision then: version 1 is the first "
        "champion of m)"
    )
    assert len(store.client.search_model_versions("name='m'")) == 1
    other = store.register({"accuracy": 0.5}, {"model_sha256": "def"})
    assert other["version"] == 2


def test_a_name_refuses_a_model_of_another_kind_naming_both(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.register({"accuracy": 0.75}, {"target": "species", "task": "classification"})
    with pytest.raises(UserError) as refused:
        store.register({"r2": 0.5}, {"target": "price", "task": "regression"})
    assert str(refused.value) == (
        "register: 'm' holds models predicting 'species' (classification); this run predicts 'price' (regression). "
        "One registered name holds one kind of model, so that the champion gate compares like with like: register "
        "this one under its own name, -S register.model_name=auto (named after the data) or "
        "-S register.model_name=<name>, then rerun `trainflow stage register`."
    )
    assert len(store.client.search_model_versions("name='m'")) == 1
    same = store.register({"accuracy": 0.5}, {"target": "species", "task": "classification"})
    assert same["version"] == 2


def test_a_name_registered_before_kind_tags_takes_its_kind_from_the_newest_version(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.client.create_registered_model("m")
    for target in ("old", "species"):
        run_id = store.run()
        source = f"{store.client.get_run(run_id).info.artifact_uri}/model"
        store.client.create_model_version("m", source, run_id=run_id, tags={"target": target, "task": "t"})
    registry.check_kind(store.client, "m", {"target": "species", "task": "t"})
    with pytest.raises(UserError, match=r"^register: 'm' holds models predicting 'species' \(t\); this run predicts "
                       r"'old' \(t\)\."):  # fmt: skip
        registry.check_kind(store.client, "m", {"target": "old", "task": "t"})
    registry.check_kind(store.client, "nothing", {"target": "x"})  # no such name: anything goes


def test_promote_and_rollback_move_the_champion_and_record_why(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.register({"accuracy": 0.75})
    store.register({"accuracy": 0.5})
    assert registry.promote("m", 2, "ticket 7") == {"model_name": "m", "champion": 2, "previous_champion": 1}
    assert store.aliases() == {"champion": "2", "challenger": "2"}
    assert store.model_tags() == {"champion_history": "[1, 2]"}
    assert change(store.version_tags(2)) == "promoted by hand (trainflow models promote): ticket 7"
    assert registry.champion_history(store.client, "m") == [1, 2]

    assert registry.rollback("m", "bad fix") == {"model_name": "m", "champion": 1, "previous_champion": 2}
    assert store.aliases() == {"champion": "1", "challenger": "2"}
    assert store.model_tags() == {"champion_history": "[1]"}
    tags1 = store.version_tags(1)
    assert change(tags1) == "rolled back to from version 2 (trainflow models rollback): bad fix"
    rolled = store.version_tags(2)["rolled_back"]
    assert CHANGE.fullmatch(rolled) and rolled.endswith(" bad fix")
    with pytest.raises(UserError) as only:
        registry.rollback("m", "again")
    assert str(only.value) == (
        "m: version 1 is the only champion it has had; nothing to roll back to (`trainflow models promote VERSION` "
        "makes another version champion)"
    )
    assert registry.promote("m", 1, "again") == {"model_name": "m", "champion": 1, "previous_champion": 1}
    assert store.model_tags() == {"champion_history": "[1]"}  # not listed twice


def test_the_models_commands_name_what_is_missing(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with pytest.raises(UserError) as no_model:
        registry.list_versions("m")
    assert str(no_model.value) == (
        f"no registered model 'm' in the tracking store {store.uri} (it holds no registered model yet); register "
        "one first (`trainflow run`), or name another with --name (`trainflow models list --all` lists them)"
    )
    store.client.create_registered_model("m")
    with pytest.raises(UserError) as no_champion:
        registry.rollback("m", "why")
    assert str(no_champion.value) == "m has no champion to roll back; `trainflow models promote VERSION` sets one"
    with pytest.raises(UserError) as no_version:
        registry.promote("m", 3, "why")
    assert str(no_version.value) == "m has no version 3; `trainflow models list` shows them"
    assert registry.list_versions("m") == []
    assert registry.champion_history(store.client, "m") == []


def test_models_list_gives_every_version_newest_first_with_all_it_knows(tmp_path: Path) -> None:
    store = Store(tmp_path)
    lineage = {"target": "y", "task": "classification", "data_hash": "d1"}
    store.register({"accuracy": 0.75, "f1_macro": 0.5}, lineage)
    store.register({"accuracy": 0.5}, {"target": "y", "task": "classification"})
    listed = registry.list_versions("m")
    v2, v1 = (store.client.get_model_version("m", v) for v in ("2", "1"))
    assert [v["version"] for v in listed] == [2, 1]
    first_change = listed[1]["champion_change"]
    assert CHANGE.fullmatch(first_change) and first_change.endswith(" register: version 1 is the first champion of m")
    assert listed == [
        {
            "version": 2,
            "aliases": ["challenger"],
            "metrics": {"accuracy": 0.5},
            "target": "y",
            "task": "classification",
            "data_hash": "",
            "run_id": v2.run_id,
            "created": v2.creation_timestamp,
            "champion_change": "",
        },
        {
            "version": 1,
            "aliases": ["champion"],
            "metrics": {"accuracy": 0.75, "f1_macro": 0.5},
            "target": "y",
            "task": "classification",
            "data_hash": "d1",
            "run_id": v1.run_id,
            "created": v1.creation_timestamp,
            "champion_change": first_change,
        },
    ]
    registry.promote("m", 2, "r")
    assert [v["aliases"] for v in registry.list_versions("m")] == [["challenger", "champion"], []]


def test_paired_without_the_challenger_s_rows_is_a_programming_error(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with pytest.raises(ValueError) as bad:
        store.register({"accuracy": 0.5}, params=RegisterParams(model_name="m"))
    assert str(bad.value) == "register.decide: paired needs the challenger's per-row outputs"


def test_a_champion_move_the_registry_refuses_keeps_the_version_challenger_and_says_who_may(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server with access control answers PERMISSION_DENIED to the alias write: nothing but the alias write was
    tried (the history and the change tag are untouched), the version stays challenger with its decision recorded,
    and the error names the user and the command for one who may (a UserError: exit 2)."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import PERMISSION_DENIED
    from mlflow.tracking import MlflowClient

    store = Store(tmp_path)
    store.register({"accuracy": 0.75})
    allowed = MlflowClient.set_registered_model_alias

    def refuse_champion(self: Any, name: str, alias: str, version: str) -> None:
        if alias == registry.CHAMPION:
            raise MlflowException("Permission denied", error_code=PERMISSION_DENIED)
        allowed(self, name, alias, version)

    monkeypatch.setattr(MlflowClient, "set_registered_model_alias", refuse_champion)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "bob")
    run_id = store.run()
    with pytest.raises(registry.NotAllowed) as refused:
        store.register({"accuracy": 0.9}, run_id=run_id)
    assert isinstance(refused.value, UserError)
    assert str(refused.value) == (
        "the registry refused to move `champion` of 'm' to version 2 for bob (Permission denied); version 2 stays "
        "`challenger`. A user allowed to move it runs `trainflow models promote 2 --name m --reason ...`"
    )
    assert store.aliases() == {"champion": "1", "challenger": "2"}
    assert store.model_tags()["champion_history"] == "[1]"
    tags = store.version_tags(2)
    assert registry.CHANGE_TAG not in tags
    assert tags["decided_against"] == "1"
    assert tags["registry_decision"].startswith("accuracy 0.9 beats champion version 1's 0.75")
    assert tags["registry_decision"].endswith(f"; not moved: {refused.value}")
    # The rerun reports the recorded decision and changes nothing; promoting by hand, once allowed, moves it.
    assert store.register({"accuracy": 0.9}, run_id=run_id)["champion"] is False
    with pytest.raises(registry.NotAllowed):
        registry.promote("m", 2, "reviewed")
    monkeypatch.setattr(MlflowClient, "set_registered_model_alias", allowed)
    assert registry.promote("m", 2, "reviewed")["champion"] == 2
    assert store.aliases()["champion"] == "2"
