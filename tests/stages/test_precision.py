"""bf16 autocast and fp16 autocast + GradScaler on CPU train the default pipeline (digits, default params) to within
1 point of fp32's test accuracy."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.projects import make_project

from trainflow.core.io import read_json
from trainflow.core.paths import Paths
from trainflow.params import load_params
from trainflow.stages import run_stage


def accuracy(root: Path) -> tuple[float, str]:
    paths = Paths(root)
    for stage in ("ingest", "split", "train", "evaluate"):
        run_stage(stage, load_params(paths.params), paths)
    return read_json(paths.metrics)["accuracy"], read_json(paths.final / "training.json")["precision"]


@pytest.mark.slow  # three trainings, 18 s: in the slow tier, for README line 2's 10 minutes
def test_bf16_and_fp16_on_cpu_are_within_one_point_of_fp32(tmp_path: Path) -> None:
    runs = {
        name: accuracy(make_project(tmp_path / name, {"train.precision": name, "train.progress": "false"}))
        for name in ("fp32", "bf16", "fp16")
    }
    assert {name: used for name, (_, used) in runs.items()} == {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}
    fp32, bf16, fp16 = (runs[name][0] for name in ("fp32", "bf16", "fp16"))
    print(f"digits test accuracy: fp32 {fp32:.4f}, bf16 {bf16:.4f}, fp16 {fp16:.4f}")
    assert fp32 >= 0.96
    assert abs(bf16 - fp32) <= 0.01, (fp32, bf16)
    assert abs(fp16 - fp32) <= 0.01, (fp32, fp16)
