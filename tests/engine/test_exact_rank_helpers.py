"""Helpers that otherwise run only inside launched ranks or subprocesses (so mutmut's in-process tests never reached
them), called here directly: the optimizer state's name <-> id mapping of FSDP checkpoints, FSDP's shard units, a
rank's entry point and the error a failed rank becomes, the train stage's rank entry, TensorBoard's failure path
and the TF32 check of the FLOPs counter. Each compared with values worked out by hand."""

from __future__ import annotations

import json
import signal
import types
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from trainflow.core.errors import Preempted, ServiceError, UserError
from trainflow.engine import distributed as dist_
from trainflow.engine.flops import _tf32_enabled
from trainflow.params import PipelineParams


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(2, 3)
        self.layers = nn.ModuleList([nn.Linear(3, 3), nn.ModuleDict({"a": nn.Linear(3, 3), "b": nn.ReLU()})])
        self.frozen = nn.Linear(3, 3).requires_grad_(False)
        self.act = nn.ReLU()
        self.head = nn.Linear(3, 1)


def test_shard_units_are_the_trainable_children_with_containers_opened() -> None:
    net = Net()
    assert list(dist_._shard_units(net)) == [net.embed, net.layers[0], net.layers[1]["a"], net.head]


def test_optimizer_state_goes_to_names_and_back_to_torchs_own_ids() -> None:
    net = Net()
    # two groups, in an order unlike the model's: the head first
    opt = torch.optim.Adam(
        [{"params": [net.head.weight, net.head.bias], "lr": 0.1}, {"params": [net.embed.weight], "lr": 0.2}]
    )
    for p in (net.head.weight, net.head.bias, net.embed.weight):
        p.grad = torch.ones_like(p)
    opt.step()
    assert dist_._param_names(net, opt) == ["head.weight", "head.bias", "embed.weight"]
    own = opt.state_dict()
    by_name = dist_._ids_to_names(own, net, opt)
    assert list(by_name["state"]) == ["head.weight", "head.bias", "embed.weight"]
    assert by_name["state"]["embed.weight"] is own["state"][2]
    assert [g["params"] for g in by_name["param_groups"]] == [["head.weight", "head.bias"], ["embed.weight"]]
    assert [g["lr"] for g in by_name["param_groups"]] == [0.1, 0.2]
    back = dist_._names_to_ids(by_name)
    assert back["param_groups"] == own["param_groups"]
    assert list(back["state"]) == [0, 1, 2] and all(back["state"][i] is own["state"][i] for i in range(3))


def test_names_to_ids_numbers_parameters_in_group_order_not_state_order() -> None:
    state = {
        "state": {"b": {"step": 2}, "a": {"step": 1}},
        "param_groups": [{"params": ["a"], "lr": 1}, {"params": ["c", "b"], "lr": 2}],
    }
    assert dist_._names_to_ids(state) == {
        "state": {2: {"step": 2}, 0: {"step": 1}},
        "param_groups": [{"params": [0], "lr": 1}, {"params": [1, 2], "lr": 2}],
    }


def test_ids_to_names_reads_string_ids_as_a_loaded_checkpoint_has_them() -> None:
    net = Net()
    opt = torch.optim.SGD([net.head.bias, net.embed.bias], lr=0.1)
    state = {"state": {"1": {"m": 5}}, "param_groups": [{"params": [0, 1], "lr": 0.1}]}
    assert dist_._ids_to_names(state, net, opt) == {
        "state": {"embed.bias": {"m": 5}},
        "param_groups": [{"params": ["head.bias", "embed.bias"], "lr": 0.1}],
    }


def test_buffers_are_the_running_statistics_and_the_count() -> None:
    norm = nn.BatchNorm1d(2)
    mean, var, tracked = dist_._buffers(norm)
    assert mean is norm.running_mean and var is norm.running_var and tracked is norm.num_batches_tracked


def test_a_rank_returns_its_result_and_a_users_error_is_printed_with_its_rank_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RANK", "1")
    assert dist_._entry([], lambda a, b: a + b, 2, 3) == 5

    def bad() -> None:
        raise UserError("train.lr: must be positive")

    with pytest.raises(SystemExit) as exc:
        dist_._entry([], bad)
    assert exc.value.code == 2 and capsys.readouterr().err == "rank 1: train.lr: must be positive\n"

    def crash() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):  # anything else: the launcher reports it (exit 1)
        dist_._entry([], crash)


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_preempted_rank_returns_what_it_stopped_at_for_the_launcher_to_raise_once(
    rank: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # An exit code other than 0 would have torch's launcher log a failure with a traceback and SIGTERM the others.
    monkeypatch.setenv("RANK", rank)

    def preempted() -> None:
        raise Preempted("stopped after update 7")

    assert dist_._entry(["SIGUSR1"], preempted) == dist_.Stopped("stopped after update 7")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("code", "kind", "said"),
    [
        (2, UserError, "rank 3 of the distributed run failed; its error is printed above (the others stopped)"),
        (
            -signal.SIGKILL,
            dist_.RankFailed,
            "rank 3 of the distributed run was killed by SIGKILL; the other ranks were stopped. Rerun the stage: it "
            "resumes from the last checkpoint",
        ),
        (
            1,
            dist_.RankFailed,
            "rank 3 of the distributed run exited with code 1; the other ranks were stopped. Rerun the stage: it "
            "resumes from the last checkpoint",
        ),
    ],
)
def test_a_failed_rank_becomes_the_error_its_exit_code_means(code: int, kind: type, said: str) -> None:
    error = dist_._rank_error(3, types.SimpleNamespace(exitcode=code))
    assert type(error) is kind and str(error) == said
    assert issubclass(dist_.RankFailed, ServiceError)


def test_the_train_stages_rank_entry_validates_params_makes_the_root_importable_and_reads_the_world_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainflow.stages
    from trainflow.stages import train as stage

    calls: list[Any] = []
    monkeypatch.setattr(trainflow.stages, "importable", lambda root: calls.append(("importable", root)))

    def train_ranks(params: Any, logged: Any, paths: Any, world: int) -> dict[str, int]:
        calls.append((params, logged, paths, world))
        return {"ok": 1}

    monkeypatch.setattr(stage, "train_ranks", train_ranks)
    monkeypatch.setenv("WORLD_SIZE", "4")
    sections = stage.Training(**PipelineParams.model_validate({"train": {"lr": 0.25}}).sections(stage.Training.names()))
    raw = json.loads(json.dumps(sections.dump()))  # what the launcher sends: JSON
    assert stage._rank(raw, {"logged": "as sent"}, str(tmp_path)) == {"ok": 1}
    assert calls[0] == ("importable", tmp_path)
    params, logged, paths, world = calls[1]
    assert params == sections and logged == {"logged": "as sent"}
    assert (params.train.lr, paths.root, world) == (0.25, tmp_path, 4)


# --- TensorBoard: a writer that fails ---------------------------------------------------------------------------


class Writer:
    def __init__(self, fail_on: str) -> None:
        self.fail_on, self.closed, self.points = fail_on, 0, []

    def add_scalar(self, key: str, value: float, step: int) -> None:
        if self.fail_on == "write":
            raise OSError("disk full")
        self.points.append((key, value, step))

    def close(self) -> None:
        self.closed += 1
        if self.fail_on == "close":
            raise OSError("gone")


@pytest.mark.parametrize(("fail_on", "what"), [("write", "writing metrics"), ("close", "closing the event file")])
def test_a_failing_tensorboard_writer_warns_once_and_is_dropped(fail_on: str, what: str, tmp_path: Path) -> None:
    from trainflow.tracking import TensorBoardLogger

    logger = TensorBoardLogger.__new__(TensorBoardLogger)
    writer = Writer(fail_on)
    logger.log_dir, logger.error, logger._writer = tmp_path / "tb", None, writer
    exc = "OSError: disk full" if fail_on == "write" else "OSError: gone"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger.log({"loss": 1}, 3)
        logger.close()
        logger.log({"loss": 2}, 4)  # dropped: nothing more is written
        logger.close()
    assert logger.error == f"{what}: {exc}" and logger._writer is None
    assert [str(w.message) for w in caught] == [
        f"TensorBoard logging to {tmp_path / 'tb'} failed while {what} ({exc}); training goes on without it (MLflow "
        "still has the metrics)"
    ]
    # a failed write closes the writer, then close() finds none; a failed close is that one close
    assert writer.closed == 1
    assert writer.points == ([] if fail_on == "write" else [("loss", 1.0, 3)])


def test_a_tensorboard_writer_that_cannot_open_warns_and_logs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.utils.tensorboard

    from trainflow.tracking import TensorBoardLogger

    def refuse(log_dir: str) -> None:
        raise PermissionError(f"no access to {log_dir}")

    monkeypatch.setattr(torch.utils.tensorboard, "SummaryWriter", refuse)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger = TensorBoardLogger(tmp_path / "tb")
        logger.log({"loss": 1.0}, 1)
        logger.close()
    assert logger.error == f"opening the event file: PermissionError: no access to {tmp_path / 'tb'}"
    assert len(caught) == 1 and "failed while opening the event file (PermissionError" in str(caught[0].message)


# --- the FLOPs counter's TF32 check -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ([], False),
        ([("precision", "high")], True),
        ([("precision", "medium")], True),
        ([("allow", True)], True),
        ([("precision", "high"), ("allow", False)], False),  # the last word wins: no longer tf32
        ([("allow", True), ("precision", "highest")], False),
    ],
)
def test_tf32_is_enabled_by_either_api_and_the_last_setting_wins(settings: list, expected: bool) -> None:
    """A user's torch.set_float32_matmul_precision("high") and then train.tf32: false (configure_backends sets the
    legacy flag) once made the FLOPs counter raise torch's "mix of the legacy and new APIs" RuntimeError."""
    saved = torch.backends.cuda.matmul.fp32_precision
    try:
        for api, value in settings:
            if api == "precision":
                torch.set_float32_matmul_precision(value)
            else:
                torch.backends.cuda.matmul.allow_tf32 = value
        assert _tf32_enabled() is expected
    finally:
        torch.backends.cuda.matmul.fp32_precision = saved


# --- what another process reads: the workspace's holder, the MLflow pyfunc -------------------------------------------


def test_the_holder_of_a_workspace_is_named_from_its_record_or_as_another_process(tmp_path: Path) -> None:
    import datetime
    import json

    from trainflow.core.workspace import holder, lock_file

    record = lock_file(tmp_path).with_suffix(".json")
    assert holder(tmp_path) == "another process"  # no record
    record.parent.mkdir(parents=True, exist_ok=True)
    since = 1_780_000_000.5
    started = datetime.datetime.fromtimestamp(since).strftime("%Y-%m-%d %H:%M:%S")
    record.write_text(json.dumps({"command": "trainflow run", "pid": 4242, "since": since}))
    assert holder(tmp_path) == f"`trainflow run` (pid 4242, since {started})"
    for broken in ("{", json.dumps({"command": "x", "since": since}), json.dumps({"command": "x", "pid": 1,
                   "since": "soon"}), json.dumps({"command": "x", "pid": 1, "since": None}), "[]"):  # fmt: skip
        record.write_text(broken)
        assert holder(tmp_path) == "another process", broken


def test_the_pyfunc_loads_the_exported_model_from_its_data_and_predicts_a_frame(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pandas as pd

    from trainflow import serving

    loaded: list[Path] = []

    class Exported:
        def predict_frame(self, frame: pd.DataFrame) -> pd.DataFrame:
            return frame.assign(prediction=frame["x"] * 2)

    monkeypatch.setattr(serving.ExportedModel, "load", staticmethod(lambda path: loaded.append(path) or Exported()))
    model = serving._load_pyfunc(str(tmp_path / "final"))
    assert loaded == [tmp_path / "final"]
    out = model.predict({"x": [1, 2]})  # a dict (MLflow's JSON input) becomes a frame
    pd.testing.assert_frame_equal(out, pd.DataFrame({"x": [1, 2], "prediction": [2, 4]}))
    frame = pd.DataFrame({"x": [5]})
    pd.testing.assert_frame_equal(model.predict(frame, params=None), pd.DataFrame({"x": [5], "prediction": [10]}))
