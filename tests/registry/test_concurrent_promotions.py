"""Four workspaces register challengers of one model at once on a shared tracking server: the champion ends on the best
of them by the gate, every version records the decision it got, and each decision was made against the champion that
held the alias when it moved (no lost update), because decisions about a model take turns under the lock the registry
holds (trainflow.registry.lock). Real concurrent processes, 20 rounds, random delays around every alias read and
write; with the lock taken away the same rounds lose updates, so the checks see the race. Slow tier."""

from __future__ import annotations

import json
import multiprocessing
import random
from collections.abc import Iterator
from typing import Any

import pytest
from support import promoter

pytestmark = pytest.mark.slow

WRITERS, ROUNDS = 4, 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from mlflow.tracking import MlflowClient
    from support.team import DATABASES, mlflow_server, postgres

    tmp = tmp_path_factory.mktemp("team")
    with (
        postgres(tmp / "pg") as pg,
        mlflow_server(tmp, pg.create_database(DATABASES[0]), str(tmp / "artifacts")) as ours,
    ):
        MlflowClient(ours.url).create_experiment(promoter.EXPERIMENT)  # four writers creating it at once would race
        yield ours.url


def rounds(server: str, monkeypatch: pytest.MonkeyPatch, without_lock: bool, n: int) -> Iterator[list[str]]:
    """`n` rounds of WRITERS registrations at once of a fresh model each; yields each round's broken guarantees."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    context = multiprocessing.get_context("spawn")
    with context.Pool(WRITERS, initializer=promoter.start, initargs=(0, without_lock)) as pool:
        for r in range(n):
            name = f"race-{'unlocked' if without_lock else 'locked'}-{r}"
            accuracies = random.Random(r).sample([0.6, 0.7, 0.8, 0.9], WRITERS)
            jobs = [pool.apply_async(promoter.register, (name, a)) for a in accuracies]
            results, errors = [], []
            for job in jobs:
                try:
                    results.append(job.get(timeout=300))
                except Exception as exc:  # noqa: BLE001 - an unlocked race may fail in MLflow itself: that is a loss too
                    errors.append(f"{type(exc).__name__}: {exc}")
            yield errors + broken(name, results)


def broken(name: str, results: list[dict[str, Any]]) -> list[str]:
    """What the registry holds for `name` that breaks a guarantee, read from the registry itself (not the results)."""
    from mlflow.tracking import MlflowClient

    from trainflow.registry import registry

    client = MlflowClient()
    versions = {int(v.version): v.tags for v in client.search_model_versions(f"name='{name}'")}
    accuracy = {v: float(tags["metric.accuracy"]) for v, tags in versions.items()}
    model = client.get_registered_model(name)
    history = [int(v) for v in json.loads(model.tags[registry.HISTORY_TAG])]
    champion = int(model.aliases[registry.CHAMPION])
    against = {v: tags.get(registry.AGAINST_TAG) for v, tags in versions.items()}
    found = []
    if len(versions) != WRITERS or len(results) != WRITERS:
        found.append(f"{len(versions)} versions, {len(results)} results")
    found += [f"version {v} has no decision" for v, tags in versions.items() if registry.DECISION_TAG not in tags]
    if champion != max(accuracy, key=accuracy.__getitem__):
        found.append(f"champion {champion} ({accuracy[champion]}) is not the best of {accuracy}")
    if history[-1] != champion:
        found.append(f"history {history} does not end on champion {champion}")
    # Each promotion was decided against the champion before it; each refusal against a champion at least as good.
    for before, version in zip([None, *history], history, strict=False):
        if against[version] != ("none" if before is None else str(before)):
            found.append(f"version {version} promoted against {against[version]}, but {before} held the alias")
    for version in set(versions) - set(history):
        held = against[version]
        if held is None or held == "none" or int(held) not in history or accuracy[int(held)] < accuracy[version]:
            found.append(f"version {version} ({accuracy[version]}) refused against {held}")
    if client.search_registered_models(f"name='{name}.trainflow-lock'"):
        found.append("the lock was left behind")
    return found


def test_four_writers_at_once_end_on_the_best_champion_every_round(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for r, found in enumerate(rounds(server, monkeypatch, without_lock=False, n=ROUNDS)):
        assert not found, f"round {r}: {found}"


def test_without_the_lock_the_same_rounds_lose_updates(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    lost = [found for found in rounds(server, monkeypatch, without_lock=True, n=5) if found]
    assert lost, "5 unlocked rounds of 4 writers lost no update: the test would not see a broken lock"
