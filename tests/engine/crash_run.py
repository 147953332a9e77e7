"""A small training run for the crash tests: `python crash_run.py CHECKPOINT_DIR OUT_DIR [FLAG,...]`.

Dropout is on, so a resumed run only matches if the RNG state is restored; windows of 16 over 203 samples leave a
partial window each epoch; checkpoints every 3 updates land in the middle of epochs. Flags: `fp16` trains under fp16
autocast with a GradScaler that starts too high (its first updates overflow and are skipped) and grows every 3 finite
updates (so it overflows again, and backs off, throughout the run); `device` takes the skip decisions on the device.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from trainflow.engine.loaders import TensorData
from trainflow.engine.objective import Objective
from trainflow.engine.precision import Precision
from trainflow.engine.trainer import Trainer
from trainflow.models import MLP
from trainflow.params import TrainParams


def main(checkpoints: Path, out: Path, flags: set[str]) -> None:
    g = torch.Generator().manual_seed(0)
    data = TensorData(torch.randn(203, 6, generator=g), torch.randint(0, 3, (203,), generator=g))
    torch.manual_seed(5)
    p = TrainParams.model_validate(
        {"epochs": 4, "batch_size": 8, "accumulate": 2, "checkpoint_every": 3, "keep_last": 2, "eval_every": 5,
         "log_every": 4, "progress": False, "resume": "auto"}
    )  # fmt: skip
    t = Trainer(
        MLP(6, 3, [32], dropout=0.2),
        p,
        seed=11,
        device=torch.device("cpu"),
        precision=Precision("fp16" if "fp16" in flags else "fp32", "cpu"),
        objective=Objective("classification"),
        checkpoint_dir=checkpoints,
        fingerprint="crash-test",
    )
    if "fp16" in flags:
        t.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**22, growth_interval=3)
    t.decide_on_device = "device" in flags
    state = t.fit(data, data)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in t.model.state_dict().items()}, str(out / "final.safetensors"))
    (out / "history.json").write_text(json.dumps(state.history))
    scaler = t.scaler.state_dict() if t.scaler.is_enabled() else {}
    (out / "counts.json").write_text(json.dumps({"applied": state.applied, "updates": state.updates, **scaler}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), set(sys.argv[3].split(",")) if len(sys.argv) > 3 else set())
