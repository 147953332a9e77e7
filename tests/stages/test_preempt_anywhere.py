"""Acceptance: at any moment of `trainflow stage train`, on one process and on two, SIGTERM, SIGUSR1 and a process-group
SIGINT (a terminal's Ctrl-C) end the stage within 30 s with the documented exit code and no traceback, and the rerun
ends with the uninterrupted run's weights, bit for bit.

Every signal at every moment, on one process and on two (slow tier; `cases` says how they are paired; the default
tier runs a few of these moments on one process, in test_preempt.py). SIGTERM and SIGUSR1 go to the process started
(on two processes: the launcher, which passes them on to its ranks), SIGINT to the whole process group. The moments
(failpoints that stop the process reaching them, see tests/support/signals.py; on two processes, rank 0): before the
ranks start, before the data is read, before fit (MLflow's run started), after update 3 of 21, before the export,
before the model's MLflow logging. Before the last update: exit 75 and the rerun resumes (or starts afresh, where
nothing was written); after it: exit 0, the outputs whole.

The rerun after a stop is the next case's run of the same project (`chains`): each run of a chain is signalled at its
own moment, and the last, after the last update, ends with the uninterrupted run's weights. A stop before training
must leave data, models and reports as they were, so the run after it starts as a fresh one would; a stop at update 3
is followed by a run that resumes from it. (A rerun of its own after each stop would train the whole way, checking
nothing the chain does not.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.projects import make_project
from support.signals import BIN, ON_LINUX, digest, signalled_at, snapshot

from trainflow.core.errors import PREEMPTED
from trainflow.core.paths import Paths
from trainflow.engine.preempt import PREEMPTED_MARK
from trainflow.params import load_params
from trainflow.stages import run_stage

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not ON_LINUX, reason="finds the stopped process in /proc")]

# iris: 97 train rows; 16 a window (16 x 1 process, 8 x 2 ranks): 7 updates an epoch, 21 in all.
SETTINGS = {"data.source": "builtin:iris", "train.epochs": 3, "train.progress": "false", "train.log_every": 2}
BY_WORLD = {1: {"train.batch_size": 16}, 2: {"train.batch_size": 8, "train.world_size": 2}}
SIGNALS = [("SIGTERM", "stage"), ("SIGUSR1", "stage"), ("SIGINT", "group")]
BEFORE = ["train-launch:1", "train-setup:1", "train-fit:1", "update:3"]  # exit 75, then a rerun
AFTER = ["train-export:1", "train-log:1"]  # exit 0


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, str]]:
    """Per world size: a split project, and the weights its uninterrupted training ends with."""
    import subprocess

    out = {}
    for world, settings in BY_WORLD.items():
        root = make_project(tmp_path_factory.mktemp(f"world{world}") / "proj", {**SETTINGS, **settings})
        paths = Paths(root)
        for stage in ("ingest", "split"):
            run_stage(stage, load_params(paths.params), paths)
        whole = Path(shutil.copytree(root, root.parent / "whole"))
        if world == 1:  # in this process: the stage the CLI runs, without a process's start-up (seconds of imports)
            run_stage("train", load_params(Paths(whole).params), Paths(whole))
        else:  # a launcher here would start its ranks from the test's process
            done = subprocess.run([str(BIN / "trainflow"), "stage", "train"], cwd=whole, capture_output=True, text=True)
            assert done.returncode == 0, done.stderr[-3000:]
        out[world] = (root, digest(whole))
    return out


def written(root: Path) -> dict[str, bytes]:
    """What a stop before training may not change: data, models and reports, but for the mark a preempted rank 0
    leaves for a job script behind the launcher (PREEMPTED_MARK: the next run removes it)."""
    return {k: v for k, v in snapshot(root, "data", "models", "reports").items() if Path(k).name != PREEMPTED_MARK}


def cases() -> list[tuple[int, str, str, str]]:
    """Every signal at every moment, once; the process count alternates along both, so that each moment is met on one
    and on two processes, and so is each signal (every pair of the three covered, in 18 cases rather than the 33 of
    all three crossed: a signal reaches the stage through one handler whatever its name, and each case on two
    processes costs about a minute of the slow tier). The launcher exists on two processes alone."""
    return [
        (2 if point == "train-launch:1" or (i + j) % 2 == 0 else 1, point, name, to)
        for i, point in enumerate(BEFORE + AFTER)
        for j, (name, to) in enumerate(SIGNALS)
    ]


def chains() -> list[list[tuple[int, str, str, str]]]:
    """The cases, as runs of one project: per process count, one chain per case after the last update (its last
    run), the cases before it dealt out in moment order, so that no chain stops twice in training (a run resumed from
    update 3 counts its updates from there)."""
    out = []
    for world in BY_WORLD:
        mine = [c for c in cases() if c[0] == world]
        before = sorted((c for c in mine if c[1] in BEFORE), key=lambda c: BEFORE.index(c[1]))
        after = [c for c in mine if c[1] in AFTER]
        out += [[*before[n :: len(after)], last] for n, last in enumerate(after)]
    assert sorted(c for chain in out for c in chain) == sorted(cases())
    assert all(sum(c[1] == "update:3" for c in chain) <= 1 for chain in out)
    return out


def chain_id(chain: list[tuple[int, str, str, str]]) -> str:
    return f"{chain[0][0]}-" + "+".join(f"{point}-{name}-{to}" for _, point, name, to in chain)


@pytest.mark.timeout(1200)  # up to four runs of the stage, the first chain with both references to train
@pytest.mark.parametrize("chain", chains(), ids=chain_id)
def test_a_signal_at_any_moment_ends_the_stage_as_documented_and_the_rerun_is_bitwise(
    references: dict[int, tuple[Path, str]], tmp_path: Path, chain: list[tuple[int, str, str, str]]
) -> None:
    world = chain[0][0]
    reference, want = references[world]
    root = Path(shutil.copytree(reference, tmp_path / "proj"))
    for n, (_, point, name, to) in enumerate(chain):
        what = f"run {n + 1} of the chain: {name} at {point} on {world} process(es)"
        before = written(root)
        ended = signalled_at(root, point, name, to)
        assert "Traceback" not in ended.stderr, f"{what}: {ended.stderr[-3000:]}"
        assert ended.after_s < 30, f"{what}: {ended.after_s:.1f} s from the signal to the end"
        if point in AFTER:
            assert n == len(chain) - 1
            assert ended.code == 0, f"{what}: {ended.stderr[-3000:]}"
            assert f"train: {name} received after the last update" in ended.stderr, f"{what}: {ended.stderr[-3000:]}"
        else:
            assert ended.code == PREEMPTED, f"{what}: {ended.stderr[-3000:]}"
            assert f"preempted: train: {name} received" in ended.stderr, f"{what}: {ended.stderr[-3000:]}"
            assert not (Paths(root).final / "model.safetensors").exists(), what
            if point != "update:3":  # before training: the next run starts as this one did
                assert written(root) == before, f"{what}: it wrote there"
    assert digest(root) == want, f"the last run of {chain_id(chain)}: other weights than the uninterrupted run"
