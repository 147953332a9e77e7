"""A preempted run in one process (trainflow.engine.preempt): the signal stops training after the update it arrived in,
and the marker beside the checkpoints says so for a job script. (Preemption across ranks: test_preempt_ranks.py; of
whole stages and flows: tests/stages/test_preempt*.py, tests/flows/test_preempt_flow.py.)"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from trainflow.core.errors import Preempted


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
