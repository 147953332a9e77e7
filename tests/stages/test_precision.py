"""bf16 autocast on CPU trains the default pipeline (digits, default params) to within 1 point of fp32."""

from __future__ import annotations

from pathlib import Path

from conftest import make_project

from trainflow.io import read_json
from trainflow.params import load_params
from trainflow.paths import Paths
from trainflow.stages import run_stage


def accuracy(root: Path) -> tuple[float, str]:
    paths = Paths(root)
    for stage in ("ingest", "split", "train", "evaluate"):
        run_stage(stage, load_params(paths.params), paths)
    return read_json(paths.metrics)["accuracy"], read_json(paths.final / "training.json")["precision"]


def test_bf16_on_cpu_is_within_one_point_of_fp32(tmp_path: Path) -> None:
    fp32, p32 = accuracy(make_project(tmp_path / "fp32", {"train.precision": "fp32", "train.progress": "false"}))
    bf16, p16 = accuracy(make_project(tmp_path / "bf16", {"train.precision": "bf16", "train.progress": "false"}))
    assert (p32, p16) == ("fp32", "bf16")
    assert fp32 >= 0.95
    print(f"digits test accuracy: fp32 {fp32:.4f}, bf16 {bf16:.4f}")
    assert abs(bf16 - fp32) <= 0.01, (fp32, bf16)
