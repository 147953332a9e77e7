"""What a checkpoint must match to be resumed: the training params that change the weights, the model and its code
(and a pretrained model's files), the seed, the data and the training code. A changed learning rate or a fixed engine
retrains; a changed log interval or number of processes resumes."""

from __future__ import annotations

from pathlib import Path

from trainflow.core.errors import UserError
from trainflow.core.io import sha256_files, sha256_json
from trainflow.core.paths import SPLITS, Paths
from trainflow.data.stream import Split
from trainflow.models import hf, source_files, source_hash
from trainflow.params import FeatureParams, ModelParams, TrainParams

# Train params that do not change the trained weights: a checkpoint written under other values may still be resumed.
NOT_IN_FINGERPRINT = {
    "resume",
    "progress",
    "device",
    "log_every",
    "checkpoint_every",
    "keep_last",
    "compile",
    "detect_anomaly",
    # Resources, not maths: a run resumes on another number of processes from the same data position.
    "world_size",
    "strategy",
    "backend",
    # batch_size auto's memory limit only picks how a global batch is split: exact accumulation makes the same update.
    "memory_budget_mb",
    # When a run stops to be resumed: the resumed run trains the same weights.
    "preempt_signals",
    "max_time",
    # Observes, changes nothing.
    "profile",
}


def data_hash(paths: Paths) -> str:
    # a streamed split's files: the table, once
    files = dict.fromkeys(f for s in SPLITS for f in Split.stored(paths.splits, s).files())
    return sha256_files([paths.split_schema, *files])


PACKAGE = Path(__file__).resolve().parent.parent  # trainflow/


def code_hash(package: Path = PACKAGE) -> str:
    """Hash of the code that decides the trained weights (the engine, the models, preprocessing, how the stage builds
    the training data): a fixed engine must retrain, not resume a finished run. Plots, tracking and the like are left
    out: changing them reruns the stage (DVC), which then resumes and finishes at once."""
    engine = [p for p in (package / "engine").glob("*.py") if p.name != "fingerprint.py"]  # what resumes, not how
    files = sorted([*engine, *(package / "models").glob("*.py")])
    own = [
        package / "data" / "preprocess.py",
        package / "artifacts" / "predict.py",
        package / "artifacts" / "export.py",
        package / "stages" / "train.py",
    ]
    return sha256_files([*files, *own])


def model_code_hash(model: ModelParams, root: Path) -> str:
    """The hash of model.code (a user model's source; by default trainflow's models)."""
    path = root / model.code
    if not path.exists():
        raise UserError(
            f"model.code: {model.code} does not exist under {root}; set it to the file or package of {model.name}"
        )
    return source_hash(source_files(path), root)


def fingerprint(
    *, seed: int, model: ModelParams, features: FeatureParams, train: TrainParams, data: str, root: Path
) -> str:
    """What a checkpoint must match to be resumed: training params, model and its code, seed, data, training code.
    `data`: the splits' hash (`data_hash`)."""
    pretrained = hf.directory_hash(hf.resolve(model.name, root)) if hf.is_hf(model.name) else None
    return sha256_json(
        {
            "seed": seed,
            "model": model.model_dump(),
            "model_code": model_code_hash(model, root),
            "pretrained": pretrained,  # hf: the starting weights and the tokenizer
            "features": features.model_dump(),
            "train": train.model_dump(exclude=NOT_IN_FINGERPRINT),
            "data": data,
            "code": code_hash(),
        }
    )
