"""train, as a composition: the data (trainflow.data), the model (trainflow.models), the engine (trainflow.engine),
the resume fingerprint (trainflow.fingerprint), the export (trainflow.export), plots and MLflow (trainflow.tracking).

With train.world_size > 1 this process starts the ranks (torch's elastic launcher) and each runs `train()`; under an
outside torchrun it is one of them. Every rank reads the data and fits the same preprocessing; rank 0 alone talks to
MLflow, writes plots and exports: the block at the end of `_train()`.
"""

from __future__ import annotations

import math
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from trainflow import plots, tracking
from trainflow.data.preprocess import Preprocessor
from trainflow.data.schema import Schema
from trainflow.engine import distributed
from trainflow.engine.data import Dataset
from trainflow.engine.objective import Objective
from trainflow.engine.precision import Precision, resolve_device, resolve_precision
from trainflow.engine.trainer import Logger, NullLogger, Trainer
from trainflow.errors import UserError
from trainflow.export import export, model_config
from trainflow.fingerprint import data_hash, fingerprint
from trainflow.io import write_json
from trainflow.models import build_model, user_source
from trainflow.params import PipelineParams
from trainflow.paths import SPLITS, Paths
from trainflow.predict import model_inputs


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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


@dataclass
class Setup:
    """What a training needs, built from the splits: the data on the device, the preprocessing, the model's config and
    the trainer around the model. The train stage and each sweep trial (trainflow.tune) build it the same way."""

    trainer: Trainer
    train: Dataset
    val: Dataset
    pre: Preprocessor
    schema: Schema
    config: dict[str, Any]
    source: dict[str, Any] | None
    precision: Precision
    data_hash: str
    val_frame: pd.DataFrame


def setup(
    params: PipelineParams,
    paths: Paths,
    device: torch.device,
    group: distributed.Group,
    checkpoint_dir: Path,
    logger: Logger | None = None,
) -> Setup:
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
    trainer = Trainer(
        model,
        params.train,
        seed=params.seed,
        device=device,
        precision=precision,
        objective=Objective(schema.task, target_scale=pre.target_std),
        checkpoint_dir=checkpoint_dir,
        fingerprint=fingerprint(params, dhash, paths.root),
        logger=logger,
        group=group,
    )
    return Setup(trainer, train, val, pre, schema, config, source, precision, dhash, frames["val"])


def _train(params: PipelineParams, paths: Paths, device: torch.device, group: distributed.Group) -> dict[str, Any]:
    built = setup(params, paths, device, group, paths.checkpoints)
    trainer, precision, dhash = built.trainer, built.precision, built.data_hash
    run = tracking.TrainingRun(paths.root, params.tracking.experiment, paths.reports / "train_metrics_local.json")
    if group.is_main:
        run.start(params.model_dump(), tags={"trainflow.data_sha256": dhash, "trainflow.precision": precision.name})
    logger = run.logger() if group.is_main else NullLogger()
    trainer.logger = logger
    try:
        state = trainer.fit(built.train, built.val)
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
    if built.source is not None:  # a user model: evaluate and predict check its code is the same
        summary["model_source"] = {"module": built.source["module"], "sha256": built.source["sha256"]}
    export(trainer.final_weights, built.config, built.pre, built.schema, summary, paths.final)
    history = plots.history_frame(state.history)
    plots.write_csv(history, paths.plots / "history.csv")
    plots.training_curves(history, paths.plots / "training_curves.png")
    run.log_metrics({f"best_{params.train.monitor}": state.best_metric or math.nan})
    run.log_artifact(paths.plots / "training_curves.png", "plots")
    run.log_model(paths.final, built.val_frame.head(5))
    run.finish()
    write_json(paths.train_run, run.record())
    return {**summary, "mlflow_run_id": run.run_id}
