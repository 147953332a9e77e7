"""Behaviours a mutation run showed no test pinned: what `trainflow data add` says when `dvc add` fails and which
resource its event names, the paired comparison's slice table, the JSON `trainflow predict` prints, the marker a
preempted run leaves for a job script, the token ids of a long text cut before encoding, and the 2-D mask fallback
for a model that does not say it takes Transformers' attention backends."""

from __future__ import annotations

import json
import os
import signal
import sys
import types
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from trainflow.core.errors import Preempted, UserError
from trainflow.core.paths import Paths
from trainflow.data import arrival
from trainflow.stages import report

# --- trainflow data add ----------------------------------------------------------------------------------------------


def _failing_dvc(stdout: str, stderr: str) -> types.SimpleNamespace:
    """Stands in for the subprocess module arrival runs `python -m dvc add` with: the command fails with this output."""

    def run(cmd: list[str], **kwargs: Any) -> types.SimpleNamespace:
        assert cmd[1:4] == ["-m", "dvc", "add"], cmd
        return types.SimpleNamespace(returncode=1, stdout=stdout, stderr=stderr)

    return types.SimpleNamespace(run=run)


@pytest.mark.parametrize(
    ("stdout", "stderr", "shown"),
    [
        ("", "ERROR: unexpected error - disk full\n", "ERROR: unexpected error - disk full"),
        ("progress line\n", "ERROR: output 'data/raw/new.csv' is ignored\n", "ERROR: output 'data/raw/new.csv' is"),
        ("ERROR: only on stdout\n", "", "ERROR: only on stdout"),
        ("", "", "exit code 1, no output"),
    ],
)
def test_a_failed_dvc_add_names_what_dvc_said_on_stderr_else_on_stdout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stdout: str, stderr: str, shown: str
) -> None:
    (tmp_path / ".dvc").mkdir()  # a DVC project: the file gets tracked
    dest = tmp_path / "data/raw/new.csv"
    monkeypatch.setattr(arrival, "subprocess", _failing_dvc(stdout, stderr))
    with pytest.raises(UserError) as caught:
        arrival._dvc_add(Paths(tmp_path), dest)
    message = str(caught.value)
    assert "`dvc add data/raw/new.csv` failed: " + shown in message
    assert message.endswith("; fix that and run it yourself")
    if stderr:
        assert "progress line" not in message  # stdout is only the fallback


def test_the_data_added_event_is_about_the_deployment_and_names_the_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    sent: list[Any] = []

    async def send(events: list[Any]) -> None:  # instead of the Prefect events client: nothing leaves the machine
        sent.extend(events)

    monkeypatch.setattr(arrival, "_send", send)
    added = [arrival.Added("data/raw/sales/feb.csv", "ab" * 32, 30, new=True)]
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        assert arrival.emit_events("nightly", Paths(tmp_path), added) is True
    [event] = sent
    assert event.event == "trainflow.data.added"
    assert dict(event.resource) == {"prefect.resource.id": "trainflow.project.nightly",
                                    "prefect.resource.name": str(tmp_path)}  # fmt: skip
    assert event.resource.name == str(tmp_path)
    assert event.payload == {"file": "data/raw/sales/feb.csv", "sha256": "ab" * 32, "rows": 30}


# --- report ----------------------------------------------------------------------------------------------------------


def test_the_paired_comparison_by_slice_has_its_header_row() -> None:
    comparison = {
        "confidence": 0.95,
        "challenger": 0.9,
        "champion": 0.85,
        "improvement": 0.05,
        "low": 0.01,
        "high": 0.09,
        "test": "paired bootstrap",
        "rows": 200,
        "metric": "accuracy",
        "slices": [
            {"slice": "region=north", "rows": 120, "metric": "accuracy", "challenger": 0.9, "champion": 0.8,
             "improvement": 0.1, "challenger_only": 14, "champion_only": 2},
        ],
    }  # fmt: skip
    md = report.comparison_markdown(comparison)
    by_slice = md.split("By slice (for reading; the decision is on all the rows):\n\n")[1].splitlines()
    assert by_slice[0] == (
        "| slice | rows | metric | challenger | champion | improvement | only challenger right | only champion right |"
    )
    assert by_slice[1] == "|---|---|---|---|---|---|---|---|"
    assert by_slice[2] == "| region=north | 120 | accuracy | 0.9000 | 0.8000 | 0.1000 | 14 | 2 |"


# --- trainflow predict -----------------------------------------------------------------------------------------------


class _Exported:
    """Stands in for a loaded model: a regression on two features that predicts x1 + x2."""

    pre = types.SimpleNamespace(image_column=None, task="regression", width=2, target="y", columns=[])

    def predict_frame(self, frame: pd.DataFrame, batch_size: int, where: str, base: Path | None = None) -> pd.DataFrame:
        return frame.assign(prediction=frame["x1"] + frame["x2"])


@pytest.mark.parametrize("budget", [None, "0.000001"], ids=["in-memory", "streamed"])
def test_predict_prints_json_naming_the_model_it_scored_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], budget: str | None
) -> None:
    from trainflow import cli
    from trainflow.artifacts import batch_predict

    loaded: list[str] = []

    def load(model: str) -> _Exported:
        loaded.append(model)
        return _Exported()

    monkeypatch.setattr(batch_predict, "load", load)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI puts the project root on sys.path
    pd.DataFrame({"x1": [1.0, 2.0, 3.0], "x2": [10.0, 20.0, 30.0]}).to_parquet(tmp_path / "in.parquet")
    args = ["predict", "--model", "models:/sales@champion", "--input", "in.parquet", "--output", "out.csv"]
    assert cli.main([*args, *(["--memory-budget-mb", budget] if budget else [])]) == 0
    out, err = capsys.readouterr()
    assert ("streamed a block at a time" in err) == (budget is not None)  # both of predict_file's ways
    printed = json.loads(out)
    assert loaded == ["models:/sales@champion"]
    assert printed == {"model": "models:/sales@champion", "input": "in.parquet", "output": "out.csv", "rows": 3,
                       "task": "regression"}  # fmt: skip
    assert pd.read_csv(tmp_path / "out.csv")["prediction"].tolist() == [11.0, 22.0, 33.0]


# --- preemption ------------------------------------------------------------------------------------------------------


def test_a_preempted_run_leaves_a_marker_with_the_update_and_the_reason(tmp_path: Path) -> None:
    """SIGUSR1 arrives during the 3rd update's forward pass: training stops after update 3, and preempted.json beside
    the checkpoints says so for a job script behind a launcher that changes the exit code."""
    import torch

    from trainflow.engine.loaders import TensorData
    from trainflow.engine.objective import Objective
    from trainflow.engine.precision import Precision
    from trainflow.engine.preempt import PREEMPTED_MARK
    from trainflow.engine.trainer import Trainer
    from trainflow.models import MLP
    from trainflow.params import TrainParams

    torch.manual_seed(0)
    model = MLP(4, 2, [8], dropout=0.0)
    forwards = 0

    def signal_on_third_training_forward(module: torch.nn.Module, inputs: Any) -> None:
        nonlocal forwards
        if module.training:
            forwards += 1
            if forwards == 3:
                os.kill(os.getpid(), signal.SIGUSR1)

    model.register_forward_pre_hook(signal_on_third_training_forward)
    params = TrainParams.model_validate({
        "epochs": 2, "batch_size": 8, "accumulate": 1, "progress": False, "resume": "never",
        "preempt_signals": ["SIGUSR1"]})  # fmt: skip
    trainer = Trainer(model, params, seed=0, device=torch.device("cpu"), precision=Precision("fp32", "cpu"),
                      objective=Objective("classification"), checkpoint_dir=tmp_path / "ckpt",
                      fingerprint="test")  # fmt: skip
    trainer.preemptible = True
    g = torch.Generator().manual_seed(0)
    data = TensorData(torch.randn(64, 4, generator=g), torch.randint(0, 2, (64,), generator=g))
    with pytest.raises(Preempted, match="SIGUSR1 received: stopped after update 3 of 16"):
        trainer.fit(data, data)
    mark = json.loads((tmp_path / "ckpt" / PREEMPTED_MARK).read_text())
    assert mark["update"] == 3
    assert mark["why"] == "SIGUSR1 received"
    assert isinstance(mark["at"], float)


# --- text encoding ---------------------------------------------------------------------------------------------------


def test_a_long_text_whose_cut_keeps_too_few_tokens_is_encoded_whole() -> None:
    """A text longer than CHARS_PER_TOKEN * max_length is cut at its last space in the second half of that many
    characters. Here the cut keeps one unknown word (one [UNK]): too few tokens, so the whole text is encoded."""
    from trainflow.data.preprocess import CHARS_PER_TOKEN, CLS_ID, UNK_ID, encode, train_tokenizer

    tok = train_tokenizer(["a b", "b a"], vocab_size=50, max_length=8)
    a, b = tok.token_to_id("a"), tok.token_to_id("b")
    limit = CHARS_PER_TOKEN * 8
    long_text = "z" * (limit // 2 + 1) + " " + "z" * limit + " a b a b a b a b"  # z is not in the vocabulary
    [whole, short] = encode(tok, [long_text, "b a"], max_length=8)
    assert whole.dtype == "int32"
    assert whole.tolist() == [CLS_ID, UNK_ID, UNK_ID, a, b, a, b, a]  # [CLS] + 7 tokens of the whole text
    assert short.tolist() == [CLS_ID, b, a]


# --- Hugging Face models ---------------------------------------------------------------------------------------------


def test_a_model_that_does_not_declare_attention_backend_support_builds_its_own_masks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A model whose modeling module uses only the plain mask builders, but which does not declare
    `_supports_attention_backend` at all, gets the 2-D mask (None); declaring it True gets the causal mask function."""
    import torch
    from transformers import PretrainedConfig, masking_utils

    from trainflow.models.hf import _self_attention_mask

    modeling = types.ModuleType("survivors_fake_modeling")
    modeling.create_causal_mask = masking_utils.create_causal_mask  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, modeling.__name__, modeling)

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = PretrainedConfig()

        @property
        def base_model(self) -> torch.nn.Module:  # as PreTrainedModel's: the module whose code builds the masks
            return self

    class Declaring(Decoder):
        _supports_attention_backend = True

    Decoder.__module__ = Declaring.__module__ = modeling.__name__
    assert not hasattr(Decoder(), "_supports_attention_backend")
    assert _self_attention_mask(Decoder()) is None
    assert _self_attention_mask(Declaring()) is masking_utils.causal_mask_function


def test_the_distributed_backend_auto_is_nccl_on_cuda_and_gloo_on_cpu() -> None:
    import torch

    from trainflow.engine.distributed import backend_for

    assert backend_for("auto", torch.device("cuda", 0)) == "nccl"  # a device object needs no GPU to exist
    assert backend_for("auto", torch.device("cpu")) == "gloo"
    assert backend_for("gloo", torch.device("cuda", 0)) == "gloo"  # asked for: kept


def test_labels_that_differ_only_in_case_are_warned_of_and_others_are_not(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from trainflow.data.validate import infer_schema
    from trainflow.params import DataParams

    d = DataParams.model_validate({"source": "t.csv", "target": "y"})
    for labels, warned in ((["spam", "ham"], False), (["spam", "ham", "Spam"], True)):
        path = tmp_path / "t.csv"
        pd.DataFrame({"x": range(30), "y": [labels[i % len(labels)] for i in range(30)]}).to_csv(path, index=False)
        from trainflow.data.sources import read_source

        infer_schema(read_source(d, tmp_path), d)
        err = capfd.readouterr().err
        assert ("differ only in case" in err) is warned, err
        if warned:
            assert "'Spam'/'spam'" in err or "'spam'/'Spam'" in err
