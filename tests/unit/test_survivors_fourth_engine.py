"""Behaviours a mutation run showed no test pinned (a fourth sample): the optimizer state batch_size auto counts for
plain SGD, a resume under fp16 of a checkpoint written without it, the record a Ray trial writes before its MLflow
run starts, the failpoint a worker passes while it claims a sweep slot, and the FLOPs per token of a Transformers
model, each against a count worked out by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from optuna.trial import TrialState
from support import sweeps
from support.nets import Net
from support.projects import REPO
from support.sweeps import mlflow_runs, sweep_params
from support.tiny_models import tiny_bert, tiny_decoder
from torch import nn

from trainflow.engine import batch_size as bs
from trainflow.engine.checkpoint import CheckpointStore
from trainflow.engine.distributed import Group
from trainflow.engine.loaders import TensorData
from trainflow.engine.objective import Objective
from trainflow.engine.precision import Precision
from trainflow.models import hf
from trainflow.params import TrainParams, load_params
from trainflow.tune import ray_backend, runs
from trainflow.tune import study as study_
from trainflow.tune.study import CLAIMED, claim, open_study

sys.path.insert(0, str(REPO / "tests" / "engine"))  # the engine tests' kit, as their own directory provides it
try:
    from engine_kit import make_trainer
    from support.linear_run import RUN, data, fit, linear
finally:
    sys.path.remove(str(REPO / "tests" / "engine"))

prepared, project = sweeps.prepared, sweeps.project  # the iris project and its own MLflow store

# --- batch_size auto: the optimizer state of plain SGD ---------------------------------------------------------------


def test_sgd_without_momentum_holds_no_optimizer_state_in_the_memory_estimate() -> None:
    """Linear(4, 8) -> ReLU -> Linear(8, 1) has 4 * 8 + 8 + 8 * 1 + 1 = 49 float32 parameters: 196 bytes. SGD with
    momentum 0 keeps no momentum buffer, so beyond the weights and gradients training holds nothing (0 bytes), and the
    CPU estimate's state is the weights and their gradients only: 2 x 196 bytes. With momentum it holds one buffer
    (196 bytes), and EMA one more copy."""
    torch.manual_seed(0)
    model = Net(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    weights = (4 * 8 + 8 + 8 * 1 + 1) * 4
    assert weights == 196
    plain = TrainParams(optimizer="sgd", momentum=0.0)
    assert bs.state_bytes(model, plain, Group()) == 0
    assert bs.state_bytes(model, TrainParams(optimizer="sgd", momentum=0.9), Group()) == 196
    assert bs.state_bytes(model, TrainParams(optimizer="sgd", momentum=0.0, ema_decay=0.9), Group()) == 196
    assert bs.state_bytes(model, TrainParams(optimizer="sgd", momentum=0.9, ema_decay=0.9), Group()) == 2 * 196
    data = TensorData(torch.randn(64, 4), torch.randn(64))
    fp32 = Precision("fp32", "cpu")
    est = bs.estimate_memory(model, data, Objective("regression"), fp32, plain, share=64)
    assert est.state == 2 * 196


# --- resuming under fp16 a checkpoint written without it -------------------------------------------------------------


def test_a_checkpoint_written_without_fp16_resumes_under_fp16_and_finishes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An fp32 run of 1 epoch (2 updates of the 6-sample linear run) leaves step-000000002, whose GradScaler state is
    empty (the scaler was disabled). A 2-epoch run under precision fp16 with train.resume at that checkpoint starts its
    scaler afresh (nothing to load), resumes at update 2 and finishes the second epoch's 2 updates: 4 in all. (Loading
    the empty state into the enabled scaler raises, which made the resume fail with a CheckpointError.)"""
    first = fit(tmp_path / "a", epochs=1)
    step = tmp_path / "a" / "step-000000002"
    assert first.state.updates == 2 and step.is_dir()
    meta = json.loads((step / "meta.json").read_text())
    assert meta["scaler"] == {}  # written without fp16: nothing to restore
    capsys.readouterr()

    t = make_trainer(tmp_path / "b", linear(), precision="fp16", **{**RUN, "resume": str(step)})
    assert t.scaler.is_enabled()
    t.fit(*data())
    assert f"train: resumed from {step} at update 2 (epoch 1, sample 0 of its order)\n" in capsys.readouterr().err
    assert (t.resumed_from, t.state.updates, t.state.epoch) == (2, 4, 2)
    assert [row["update"] for row in t.state.history] == [2.0, 4.0]  # the first epoch's row came with the checkpoint
    latest = CheckpointStore(tmp_path / "b", 2).latest()
    assert latest is not None and latest.name == "step-000000004"
    assert json.loads((latest / "meta.json").read_text())["scaler"]  # this run's fp16 scaler state, saved


# --- a Ray trial's run record --------------------------------------------------------------------------------------


class Killed(Exception):
    """Stands in for the SIGKILL a failpoint sends."""


def test_a_ray_trial_killed_right_after_starting_its_run_leaves_the_runs_key_in_run_json(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed at the failpoint tune-run-start (the trial's MLflow run started, its id not yet recorded), run.json holds
    exactly {"key": <the key tag of the started run>, "run_id": null}; the restored trial finds that run by the key and
    carries it on instead of starting a second one."""
    import trainflow.core.io

    real = trainflow.core.io.failpoint

    def failpoint(name: str) -> None:
        if name == "tune-run-start":
            raise Killed(name)
        real(name)

    p = sweep_params(project)
    record = project / "models/tune/trainflow/ray/t1/run.json"
    record.parent.mkdir(parents=True)
    spec = {"data_hash": "dh", "parent": None}
    with monkeypatch.context() as m:
        m.setattr(trainflow.core.io, "failpoint", failpoint)
        with pytest.raises(Killed):
            ray_backend._child_run(project, p, p, "t1", spec, record)
    (started,) = mlflow_runs(project)
    key = started.data.tags[runs.KEY_TAG]
    assert json.loads(record.read_text()) == {"key": key, "run_id": None}

    run = ray_backend._child_run(project, p, p, "t1", spec, record)  # the restored trial
    assert run.run_id == started.info.run_id
    assert json.loads(record.read_text()) == {"key": key, "run_id": started.info.run_id}
    assert [r.info.run_id for r in mlflow_runs(project)] == [started.info.run_id]  # no second run


# --- claiming a sweep slot -------------------------------------------------------------------------------------------


def test_claiming_a_slot_passes_the_failpoints_tune_claim_then_tune_claimed(
    params_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The crash tests kill a worker with TRAINFLOW_FAILPOINT=tune-claim:<n>: claiming slot 0 passes that point once
    its claimed.json marker is written and the slot is still WAITING, then tune-claimed once the slot is RUNNING."""
    s = open_study(load_params(params_file), tmp_path, 2, "d", "c")
    seen: list[tuple[str, bool, TrialState]] = []

    def failpoint(name: str) -> None:
        first = s.trials()[0]
        seen.append((name, (s.trial_dir(0) / CLAIMED).is_file(), first.state))

    monkeypatch.setattr(study_, "failpoint", failpoint)
    c = claim(s)
    assert c is not None and c.trial.number == 0
    try:
        assert seen == [("tune-claim", True, TrialState.WAITING), ("tune-claimed", True, TrialState.RUNNING)]
    finally:
        c.release()


# --- FLOPs per token of a Transformers model -----------------------------------------------------------------------

WORDS = [f"w{i}" for i in range(30)]


def test_flops_per_token_of_a_tiny_bert_count_six_per_non_embedding_parameter(tmp_path: Path) -> None:
    """BERT of width 32, 2 layers, feed-forward 64, 64 positions, 2 labels. Its embeddings (word, position, token type
    and their LayerNorm) are left out of the 6 FLOPs per parameter; the rest, counted from the config: per layer the
    attention's q, k, v and output projections 4 x (32 x 32 + 32) = 4224, two LayerNorms 2 x 64, the feed-forward
    32 x 64 + 64 = 2112 and 64 x 32 + 32 = 2080: 8544; two layers 17088, the pooler 32 x 32 + 32 = 1056 and the head
    32 x 2 + 2 = 66: 18210. Attention adds 12 x layers x width x seq_len."""
    directory = tiny_bert(tmp_path / "bert", WORDS)
    model = hf.HFSequenceModel(2, hf.config(directory, ["neg", "pos"], 2, 16)["hf_config"], str(directory))
    vocab = 5 + len(WORDS)  # the 5 special tokens and the words
    embeddings = vocab * 32 + 64 * 32 + 2 * 32 + 2 * 32
    non_embedding = 2 * (4 * (32 * 32 + 32) + 2 * 64 + (32 * 64 + 64) + (64 * 32 + 32)) + (32 * 32 + 32) + (32 * 2 + 2)
    assert non_embedding == 18210
    assert sum(q.numel() for q in model.parameters()) == embeddings + non_embedding  # the hand count is the model
    assert model.flops_per_token(16) == 6 * 18210 + 12 * 2 * 32 * 16
    assert model.flops_per_token(1) == 6 * 18210 + 12 * 2 * 32


def test_flops_per_token_of_a_tiny_gpt2_leave_out_its_token_and_position_embeddings(tmp_path: Path) -> None:
    """GPT-2 of width 32, 2 layers, 64 positions, 2 labels: wte and wpe are the embeddings. The rest: per layer two
    LayerNorms 2 x 64, c_attn 32 x 96 + 96 = 3168, the attention's c_proj 32 x 32 + 32 = 1056, the MLP's c_fc
    32 x 128 + 128 = 4224 and c_proj 128 x 32 + 32 = 4128: 12704; two layers 25408, ln_f 64 and the bias-free score
    32 x 2 = 64: 25536."""
    directory = tiny_decoder(tmp_path / "gpt2", WORDS, kind="gpt2")
    model = hf.HFSequenceModel(2, hf.config(directory, ["neg", "pos"], 2, 16)["hf_config"], str(directory))
    vocab = 1 + len(WORDS) + 1  # "!", the words, "<unk>"
    embeddings = vocab * 32 + 64 * 32
    non_embedding = 2 * (2 * 64 + (32 * 96 + 96) + (32 * 32 + 32) + (32 * 128 + 128) + (128 * 32 + 32)) + 64 + 64
    assert non_embedding == 25536
    assert sum(q.numel() for q in model.parameters()) == embeddings + non_embedding
    assert model.flops_per_token(16) == 6 * 25536 + 12 * 2 * 32 * 16


# --- precision: the determinism and TF32 switches ---------------------------------------------------------------------


@pytest.fixture
def backends(monkeypatch: pytest.MonkeyPatch):
    """The global switches configure_backends sets, restored after the test (the rest of the suite runs in-process)."""
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.are_deterministic_algorithms_enabled(),
    )
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[0], saved[1]
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[2], saved[3]
    torch.use_deterministic_algorithms(saved[4])


def _switches() -> tuple[bool, bool, bool, bool, bool, str | None]:
    import os

    return (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.are_deterministic_algorithms_enabled(),
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )


def test_deterministic_sets_every_switch_and_tf32_follows_the_params_on_cuda_only(backends: None) -> None:
    """train.deterministic: cuDNN deterministic and not benchmarking, deterministic algorithms, cuBLAS's fixed
    workspace. TF32 is set from train.tf32 for a CUDA device (the flags are plain settings: no GPU is needed to set
    them) and left alone for the CPU. Turning determinism off again switches the algorithms back."""
    from trainflow.engine.precision import configure_backends

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = True, False
    torch.use_deterministic_algorithms(False)
    configure_backends(TrainParams(deterministic=True, tf32=True), torch.device("cpu"))
    assert _switches() == (False, False, False, True, True, ":4096:8")
    configure_backends(TrainParams(deterministic=True, tf32=True), torch.device("cuda", 0))
    assert _switches() == (True, True, False, True, True, ":4096:8")
    configure_backends(TrainParams(deterministic=False, tf32=False), torch.device("cuda", 0))
    assert _switches()[:2] + _switches()[4:5] == (False, False, False)
