"""Acceptance (issue 28): scripts/slurm/train.sbatch on a real single-node Slurm cluster (munge, slurmctld and slurmd
on 127.0.0.1, started here by scripts/slurm/local-cluster.sh). A job preempted mid-training with `scancel
--signal=USR1` checkpoints at the signal, requeues itself, resumes from that checkpoint in its second start, and ends
with the weights of an uninterrupted training, bit for bit. So does scripts/slurm/multinode.sbatch on that one node
with two CPU ranks under torchrun, which Slurm's USR1 reaches too.

Needs root and Debian's slurm-wlm and munge, which .ci/run installs (see README, "Slurm"); skipped otherwise."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.projects import REPO, make_project
from support.servers import BIN
from support.signals import digest

from trainflow.core.paths import Paths
from trainflow.params import load_params
from trainflow.stages import run_stage

MISSING = [t for t in ("munged", "slurmctld", "slurmd", "sbatch") if shutil.which(t) is None]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING), reason=f"no Slurm here ({', '.join(MISSING)}): apt-get install slurm-wlm munge"),
    pytest.mark.skipif(os.geteuid() != 0, reason="a local Slurm cluster runs slurmd as root"),
]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    where = tmp_path_factory.mktemp("slurm")
    script = REPO / "scripts/slurm/local-cluster.sh"
    started = subprocess.run(["bash", str(script), "start", str(where)], capture_output=True, text=True, timeout=120)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        conf = started.stdout.strip().splitlines()[-1].removeprefix("SLURM_CONF=")
        yield {**os.environ, "SLURM_CONF": conf, "PATH": f"{BIN}:{os.environ['PATH']}"}
    finally:
        subprocess.run(["bash", str(script), "stop", str(where)], capture_output=True, timeout=60)


def job_field(job: str, env: dict[str, str], field: str) -> str:
    shown = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True).stdout
    match = re.search(rf"\b{field}=(\S+)", shown)
    return match.group(1) if match else ""


def preempt_and_wait(job: str, slurm: dict[str, str], paths: Paths, log: Path) -> str:
    """Once training is under way (its first epoch checkpointed), `scancel --signal=USR1` the job; wait for it to
    requeue itself and complete in its second start (within 15 minutes: a loaded machine's two starts). Returns the
    job's log; a job still running when this fails is cancelled (its processes would outlive the cluster)."""
    deadline = time.monotonic() + 900
    try:
        while not any(paths.checkpoints.glob("step-*")):  # training is under way: its first epoch is checkpointed
            assert time.monotonic() < deadline, f"no checkpoint; job {job_field(job, slurm, 'JobState')}"
            time.sleep(0.2)
        subprocess.run(["scancel", "--signal=USR1", job], env=slurm, check=True)
        while job_field(job, slurm, "JobState") != "COMPLETED" or job_field(job, slurm, "Restarts") != "1":
            state = job_field(job, slurm, "JobState")
            text = log.read_text() if log.exists() else ""
            assert state not in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), f"job {state}:\n{text[-3000:]}"
            assert time.monotonic() < deadline, f"job {state} after 900 s:\n{text[-3000:]}"
            time.sleep(0.5)
    except BaseException:
        subprocess.run(["scancel", job], env=slurm, capture_output=True)
        raise
    return log.read_text()


def split_and_trained(tmp_path: Path, settings: dict[str, object], train: list[str]) -> tuple[Path, Path]:
    """An iris project with the Slurm scripts, ingested and split (`root`, for the job), and a copy of it trained
    uninterrupted by the command `train` (`whole`, the weights the job must end with)."""
    root = make_project(tmp_path / "proj", {"data.source": "builtin:iris", "train.progress": "false", **settings})
    shutil.copytree(REPO / "scripts/slurm", root / "scripts/slurm")
    paths = Paths(root)
    for stage in ("ingest", "split"):
        run_stage(stage, load_params(paths.params), paths)
    whole = Path(shutil.copytree(root, tmp_path / "whole"))
    done = subprocess.run(train, cwd=whole, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return root, whole


def test_a_job_preempted_with_usr1_requeues_itself_and_resumes_to_the_uninterrupted_weights(
    slurm: dict[str, str], tmp_path: Path
) -> None:
    root, whole = split_and_trained(tmp_path, {"train.epochs": 100, "train.batch_size": 16, "train.log_every": 20},
                                    [str(BIN / "trainflow"), "stage", "train"])  # fmt: skip
    paths = Paths(root)

    env = {**slurm, "MLFLOW_TRACKING_URI": os.environ["MLFLOW_TRACKING_URI"]}  # the test's store, made already
    submitted = subprocess.run(["sbatch", "--parsable", "scripts/slurm/train.sbatch"], cwd=root, env=env,
                               capture_output=True, text=True, check=True)  # fmt: skip
    job = submitted.stdout.strip().split(";")[0]
    text = preempt_and_wait(job, slurm, paths, root / f"slurm-trainflow-{job}.out")
    stopped = re.search(r"preempted: train: SIGUSR1 received: stopped after update (\d+) of 700", text)
    assert stopped, text[-3000:]
    at = int(stopped.group(1))
    assert f"requeueing job {job}" in text and "(restart 1)" in text
    assert re.search(rf"train: resumed from \S+step-{at:09d} at update {at}\b", text), text[-3000:]
    assert digest(root) == digest(whole)
    # Rank 0 ended the preempted attempt's MLflow run before any rank left (the ranks meet once more on their way out:
    # torchrun kills the others when one exits), so no run is left RUNNING.
    import mlflow

    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    statuses = sorted(r.info.status for r in runs)  # the uninterrupted run's, the preempted one's, the resumed one's
    assert "KILLED" in statuses and "RUNNING" not in statuses, statuses


def test_multinode_sbatch_two_ranks_under_torchrun_preempted_with_usr1_requeue_and_resume_bitwise(
    slurm: dict[str, str], tmp_path: Path
) -> None:
    """torchrun runs with SIGUSR1 ignored (it would die of it before its ranks checkpoint, and srun would then kill
    them): the ranks catch it all the same, stop after the same update, write preempted.json, and the job requeues."""
    from trainflow.engine.distributed import free_port

    torchrun = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node=2", "-m", "trainflow", "stage", "train"]
    root, whole = split_and_trained(tmp_path, {"train.epochs": 50, "train.batch_size": 8, "train.log_every": 50},
                                    torchrun)  # the same launcher, uninterrupted  # fmt: skip
    paths = Paths(root)

    env = {**slurm, "TRAINFLOW_PROCS_PER_NODE": "2", "TRAINFLOW_RDZV_PORT": str(free_port()),
           "MLFLOW_TRACKING_URI": os.environ["MLFLOW_TRACKING_URI"]}  # the test's store, made already  # fmt: skip
    submitted = subprocess.run(["sbatch", "--parsable", "--nodes=1", "--gpus-per-node=0",
                                "scripts/slurm/multinode.sbatch"], cwd=root, env=env, capture_output=True, text=True,
                               check=True)  # fmt: skip
    job = submitted.stdout.strip().split(";")[0]
    text = preempt_and_wait(job, slurm, paths, root / f"slurm-trainflow-ddp-{job}.out")
    # Both ranks stop after the same update. The signal reaches them a moment apart, and they exchange their flags
    # every 0.25 s of training: a rank whose handler had not run yet at the exchange stops for the other's signal.
    stops = re.findall(r"preempted: train: (SIGUSR1 received|another rank was told to stop): stopped after update "
                       r"(\d+) of 350", text)  # fmt: skip
    assert len(stops) == 2 and stops[0][1] == stops[1][1], text[-3000:]
    assert "SIGUSR1 received" in {why for why, _ in stops}, text[-3000:]
    at = int(stops[0][1])
    # torchrun outlived the signal and waited for its ranks (exit 1 once they exit 75). Killed by it (exit 138), it
    # leaves them to srun --kill-on-bad-exit: here they escape (proctrack/linuxproc, started in sessions of their
    # own), with proctrack/cgroup they die before their checkpoint.
    assert f"trainflow: preempted (exit 1); requeueing job {job}" in text, text[-3000:]
    assert "(restart 1)" in text, text[-3000:]
    assert re.search(rf"train: resumed from \S+step-{at:09d} at update {at}\b", text), text[-3000:]
    assert digest(root) == digest(whole)
