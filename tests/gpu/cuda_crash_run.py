"""A small training run on the GPU for the crash tests: `python cuda_crash_run.py CHECKPOINT_DIR OUT_DIR [FLAG,...]`.

tests/engine/crash_run.py on CUDA, with `train.deterministic: true`: dropout on (the resumed run matches only if the
GPU's random state is restored), windows of 16 over 203 samples (a partial window each epoch), checkpoints every 3
updates (in the middle of epochs). Flags: `fp16` trains under fp16 autocast with CUDA's GradScaler started too high
(its first updates overflow and are skipped) and growing every 3 finite updates (it overflows again, and backs off,
throughout the run); `text` trains a text transformer (attention, embeddings) in bf16 instead of the mlp.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from trainflow.engine.loaders import Dataset, TensorData, TextData
from trainflow.engine.objective import Objective
from trainflow.engine.precision import Precision
from trainflow.engine.trainer import Trainer
from trainflow.models import MLP
from trainflow.models.text import TextTransformer
from trainflow.params import TrainParams

CUDA = torch.device("cuda", 0)


def data_and_model(text: bool) -> tuple[Dataset, torch.nn.Module]:
    g = torch.Generator().manual_seed(0)
    if text:
        lengths = torch.randint(2, 40, (203,), generator=g).tolist()
        data: Dataset = TextData([torch.randint(1, 50, (k,), generator=g) for k in lengths],
                                 torch.randint(0, 4, (203,), generator=g), device=CUDA)  # fmt: skip
        torch.manual_seed(5)
        return data, TextTransformer(50, 4, d_model=32, n_heads=2, n_layers=2, max_len=64, dropout=0.2)
    data = TensorData(torch.randn(203, 6, generator=g), torch.randint(0, 3, (203,), generator=g), CUDA)
    torch.manual_seed(5)
    return data, MLP(6, 3, [32], dropout=0.2)


def main(checkpoints: Path, out: Path, flags: set[str]) -> None:
    data, model = data_and_model("text" in flags)
    p = TrainParams.model_validate(
        {"epochs": 4, "batch_size": 8, "accumulate": 2, "checkpoint_every": 3, "keep_last": 2, "eval_every": 5,
         "log_every": 4, "progress": False, "resume": "auto", "deterministic": True}
    )  # fmt: skip
    precision = "bf16" if "text" in flags else "fp16" if "fp16" in flags else "fp32"
    t = Trainer(
        model,
        p,
        seed=11,
        device=CUDA,
        precision=Precision(precision, "cuda"),
        objective=Objective("classification"),
        checkpoint_dir=checkpoints,
        fingerprint="cuda-crash-test",
    )
    if "fp16" in flags:
        t.scaler = torch.amp.GradScaler("cuda", init_scale=2.0**22, growth_interval=3)
    state = t.fit(data, data)
    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().cpu().contiguous() for k, v in t.model.state_dict().items()}
    save_file(weights, str(out / "final.safetensors"))
    (out / "history.json").write_text(json.dumps(state.history))
    scaler = t.scaler.state_dict() if t.scaler.is_enabled() else {}
    (out / "counts.json").write_text(json.dumps({"applied": state.applied, "updates": state.updates, **scaler}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), set(sys.argv[3].split(",")) if len(sys.argv) > 3 else set())
