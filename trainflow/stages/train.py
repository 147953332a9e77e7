"""train: fit preprocessing on train only, build the model, run the engine, export the final model, track in MLflow.

With train.world_size > 1 this process starts the ranks (torch's elastic launcher) and each runs `train()`; under an
outside torchrun it is one of them. Every rank reads the data and fits the same preprocessing; rank 0 alone talks to
MLflow, writes plots and exports (the block at the end of `train()`).
"""

from __future__ import annotations

import math
import os
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from safetensors.torch import save_file

from trainflow import plots, tracking
from trainflow.data.preprocess import Preprocessor
from trainflow.data.schema import Schema
from trainflow.engine import distributed
from trainflow.engine.objective import Objective
from trainflow.engine.precision import resolve_device, resolve_precision
from trainflow.engine.trainer import NullLogger, Trainer
from trainflow.errors import UserError
from trainflow.io import atomic_dir, sha256_files, sha256_json, write_json
from trainflow.models import build_model, source_files, source_hash, user_source
from trainflow.params import PipelineParams
from trainflow.paths import SPLITS, Paths
from trainflow.predict import CONFIG, WEIGHTS, model_inputs

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
}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def data_hash(paths: Paths) -> str:
    return sha256_files([paths.split_schema, *(paths.split_file(s) for s in SPLITS)])


PACKAGE = Path(__file__).resolve().parents[1]


def code_hash(package: Path = PACKAGE) -> str:
    """Hash of the code that decides the trained weights (the engine, the models, preprocessing, how the stage builds
    the training data): a fixed engine must retrain, not resume a finished run. Plots, tracking and the like are left
    out: changing them reruns the stage (DVC), which then resumes and finishes at once."""
    files = sorted([*(package / "engine").glob("*.py"), *(package / "models").glob("*.py")])
    own = [package / "data" / "preprocess.py", package / "predict.py", package / "stages" / "train.py"]
    return sha256_files([*files, *own])


def model_code_hash(params: PipelineParams, root: Path) -> str:
    """The hash of model.code (a user model's source; by default trainflow's models)."""
    path = root / params.model.code
    if not path.exists():
        raise UserError(
            f"model.code: {params.model.code} does not exist under {root}; set it to the file or package of "
            f"{params.model.name}"
        )
    return source_hash(source_files(path), root)


def fingerprint(params: PipelineParams, data: str, root: Path) -> str:
    """What a checkpoint must match to be resumed: training params, model and its code, seed, data, training code."""
    train = params.train.model_dump(exclude=NOT_IN_FINGERPRINT)
    return sha256_json(
        {
            "seed": params.seed,
            "model": params.model.model_dump(),
            "model_code": model_code_hash(params, root),
            "features": params.features.model_dump(),
            "train": train,
            "data": data,
            "code": code_hash(),
        }
    )


def run(params: PipelineParams, paths: Paths) -> dict[str, Any]:
    for s in SPLITS:
        if not paths.split_file(s).is_file():
            raise UserError(f"train: {paths.split_file(s)} is missing; run `trainflow stage split` first")
    world = distributed.resolve_world_size(params.train.world_size, resolve_device(params.train.device))
    if world > 1 and not distributed.launched():
        print(f"[trainflow] train: starting {world} processes ({params.train.strategy})", file=sys.stderr, flush=True)
        result: dict[str, Any] = distributed.launch(world, _rank, params.model_dump(mode="json"), str(paths.root))
        return result
    return train(params, paths, world)


def _rank(params: dict[str, Any], root: str) -> dict[str, Any]:
    """What each launched rank runs (a fresh process: the project root importable, as the parent had it)."""
    from trainflow.stages import importable

    importable(Path(root))
    return train(PipelineParams.model_validate(params), Paths(Path(root)), int(os.environ["WORLD_SIZE"]))


def train(params: PipelineParams, paths: Paths, world: int = 1) -> dict[str, Any]:
    device = distributed.device_for(resolve_device(params.train.device))
    t = params.train
    group = distributed.init(world, t.strategy, distributed.backend_for(t.backend, device), device)
    try:
        return _train(params, paths, device, group)
    finally:
        distributed.shutdown(group)


def _train(params: PipelineParams, paths: Paths, device: torch.device, group: distributed.Group) -> dict[str, Any]:
    schema = Schema.read(paths.split_schema)
    frames = {s: pd.read_parquet(paths.split_file(s)) for s in ("train", "val")}
    pre = Preprocessor.fit(frames["train"], schema, params.features)
    precision = resolve_precision(params.train.precision, device)
    train, val = (model_inputs(pre, f, str(paths.split_file(s)), with_labels=True) for s, f in frames.items())
    for data in (train, val):
        data.to(device)  # tables move to the training device; text batches are padded on the host, then copied
    seed_everything(params.seed)
    config = model_config(params, pre)
    model = build_model(config)  # the same initial weights on every rank
    source = user_source(model)  # before FSDP swaps the model's class for a sharded one
    if group.distributed:
        seed_everything(params.seed * 1_000_003 + group.rank)  # but each rank its own dropout masks
    dhash = data_hash(paths)

    run = tracking.TrainingRun(paths.root, params.tracking.experiment, paths.reports / "train_metrics_local.json")
    if group.is_main:
        run.start(params.model_dump(), tags={"trainflow.data_sha256": dhash, "trainflow.precision": precision.name})
    logger = run.logger() if group.is_main else NullLogger()
    trainer = Trainer(
        model,
        params.train,
        seed=params.seed,
        device=device,
        precision=precision,
        objective=Objective(schema.task, target_scale=pre.target_std),
        checkpoint_dir=paths.checkpoints,
        fingerprint=fingerprint(params, dhash, paths.root),
        logger=logger,
        group=group,
    )
    try:
        state = trainer.fit(train, val)
    except BaseException as exc:
        logger.close()
        if group.is_main:
            run.finish("KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
        raise
    logger.close()
    if not group.is_main:
        return {}
    # Rank 0 alone, from here: the summary, the export, plots, MLflow.
    assert trainer.final_weights is not None
    summary: dict[str, Any] = {
        "epochs": state.epoch,
        "updates": state.updates,
        "skipped_updates": state.updates - state.applied,
        "monitor": params.train.monitor,
        "best_metric": state.best_metric,
        "best_update": state.best_update,
        "stopped_early": state.stopped_early,
        "precision": precision.name,
        "device": device.type,
        "world_size": group.world_size,
        "data_sha256": dhash,
        "resumed_from_update": trainer.resumed_from,
    }
    if source is not None:  # a user model: evaluate and predict check its code is the same
        summary["model_source"] = {"module": source["module"], "sha256": source["sha256"]}
    export(trainer.final_weights, config, pre, schema, summary, paths.final)
    history = history_frame(state.history)
    plots.write_csv(history, paths.plots / "history.csv")
    plots.training_curves(history, paths.plots / "training_curves.png")
    run.log_metrics({f"best_{params.train.monitor}": state.best_metric or math.nan})
    run.log_artifact(paths.plots / "training_curves.png", "plots")
    run.log_model(paths.final, frames["val"].head(5))
    run.finish()
    write_json(paths.train_run, run.record())
    return {**summary, "mlflow_run_id": run.run_id}


def history_frame(history: list[dict[str, float]]) -> pd.DataFrame:
    """The evaluations as a table in one column order (update, epoch, train_loss, val metrics, lr), whether the
    records were made in this process or restored from a checkpoint (whose JSON sorts keys)."""
    frame = pd.DataFrame(history)
    first, last = ["update", "epoch", "train_loss"], ["lr"]
    middle = sorted(c for c in frame.columns if c not in first + last)
    return frame[[c for c in [*first, *middle, *last] if c in frame.columns]]


def model_config(params: PipelineParams, pre: Preprocessor) -> dict[str, Any]:
    """The model's JSON config: what build_model() needs to rebuild it at evaluation and prediction."""
    m = params.model
    name = m.name
    if name == "auto":
        name = "text_transformer" if pre.text_column else "mlp"
    outputs = len(pre.classes) if pre.task == "classification" else 1
    if name == "mlp" and pre.text_column:
        raise UserError(
            f"model.name mlp takes a table of features, but data.text_column is {pre.text_column!r}; "
            "use model.name: text_transformer (or auto)"
        )
    if name == "text_transformer" and not pre.text_column:
        raise UserError("model.name text_transformer needs text: set data.text_column (or use model.name: auto)")
    config: dict[str, Any] = {"name": name, "out_features": outputs}
    if name == "text_transformer":
        config |= {
            "vocab_size": pre.vocab_size,
            "max_len": params.features.max_length + 1,  # + [CLS]
            "d_model": m.d_model,
            "n_heads": m.n_heads,
            "n_layers": m.n_layers,
            "dropout": m.dropout,
        }
    else:
        config["in_features"] = pre.width
        if name == "mlp":
            config |= {"hidden_sizes": m.hidden_sizes, "dropout": m.dropout}
    return config | m.kwargs


def export(
    weights: dict[str, torch.Tensor],
    config: dict[str, Any],
    pre: Preprocessor,
    schema: Schema,
    summary: dict[str, Any],
    dest: Path,
) -> None:
    """models/final: weights as safetensors, model config and preprocessing as JSON. Nothing here is pickled."""
    with atomic_dir(dest) as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in weights.items()}, str(tmp / WEIGHTS))
        write_json(tmp / CONFIG, config)
        pre.save(tmp)
        write_json(tmp / "schema.json", schema.to_json())
        write_json(tmp / "training.json", summary)
