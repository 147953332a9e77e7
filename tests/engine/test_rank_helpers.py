"""What runs inside a launched rank, called here in-process (so that mutation tests reach it): the optimizer
state's name <-> id mapping of FSDP checkpoints, FSDP's shard units and BatchNorm's buffers, a rank's entry point and
the error a failed rank becomes, and the train stage's rank entry. Each compared with values worked out by hand."""

from __future__ import annotations

import json
import signal
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from trainflow.core.errors import Preempted, ServiceError, UserError
from trainflow.engine import distributed as dist_
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
