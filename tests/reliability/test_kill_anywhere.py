"""Kill anywhere (issue 16), the short version, in the slow tier: rounds of a param change, `trainflow run` SIGKILLed
inside a DVC commit, inside the registry write, and at a random moment, then rerun to completion; after each round
every invariant of tests/reliability/chaos.py holds. bench/soak.py is the long version (50 random rounds).

A failure names the seed of its random delays; TRAINFLOW_CHAOS_SEED=<n> replays it."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator

import chaos
import pytest
from support.projects import make_project
from support.servers import PrefectServer, prefect_server

pytestmark = pytest.mark.slow  # README line 2 stays under 10 minutes; CI runs the slow tier after it

SEED = int(os.environ.get("TRAINFLOW_CHAOS_SEED", random.randrange(10_000)))
ROUNDS = [
    (["train.lr=0.004"], "during train's DVC commit"),
    (["seed=1", "model.dropout=0.2"], "during the registry write"),
    (["train.epochs=5"], "anywhere (random time)"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    """One Prefect server for both workspaces (a start costs seconds of CPU); each workspace's checks read only the
    flow runs tagged with it."""
    home = tmp_path_factory.mktemp("prefect-home")
    with prefect_server(home) as server:
        yield server


KINDS = {"in-memory": None, "streamed": {"data.memory_budget_mb": 0.000001}}
# Each round in each kind of workspace, but the registry write in the in-memory one alone: what it writes does not
# depend on how the data was held (a round is a minute of a worker).
CASES = [
    pytest.param(kind, n, change, point, id=f"{kind}-{n}-{point}")
    for kind in KINDS
    for n, (change, point) in enumerate(ROUNDS, 1)
    if not (kind == "streamed" and point == "during the registry write")
]


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory: pytest.TempPathFactory, server: PrefectServer) -> Callable[[str], chaos.Workspace]:
    """Each kind of workspace, made on first use and kept for the module (its rounds build on each other, in order)."""
    made: dict[str, chaos.Workspace] = {}

    def get(kind: str) -> chaos.Workspace:
        if kind not in made:
            made[kind] = chaos.workspace(tmp_path_factory.mktemp("chaos"), make_project, server.env(), KINDS[kind])
        return made[kind]

    return get


@pytest.fixture
def workspace(request: pytest.FixtureRequest, workspaces: Callable[[str], chaos.Workspace]) -> chaos.Workspace:
    """The pipeline holding its data in memory, or streaming it through split, train and evaluate: the
    streamed files (models/.streamed) and the sharded row groups must meet the same invariants after a kill."""
    ws = workspaces(request.param)
    streamed = ("split: streamed from disk", "train: data streamed from disk", "evaluate: test data streamed")
    assert all((s in ws.first_log) == (request.param == "streamed") for s in streamed), ws.first_log[-3000:]
    return ws


@pytest.mark.parametrize(("workspace", "number", "change", "point"), CASES, indirect=["workspace"])
def test_a_run_killed_there_then_rerun_leaves_every_invariant_true(
    workspace: chaos.Workspace, number: int, change: list[str], point: str
) -> None:
    rng = random.Random(SEED * 10 + number)
    template = chaos.POINTS[point]
    if template is None:
        spec, after = None, rng.uniform(1.0, workspace.run_s * 0.5)  # a run that trains takes ~0.7 of the first
    else:
        spec, after = template.format(delay=round(rng.uniform(0.0, 0.3), 3)), None
    r = chaos.play(workspace, chaos.Round(number, change, point, spec, after))
    context = f"TRAINFLOW_CHAOS_SEED={SEED}: {r.row()}"
    assert r.killed, f"the run was not killed (it ended first), so this round tested nothing; {context}"
    assert not r.violations, f"{context}\n" + "\n".join(r.violations)


@pytest.mark.parametrize("workspace", list(KINDS), indirect=True)
def test_each_invariant_fails_on_a_workspace_broken_the_way_it_guards_against(workspace: chaos.Workspace) -> None:
    """So the rounds above can fail: each check, run on a workspace broken in its way, reports it (then the damage is
    undone and every check holds again)."""
    import json
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    root = workspace.root
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    leftover = root / "data" / f".processed.{dead.pid}.x.tmp"
    leftover.mkdir()
    assert chaos.no_leftovers(workspace)
    leftover.rmdir()

    metrics = root / "reports/metrics.json"
    saved = metrics.read_text()
    metrics.write_text(json.dumps({**json.loads(saved), "accuracy": 0.123}))
    assert chaos.outputs_load(workspace) and chaos.dvc_status_clean(workspace)
    metrics.write_text(saved)

    client = MlflowClient(workspace.env["MLFLOW_TRACKING_URI"])
    champion = client.get_model_version_by_alias("iris", "champion")
    decision = champion.tags["registry_decision"]
    client.delete_model_version_tag("iris", champion.version, "registry_decision")
    assert any("no decision recorded" in p for p in chaos.registry_consistent(workspace))
    client.set_model_version_tag("iris", champion.version, "registry_decision", decision)

    experiment = client.get_experiment_by_name("trainflow").experiment_id
    run = client.create_run(experiment)
    assert any(run.info.run_id in p for p in chaos.nothing_left_running(workspace))
    client.set_terminated(run.info.run_id)

    assert chaos.check(workspace) == []
