"""train.precision: fp8 (torchao's float8 training) where it cannot run is a params error naming train.precision and
the fix: on the CPU (through `trainflow stage train`, exit 2), on a GPU before Hopper, without torchao, with fsdp, and
for a model with no Linear layer to convert. Where it can, the Trainer converts the chosen layers once, before
wrapping the model, and the state dict stays the plain model's. tests/gpu/test_fp8.py trains in fp8 on an H100/H200.

torchao is an extra (pip install -e '.[fp8]'), not in the dev install: these tests stand a module in for it, and the
last one, which converts and trains with the real torchao on the CPU, runs only where it is installed."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_kit import make_trainer, mlp, text_data, text_model
from support.cli import fake_module
from support.projects import REPO
from torch import nn

from trainflow import cli
from trainflow.core.errors import ParamsError
from trainflow.core.paths import Paths
from trainflow.engine.distributed import Group
from trainflow.engine.precision import apply_fp8, fp8_layers, resolve_precision
from trainflow.models import build_model
from trainflow.params import load_params
from trainflow.stages import run_stage

REFUSED = "fp8 needs an NVIDIA H100/H200-class GPU (compute capability 9.0+); "
TEXT_LAYERS = ["blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.mlp.0", "blocks.0.mlp.3"]  # text_model's, not head


def gpu_like(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], name: str) -> None:
    """Pretend the CUDA device is a GPU of this compute capability and name."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


def stand_in_torchao(monkeypatch: pytest.MonkeyPatch, converted: list[tuple[nn.Module, list[str], Any]]) -> None:
    """A torchao.float8 whose convert_to_float8_training records the model, the Linear layers its filter passes and
    the config's settings."""

    def convert(model: nn.Module, *, module_filter_fn: Any, config: Any) -> nn.Module:
        named = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and module_filter_fn(m, n)]
        converted.append((model, named, config))
        return model

    fake_module(monkeypatch, "torchao")
    fake_module(monkeypatch, "torchao.float8", convert_to_float8_training=convert, Float8LinearConfig=dict)
    monkeypatch.setattr(sys.modules["torchao"], "float8", sys.modules["torchao.float8"], raising=False)


def refusal(caught: pytest.ExceptionInfo[ParamsError]) -> str:
    """The one problem of a ParamsError on train.precision, its message."""
    assert caught.value.exit_code == 2
    [(field, message)] = caught.value.problems
    assert field == "train.precision"
    return message


def test_fp8_on_the_cpu_is_refused_through_the_train_stage(
    iris_project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = Paths(iris_project)
    for stage in ("ingest", "split"):
        run_stage(stage, load_params(paths.params), paths)
    monkeypatch.chdir(iris_project)
    params = paths.params.read_bytes()
    assert cli.main(["stage", "train", "-S", "train.precision=fp8"]) == 2
    err = capsys.readouterr().err
    assert f"  train.precision: {REFUSED}this run is on cpu: use bf16 or auto\n" in err, err
    assert paths.params.read_bytes() == params and not paths.final.exists()  # nothing trained, params.yaml as it was


def test_fp8_on_the_cpu_is_refused_before_torchao_is_looked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchao", None)  # where torchao is missing too, the device is what to fix first
    with pytest.raises(ParamsError) as caught:
        resolve_precision("fp8", torch.device("cpu"))
    assert refusal(caught) == f"{REFUSED}this run is on cpu: use bf16 or auto"


@pytest.mark.parametrize(
    ("capability", "name"), [((8, 0), "NVIDIA A100-SXM4-80GB"), ((8, 9), "NVIDIA L4"), ((7, 5), "Tesla T4")]
)
def test_fp8_on_a_gpu_before_hopper_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], name: str
) -> None:
    gpu_like(monkeypatch, capability, name)
    stand_in_torchao(monkeypatch, [])  # installed: the GPU alone is the problem
    with pytest.raises(ParamsError) as caught:
        resolve_precision("fp8", torch.device("cuda"))
    major, minor = capability
    assert refusal(caught) == (
        f"{REFUSED}this run's GPU, {name}, has compute capability {major}.{minor}: use bf16 or auto"
    )


def test_fp8_without_torchao_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu_like(monkeypatch, (9, 0), "NVIDIA H100 80GB HBM3")
    monkeypatch.setitem(sys.modules, "torchao", None)  # `import torchao.float8` raises ImportError
    with pytest.raises(ParamsError) as caught:
        resolve_precision("fp8", torch.device("cuda"))
    message = refusal(caught)
    assert message.startswith("fp8 trains through torchao's float8 training, which cannot be imported (")
    assert message.endswith(
        "pip install -e '.[fp8]' (or pip install 'torchao>=0.17': 0.17 is the first for torch 2.11+), or use bf16"
    )
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["fp8"] == ["torchao>=0.17"]  # what the message tells users to install


def test_fp8_on_hopper_with_torchao_autocasts_in_bf16_without_a_scaler(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu_like(monkeypatch, (9, 0), "NVIDIA H200")
    stand_in_torchao(monkeypatch, [])
    p = resolve_precision("fp8", torch.device("cuda"))
    assert (p.name, p.device_type, p.dtype, p.uses_scaler) == ("fp8", "cuda", torch.bfloat16, False)


def test_fp8_converts_the_linear_layers_of_sizes_multiple_of_16_but_not_the_head() -> None:
    assert fp8_layers(text_model("sequence")) == TEXT_LAYERS  # head: 16 -> 4
    # A head of 16 classes stays out too (the last Linear); 6 -> 16 is not a multiple of 16 on both sides.
    assert fp8_layers(nn.Sequential(nn.Linear(6, 16), nn.Linear(16, 32), nn.Linear(32, 16))) == ["1"]
    cnn = build_model({"name": "cnn", "in_channels": 3, "out_features": 16, "channels": [32, 64]})
    assert fp8_layers(cnn) == [] and fp8_layers(mlp()) == []  # their Linear layers: the head, and 6 -> 16


@pytest.mark.parametrize("name", ["mlp", "cnn", "one Linear"])
def test_fp8_on_a_model_with_nothing_to_convert_is_refused(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    model = {
        "mlp": mlp,
        "cnn": lambda: build_model({"name": "cnn", "in_channels": 3, "out_features": 4, "channels": [32, 64]}),
        "one Linear": lambda: nn.Linear(32, 32),
    }[name]()
    monkeypatch.setitem(sys.modules, "torchao", None)  # known before torchao is needed
    with pytest.raises(ParamsError) as caught:
        apply_fp8(model)
    assert refusal(caught) == (
        "fp8 converts Linear layers whose sizes are multiples of 16, other than the output head, and "
        f"{type(model).__name__} has none: use bf16"
    )


def test_the_trainer_converts_the_model_once_before_wrapping_it_and_only_for_fp8(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    converted: list[tuple[nn.Module, list[str], Any]] = []
    stand_in_torchao(monkeypatch, converted)
    model = text_model("token")
    t = make_trainer(tmp_path / "fp8", model, precision="fp8")
    # torchao's default recipe (dynamic tensorwise scaling), its matmuls padded to multiples of 16 rows
    assert converted == [(model, TEXT_LAYERS, {"pad_inner_dim": True})] and t.model is model and t.wrapped is model
    make_trainer(tmp_path / "bf16", text_model("token"), precision="bf16")
    assert len(converted) == 1


def test_fp8_with_fsdp_is_refused_naming_train_strategy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    converted: list[tuple[nn.Module, list[str], Any]] = []
    stand_in_torchao(monkeypatch, converted)
    with pytest.raises(ParamsError) as caught:
        make_trainer(tmp_path, text_model("token"), precision="fp8", group=Group(world_size=2, strategy="fsdp"))
    [(field, message)] = caught.value.problems
    assert field == "train.strategy" and message.startswith("fp8 is not offered with fsdp: ")
    assert message.endswith("; use strategy ddp") and converted == []


@pytest.mark.slow  # the slow tier installs torchao (the fp8 extra; scripts/test.sh --slow)
def test_fp8_trains_on_the_cpu_and_keeps_the_plain_state_dict(tmp_path: Path) -> None:
    """torch's float8 matmul runs on the CPU too: the real torchao converts and trains here, where it is installed."""
    float8 = pytest.importorskip("torchao.float8.float8_linear")
    plain = {k: (v.dtype, v.shape) for k, v in text_model("token").state_dict().items()}
    t = make_trainer(tmp_path, text_model("token"), precision="fp8", epochs=2, batch_size=8)
    assert [n for n, m in t.model.named_modules() if isinstance(m, float8.Float8Linear)] == TEXT_LAYERS
    data = text_data()
    state = t.fit(data, data)
    assert state.applied == state.updates == 12 and t.final_weights is not None
    # What the export saves and loads into the plain model: the same keys, float32 tensors, nothing of torchao.
    assert {k: (v.dtype, v.shape) for k, v in t.final_weights.items()} == plain
    assert {type(v) for v in t.final_weights.values()} == {torch.Tensor}
    text_model("token").load_state_dict(t.final_weights)  # strict
