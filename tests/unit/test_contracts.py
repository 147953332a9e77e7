"""Contracts others rely on: params errors and CLI exit codes, accumulation ≡ large batch, skip on non-finite,
pickle-free checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from trainflow import cli
from trainflow.engine.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from trainflow.engine.precision import Precision, resolve_precision
from trainflow.engine.trainer import NonFiniteError, Split, Trainer, epoch_order
from trainflow.errors import ParamsError
from trainflow.models import MLP
from trainflow.params import TrainParams, load_params, write_overrides

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def params_file(tmp_path: Path) -> Path:
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    return tmp_path / "params.yaml"


def test_every_problem_is_reported_with_its_dotted_path(params_file: Path) -> None:
    with pytest.raises(ParamsError) as err:
        load_params(params_file, ["train.lr=-1", "train.lrr=3", "split.val_fraction=0.5", "split.test_fraction=0.45"])
    paths = [p for p, _ in err.value.problems]
    assert "train.lr" in paths and "train.lrr" in paths and "split" in paths


def test_overrides_take_yaml_values_and_are_written_keeping_comments(params_file: Path) -> None:
    p = load_params(params_file, ["data.exclude=[a,b]", "train.max_grad_norm=null", "train.lr=3e-4"])
    assert p.data.exclude == ["a", "b"] and p.train.max_grad_norm is None and p.train.lr == 3e-4
    write_overrides(params_file, ["train.lr=0.0003"])
    text = params_file.read_text()
    assert "lr: 0.0003" in text and "# micro-batch size" in text
    before = params_file.read_bytes()
    with pytest.raises(ParamsError):
        write_overrides(params_file, ["train.lr=-1"])
    assert params_file.read_bytes() == before


def test_params_check_exits_2_naming_both_fields_and_changes_nothing(
    params_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = params_file.parent
    monkeypatch.chdir(root)
    before = params_file.read_bytes()
    assert cli.main(["params", "check", "-S", "train.lr=-1", "-S", "train.lrr=3"]) == 2
    err = capsys.readouterr().err
    assert "train.lr:" in err and "train.lrr:" in err
    assert params_file.read_bytes() == before
    assert sorted(p.name for p in root.iterdir()) == ["params.yaml"]
    assert cli.main(["params", "check"]) == 0
    assert cli.main(["params", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert set(schema["properties"]) == {"seed", "data", "split", "model", "train", "evaluate", "register", "tracking"}


def test_every_field_has_a_description() -> None:
    from trainflow.params import schema

    s = schema()
    for name, definition in s["$defs"].items():
        for field, spec in definition["properties"].items():
            assert spec.get("description"), f"{name}.{field} has no description"


def test_fp16_needs_cuda() -> None:
    with pytest.raises(ParamsError, match="train.precision"):
        resolve_precision("fp16", torch.device("cpu"))
    assert resolve_precision("auto", torch.device("cpu")).name == "fp32"


# --- the engine against plain PyTorch ---------------------------------------------------------------------------


def data(n: int = 203, features: int = 6, classes: int = 3) -> Split:
    g = torch.Generator().manual_seed(0)
    return Split(torch.randn(n, features, generator=g), torch.randint(0, classes, (n,), generator=g))


def trainer(tmp: Path, batch_size: int, accumulate: int, **kw: object) -> Trainer:
    torch.manual_seed(1)
    model = MLP(6, 3, [16], dropout=0.0)
    settings: dict[str, object] = {
        "epochs": 3,
        "max_grad_norm": None,
        "progress": False,
        "resume": "never",
        "weight_decay": 0.0,
        "patience": 100,
    }
    p = TrainParams.model_validate({**settings, **kw, "batch_size": batch_size, "accumulate": accumulate})
    return Trainer(
        model,
        p,
        seed=7,
        device=torch.device("cpu"),
        precision=Precision("fp32", "cpu"),
        loss_fn=torch.nn.CrossEntropyLoss(reduction="none"),
        checkpoint_dir=tmp,
        fingerprint="x",
    )


def flat(t: Trainer) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in t.model.parameters()])


def test_accumulation_equals_large_batch_with_a_partial_window(tmp_path: Path) -> None:
    train = data()  # 203 samples: windows of 32 leave a last window of 11
    big = trainer(tmp_path / "a", batch_size=32, accumulate=1)
    big.fit(train, train)
    small = trainer(tmp_path / "b", batch_size=8, accumulate=4)
    small.fit(train, train)
    assert big.state.updates == small.state.updates == 3 * 7 >= 20
    rel = (flat(big) - flat(small)).norm() / flat(big).norm()
    assert rel <= 1e-5


def test_trainer_matches_a_hand_written_loop(tmp_path: Path) -> None:
    train = data()
    t = trainer(tmp_path, batch_size=8, accumulate=4)
    torch.manual_seed(1)
    ref = MLP(6, 3, [16], dropout=0.0)
    decay = [p for p in ref.parameters() if p.ndim >= 2]
    no_decay = [p for p in ref.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.0}, {"params": no_decay, "weight_decay": 0.0}])
    t.fit(train, train)
    update = 0
    for epoch in range(3):
        order = epoch_order(len(train), 7, epoch)
        for start in range(0, len(train), 32):
            idx = order[start : start + 32]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(ref(train.x[idx]), train.y[idx], reduction="sum") / len(idx)
            loss.backward()
            for g in opt.param_groups:
                g["lr"] = t.lr_at(update)
            opt.step()
            update += 1
    ref_flat = torch.cat([p.detach().flatten() for p in ref.parameters()])
    assert ((flat(t) - ref_flat).norm() / ref_flat.norm()) <= 1e-5


def test_non_finite_updates_are_skipped_without_advancing_the_schedule(tmp_path: Path) -> None:
    t = trainer(tmp_path, batch_size=8, accumulate=1, max_nonfinite=3)
    train = data()
    before = flat(t).clone()
    x = train.x[:8].clone()
    x[0, 0] = float("inf")
    for _ in range(2):
        t.train_step(x, train.y[:8])
    assert t.state.updates == 0 and t.state.skipped == 2
    assert torch.equal(flat(t), before)
    t.train_step(train.x[:8], train.y[:8])  # a finite update resets the consecutive count
    assert t.state.updates == 1
    with pytest.raises(NonFiniteError, match="3 consecutive"):
        for _ in range(3):
            t.train_step(x, train.y[:8])


def test_resume_after_a_crash_is_bit_identical(tmp_path: Path) -> None:
    train = data()
    full = trainer(tmp_path / "full", batch_size=16, accumulate=2, epochs=4)
    full.fit(train, train)

    class Crash(Exception):
        pass

    class CrashAt:
        def log(self, metrics: dict[str, float], step: int) -> None:
            if step == 3:
                raise Crash

        def close(self) -> None:
            pass

    crashed = trainer(tmp_path / "b", batch_size=16, accumulate=2, epochs=4)
    crashed.logger = CrashAt()
    with pytest.raises(Crash):
        crashed.fit(train, train)
    resumed = trainer(tmp_path / "b", batch_size=16, accumulate=2, epochs=4, resume="auto")
    resumed.fit(train, train)
    assert resumed.state.epoch == 4
    assert all(torch.equal(a, b) for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values()))


def test_checkpoints_refuse_pickles_and_truncated_tensors(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    save_checkpoint(ckpt, {"model": {"w": torch.arange(1000.0)}}, {"epoch": 1})
    assert torch.equal(load_checkpoint(ckpt).tensors["model"]["w"], torch.arange(1000.0))
    (ckpt / "extra.pkl").write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(CheckpointError, match="extra.pkl"):
        load_checkpoint(ckpt)
    (ckpt / "extra.pkl").unlink()
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(ckpt)
