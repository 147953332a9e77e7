"""Acceptance (issue 46, "two nodes"): `trainflow stage train` under torchrun on two nodes, one rank each, trains what
one process trains, bit for bit; and a node lost mid-training, after a checkpoint, costs a rerun and nothing else: the
other node's torchrun exits 1 by itself within seconds, and rerunning both nodes' torchrun resumes from the last
checkpoint and ends with those same bits.

The nodes are two torchrun agents on this machine (`--nnodes 2 --nproc-per-node 1`, `--node-rank` 0 and 1, static
rendezvous on 127.0.0.1: node n runs rank n, and node 0 hosts the rendezvous store), each in a session of its own, as
on two machines. Both nodes share one workspace directory, as a cluster's nodes share a filesystem (training.md:
"`models/` on a filesystem every node sees"): both read its params and splits; rank 0, on node 0, alone writes the
checkpoints, models/final and reports; both ranks read the checkpoint a rerun resumes from.

"One process" is the same project with train.accumulate 2 and world_size 1: two ranks with accumulate 1 cut each window
of 16 samples into that process's two micro-batches of 8 (the last window, of 9, into 8 and 1), and the two gradients'
sum is a + b either way. model.dropout is 0, since each rank draws its own dropout masks (with dropout, two nodes equal
one node's two ranks, test_distributed_stage.py, not one process). Equal bit for bit: every file of models/final
(training.json but its world_size), the last checkpoint's weights and optimizer state, and every evaluation's counts,
rate and val metrics; train_loss, per-rank sums summed, within float rounding (support.ranks.assert_same_history).

A node lost is its torchrun and its rank, both SIGKILLed. torchrun starts its rank in a session of its own, so a
SIGKILL to torchrun's process group alone leaves the rank alive (checked here): it goes on training with the other
rank to the end, and the other node's torchrun then waits at torch's exit barrier, 300 s (no torchrun option sets it),
before it exits 0 (measured: 307 s; not run here).

Slow tier: each run starts two torchrun agents and a rank each, seconds of imports per process: 80-105 s in all on 2
busy cores, about 30 s of it per node lost (its run to the failpoint, the loss, the rerun)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from support.projects import make_project
from support.ranks import assert_same_history
from support.servers import free_port

from trainflow.core.paths import Paths
from trainflow.engine.checkpoint import CheckpointStore, load_checkpoint
from trainflow.params import load_params, write_overrides
from trainflow.stages import run_stage

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
UPDATES = 3 * 7  # 3 epochs of iris's 105 train rows in windows of 16 (8 per rank): 6 whole and one of 9
SETTINGS = {
    "data.source": "builtin:iris",
    "register.model_name": "iris",
    "model.dropout": 0,
    "train.epochs": 3,
    "train.progress": "false",
    "train.batch_size": 8,
    "train.checkpoint_every": 4,  # mid-epoch checkpoints (update 8: epoch 2's first), besides each epoch's end
    "train.eval_every": 5,
}
KILL_AFTER = 10  # updates: the checkpoint of update 8 is written by then (or, still writing, that of update 7)
MARK = "TRAINFLOW_TEST_TWO_NODES"  # in every agent's and rank's environment: what `leftovers` finds and kills
# Each rank on one thread, as the one-process run: the same kernels, the same bits (torchrun leaves OMP_NUM_THREADS
# alone with one rank per node).
THREADS = 1


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project with its splits made (in this process), for each run to copy."""
    root = make_project(tmp_path_factory.mktemp("split") / "p", SETTINGS)
    paths = Paths(root)
    for s in ("ingest", "split"):
        run_stage(s, load_params(paths.params), paths)
    return root


@pytest.fixture(scope="module")
def one_process(split: Path, tmp_path_factory: pytest.TempPathFactory, _empty_mlflow_store: Path) -> Path:
    """The project trained by one process with twice the accumulation (in this process: no start-up to pay)."""
    root = Path(shutil.copytree(split, tmp_path_factory.mktemp("one") / "p"))
    paths = Paths(root)
    write_overrides(paths.params, ["train.accumulate=2"])
    shutil.copyfile(_empty_mlflow_store, root / "mlflow.db")
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
            run_stage("train", load_params(paths.params), paths)
    finally:
        torch.set_num_threads(threads)
    return root


def copy(split: Path, dest: Path) -> Path:
    return Path(shutil.copytree(split, dest))


@contextlib.contextmanager
def nodes(root: Path, port: int, tag: str, **env: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    """torchrun on node 0 and node 1, in root, each in a session of its own; stderr in <root>.<tag>-node<n>.stderr.
    Whatever of them is left at the end (the agents, and their ranks in sessions of their own) is SIGKILLed."""
    torchrun = [str(BIN / "torchrun"), "--nnodes=2", "--nproc-per-node=1", "--master-addr=127.0.0.1",
                f"--master-port={port}"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), MARK: str(root), **env}
    agents = []
    try:
        for node in (0, 1):
            with log(root, tag, node).open("wb") as err:
                cmd = [*torchrun, f"--node-rank={node}", "-m", "trainflow.cli", "stage", "train"]
                agents.append(subprocess.Popen(cmd, cwd=root, env=env, stderr=err, stdout=subprocess.DEVNULL,
                                               start_new_session=True))  # fmt: skip
        yield agents
    finally:
        for pid in [a.pid for a in agents if a.poll() is None] + leftovers(root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for agent in agents:
            agent.wait()


def log(root: Path, tag: str, node: int) -> Path:
    return root.parent / f"{root.name}.{tag}-node{node}.stderr"


def leftovers(root: Path) -> list[int]:
    """The processes of this machine started by `nodes` for root (MARK in their environment)."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and f"{MARK}={root}\0".encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
    return found


def rank_of(agent: subprocess.Popen[bytes]) -> tuple[int, str] | None:
    """The rank torchrun `agent` started (pid, state: "T" is stopped), if it has one now."""
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit():
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == agent.pid:
                    return int(entry.name), fields[0]
    return None


def ended(agents: list[subprocess.Popen[bytes]], limit_s: float = 300) -> list[int]:
    deadline = time.monotonic() + limit_s
    return [agent.wait(timeout=max(deadline - time.monotonic(), 1)) for agent in agents]


def bits(tensors: dict[str, torch.Tensor]) -> dict[str, bytes]:
    return {k: v.numpy().tobytes() for k, v in tensors.items()}  # so -0.0 vs 0.0, or two NaNs, differ


def assert_one_process(root: Path, one: Path) -> None:
    """root (two nodes) holds what one process left in `one`: see the module doc."""
    got, want = Paths(root).final, Paths(one).final
    assert sorted(p.name for p in got.iterdir()) == sorted(p.name for p in want.iterdir())
    for f in want.iterdir():
        if f.name != "training.json":
            assert (got / f.name).read_bytes() == f.read_bytes(), f.name
    training = [json.loads((d / "training.json").read_text()) for d in (got, want)]
    assert [t.pop("world_size") for t in training] == [2, 1]
    assert training[0] == training[1]
    assert training[0]["updates"] == UPDATES
    last = [CheckpointStore(Paths(d).checkpoints, 1).latest() for d in (root, one)]
    assert last[0] is not None and last[1] is not None and last[0].name == last[1].name
    ours, theirs = load_checkpoint(last[0]), load_checkpoint(last[1])
    for group in ("model", "optimizer"):
        assert bits(ours.tensors[group]) == bits(theirs.tensors[group]), group
    history, reference = ours.meta["state"]["history"], theirs.meta["state"]["history"]
    assert_same_history(history, reference)
    for g, w in zip(history, reference, strict=True):  # and the val metrics exactly: summed exactly over the ranks
        assert {k: v for k, v in g.items() if k != "train_loss"} == {k: v for k, v in w.items() if k != "train_loss"}


def test_two_nodes_train_what_one_process_trains(split: Path, one_process: Path, tmp_path: Path) -> None:
    root = copy(split, tmp_path / "p")
    with nodes(root, free_port(), "run") as agents:
        codes = ended(agents)
    assert codes == [0, 0], "\n".join(log(root, "run", n).read_text()[-3000:] for n in (0, 1))
    assert_one_process(root, one_process)


@pytest.mark.parametrize("lost", [1, 0])  # a worker node; the node of rank 0, which writes and hosts the store
def test_a_node_lost_after_a_checkpoint_stops_the_other_and_both_rerun_resume_bit_identically(
    split: Path, one_process: Path, tmp_path: Path, lost: int
) -> None:
    root = copy(split, tmp_path / "p")
    store = CheckpointStore(Paths(root).checkpoints, 1)
    port = free_port()
    # Node `lost`'s rank stops itself (SIGSTOP) after update KILL_AFTER; the other rank waits for it in a collective.
    # A collective timeout of 600 s: the other node ending within a minute then tells "stopped by the loss" from it.
    failpoint = {"TRAINFLOW_FAILPOINT": f"update:{KILL_AFTER}", "TRAINFLOW_FAILPOINT_SIGNAL": "SIGSTOP",
                 "TRAINFLOW_FAILPOINT_RANK": str(lost), "TRAINFLOW_COLLECTIVE_TIMEOUT": "600"}  # fmt: skip
    with nodes(root, port, "killed", **failpoint) as agents:
        deadline = time.monotonic() + 300
        while (rank := rank_of(agents[lost])) is None or rank[1] != "T":
            assert [a.poll() for a in agents] == [None, None], "a node ended before the failpoint"
            assert time.monotonic() < deadline, f"no stop after update {KILL_AFTER} in 300 s"
            time.sleep(0.05)
        os.killpg(agents[lost].pid, signal.SIGKILL)
        agents[lost].wait()
        # torchrun's process group is not its rank's (a session of its own): the rank outlives it, and only dies
        # with its node; here, its own SIGKILL.
        assert Path(f"/proc/{rank[0]}").exists()
        os.killpg(rank[0], signal.SIGKILL)
        lost_at = time.monotonic()
        survivor = agents[1 - lost]
        code = survivor.wait(timeout=120)
        took = time.monotonic() - lost_at
    print(f"node {1 - lost}'s torchrun exited {code} {took:.1f} s after node {lost} was lost")
    assert code == 1, log(root, "killed", 1 - lost).read_text()[-3000:]
    assert took < 60  # its rank's collective failed on the closed connection (gloo), not at the timeout
    assert not Paths(root).final.exists()
    # The last complete checkpoint (one in flight at the loss is a hidden temp dir, left out): mid-training.
    checkpoint = store.latest()
    assert checkpoint is not None
    at = int(checkpoint.name.removeprefix("step-"))
    assert 0 < at <= KILL_AFTER
    print(f"last checkpoint before the loss: update {at}")

    # The rerun: both nodes' torchrun as before (the same port), nothing else; it resumes from that checkpoint.
    with nodes(root, port, "rerun") as agents:
        codes = ended(agents)
    said = log(root, "rerun", 0).read_text()  # rank 0 speaks
    assert codes == [0, 0], said[-3000:] + log(root, "rerun", 1).read_text()[-3000:]
    assert f"train: resumed from {checkpoint} at update {at} " in said
    assert json.loads(Paths(root).train_run.read_text())["resumed_from_update"] == at
    assert_one_process(root, one_process)
