"""train, as a composition: the data (trainflow.data), the model (trainflow.models), the engine (trainflow.engine),
the resume fingerprint (trainflow.engine.fingerprint), the export (trainflow.artifacts.export), plots and MLflow
(trainflow.tracking).

With train.world_size > 1 this process starts the ranks (torch's elastic launcher) and each runs `train()`; under an
outside torchrun it is one of them. Every rank reads the data and fits the same preprocessing; rank 0 alone talks to
MLflow, writes plots and exports: the block at the end of `_train()`.

A preemption signal is noted from the stage's start to its end (trainflow.engine.preempt): before training the stage
stops at its next `stop_before` with nothing written, in training after the update with a checkpoint (exit 75 both);
after the last update it writes its outputs, leaves the model's MLflow logging to register, and exits 0. The
launcher passes a signal on to its ranks.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from trainflow import plots, tracking
from trainflow.artifacts.export import auto_model, export, model_config
from trainflow.artifacts.predict import model_inputs
from trainflow.core.errors import ParamsError, Preempted, UserError
from trainflow.core.io import failpoint, write_json
from trainflow.core.logger import Logger, NullLogger
from trainflow.core.paths import SPLITS, Paths
from trainflow.data import stream
from trainflow.data.preprocess import Preprocessor
from trainflow.data.schema import PATH_SUFFIX, Schema
from trainflow.data.stream import Split
from trainflow.engine import batch_size, distributed
from trainflow.engine.augment import Augment
from trainflow.engine.fingerprint import data_hash, fingerprint
from trainflow.engine.loaders import LONGEST, ONE_ROW, Dataset, ImageData, MemmapData, RecordFile, TensorData, TextData
from trainflow.engine.objective import Objective
from trainflow.engine.precision import Precision, configure_backends, resolve_device, resolve_precision
from trainflow.engine.preempt import PREEMPTED_MARK, Watch, watching
from trainflow.engine.trainer import Trainer
from trainflow.models import build_model, hf, user_source
from trainflow.params import DataParams, FeatureParams, ModelParams, TrackingParams, TrainParams

# dvc.yaml lists what the stage reads (tests/contracts/test_stage_params.py). data.memory_budget_mb: a table over it is
# streamed, and train.shuffle auto then orders it by blocks of rows (other weights).
PARAMS = ("seed", "features", "model", "train", "tracking.tensorboard", "data.memory_budget_mb")
READS_UNLISTED = {"tracking.experiment": "where the run is logged: the next run goes there, and nothing reruns"}
LOGS_PARAMS = True  # the params whole, as `logged`: the MLflow run's params


@dataclass(frozen=True)
class Training:
    """The params a training reads: the train stage's, and a sweep trial's (trainflow.tune), each section whole."""

    seed: int
    data: DataParams
    features: FeatureParams
    model: ModelParams
    train: TrainParams
    tracking: TrackingParams

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def dump(self) -> dict[str, Any]:
        """JSON, for the launched ranks (`load` makes the same Training again)."""
        return {f: v if isinstance(v, int) else v.model_dump(mode="json") for f, v in vars(self).items()}

    @classmethod
    def load(cls, raw: dict[str, Any]) -> Training:
        return cls(
            int(raw["seed"]),
            DataParams.model_validate(raw["data"]),
            FeatureParams.model_validate(raw["features"]),
            ModelParams.model_validate(raw["model"]),
            TrainParams.model_validate(raw["train"]),
            TrackingParams.model_validate(raw["tracking"]),
        )


def class_weights(labels: np.ndarray, n_classes: int) -> list[float]:
    """sklearn's "balanced" weights: n / (classes * count of the class); a class with no train rows weighs 1."""
    counts = np.bincount(labels, minlength=n_classes)
    return [len(labels) / (n_classes * int(c)) if c else 1.0 for c in counts]


def objective(
    t: TrainParams, schema: Schema, pre: Preprocessor, train: Any, where: str, device: torch.device
) -> Objective:
    """The loss and metrics of the task, with train's regularisers (label smoothing, class weights)."""
    if schema.task == "regression":
        wrong = [("train.label_smoothing", "smooths class labels", t.label_smoothing != 0),
                 ("train.class_weights", "weighs classes", t.class_weights != "none")]  # fmt: skip
        problems = [(field, f"{what}; this task is regression: leave it at its default") for field, what, bad in wrong
                    if bad]  # fmt: skip
        if problems:
            raise ParamsError("params.yaml", problems)
        return Objective("regression", target_scale=pre.target_std)
    weights = None
    if t.class_weights == "balanced":
        weights = torch.tensor(class_weights(pre.labels(train, where), len(pre.classes)), device=device)
    return Objective("classification", label_smoothing=t.label_smoothing, class_weights=weights)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run(
    paths: Paths,
    *,
    seed: int,
    data: DataParams,
    features: FeatureParams,
    model: ModelParams,
    train: TrainParams,
    tracking: TrackingParams,
    logged: dict[str, Any],
) -> dict[str, Any]:
    params = Training(seed, data, features, model, train, tracking)
    for s in SPLITS:
        if not Split.stored(paths.splits, s).exists():
            raise UserError(f"train: {Split.stored(paths.splits, s)} is missing; run `trainflow stage split` first")
    with watching(params.train.preempt_signals) as watch:
        world = distributed.resolve_world_size(params.train.world_size, resolve_device(params.train.device))
        if world > 1 and not distributed.launched():
            failpoint("train-launch")
            watch.stop_before("starting the ranks")
            print(f"[trainflow] train: starting {world} processes ({params.train.strategy})", file=sys.stderr,
                  flush=True)  # fmt: skip
            args = (params.dump(), logged, str(paths.root))
            result: dict[str, Any] = distributed.launch(world, _rank, *args, watch=watch)
            return result
        return train_ranks(params, logged, paths, world)


def _rank(params: dict[str, Any], logged: dict[str, Any], root: str) -> dict[str, Any]:
    """What each launched rank runs (a fresh process: the project root importable, as the parent had it)."""
    from trainflow.stages import importable

    importable(Path(root))
    return train_ranks(Training.load(params), logged, Paths(Path(root)), int(os.environ["WORLD_SIZE"]))


def train_ranks(params: Training, logged: dict[str, Any], paths: Paths, world: int) -> dict[str, Any]:
    """One rank of `world` (or the only process): join the group, train, leave it."""
    with watching(params.train.preempt_signals) as watch:
        device = distributed.device_for(resolve_device(params.train.device))
        t = params.train
        group = distributed.init(world, t.strategy, distributed.backend_for(t.backend, device), device)
        try:
            watch.join(group)
            failpoint("train-setup")
            # Under a launcher (torchrun: exit code 1 for every failure), the mark tells a job script "preempted".
            mark = paths.checkpoints / PREEMPTED_MARK if distributed.launched() else None
            watch.stop_before("reading the data", mark)
            return _train(params, logged, paths, device, group, watch, mark)
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
    val_head: pd.DataFrame  # the first rows of the val split: the registered model's input example
    batch: batch_size.Choice | None = None  # what train.batch_size auto chose (None: a fixed batch size)
    scratch: Path | None = None  # streamed data: its .npy files, as big as the data (`discard` them)

    def discard(self) -> None:
        """Once training is over: let go of the data, so that the export and MLflow's logging do not hold it too
        (streamed: a few bytes a row of targets, the epoch's order and positions), and remove the streamed data's .npy
        files (only its batches read them)."""
        del self.train, self.val
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


def setup(
    params: Training,
    paths: Paths,
    device: torch.device,
    group: distributed.Group,
    checkpoint_dir: Path,
    logger: Logger | None = None,
) -> Setup:
    """Build the training from the splits. Streamed data is written beside the checkpoints (models/.streamed, or a
    sweep trial's own folder), rebuilt every run: removed here if building fails, else by `Setup.discard`."""
    scratch = checkpoint_dir.parent / ".streamed" / f"rank{group.rank}"
    try:
        return _setup(params, paths, device, group, checkpoint_dir, logger, scratch)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


def _setup(
    params: Training,
    paths: Paths,
    device: torch.device,
    group: distributed.Group,
    checkpoint_dir: Path,
    logger: Logger | None,
    scratch: Path,
) -> Setup:
    # TF32 and determinism before the first kernel: batch_size auto's probes run cuBLAS, which reads
    # CUBLAS_WORKSPACE_CONFIG once, when it starts (the Trainer sets the same again, for engine-only use).
    configure_backends(params.train, device)
    schema = Schema.read(paths.split_schema)
    files = {s: Split.stored(paths.splits, s) for s in ("train", "val")}
    held = stream.choose(list(files.values()), params.data, text=schema.text_column is not None)
    shuffle = sample_order(params.train.shuffle, schema, held.streamed)
    if group.is_main:
        print(f"train: data {held.why}; sample order: {shuffle}", file=sys.stderr)
    # Streamed: the frames are read a column (images: a block of rows) at a time (the fit, the class weights), then a
    # block of rows at a time into files that batches read their rows from; in memory: whole, as DataFrames.
    frames = {s: stream.ParquetColumns(f) if held.streamed else f.read() for s, f in files.items()}
    pretrained = hf.resolve(params.model.name, paths.root) if hf.is_hf(params.model.name) else None
    tokenizer = hf.tokenizer(pretrained, params.features.max_length) if pretrained and schema.text_column else None
    pre = Preprocessor.fit(frames["train"], schema, params.features, tokenizer)  # type: ignore[arg-type]
    precision = resolve_precision(params.train.precision, device)
    train: MemmapData | TensorData | TextData | ImageData
    val: MemmapData | TensorData | TextData | ImageData
    if held.streamed and schema.image_column:  # images: their encoded bytes, decoded batch by batch
        train, val = (streamed_images(pre, f, scratch / s, str(f)) for s, f in files.items())
    elif held.streamed:  # a table: its preprocessed matrix
        splits = list(files.values())  # a streamed split's two: read from the table together, in one pass
        matrices = stream.write_matrices(pre, splits, [scratch / s for s in files], [str(f) for f in splits])
        train, val = (MemmapData(*m) for m in matrices)
    else:
        train, val = (model_inputs(pre, f, str(files[s]), with_labels=True) for s, f in frames.items())
    if isinstance(train, TensorData | MemmapData):
        train.shuffle = shuffle
    if isinstance(train, ImageData):  # the train split alone is augmented: val is scored as evaluate scores test
        train.augment = Augment(**params.features.augment.model_dump())
    for data in (train, val):
        data.to(device)  # tables move to the training device; text batches are padded on the host, then copied
    seed_everything(params.seed)
    config = model_config(params.model, params.features, pre, pretrained, device)
    if params.model.name == "auto" and group.is_main:
        print(f"train: model.name auto: {config['name']} ({auto_model(pre, device)[1]})", file=sys.stderr)
    model = build_model(config)  # the same initial weights on every rank
    if params.train.activation_checkpointing:
        enable = getattr(model, "activation_checkpointing", None)
        if enable is None:
            raise ParamsError(
                "params.yaml",
                [("train.activation_checkpointing", f"{type(model).__name__} cannot recompute its activations "
                  "(text_transformer and hf: models can; a user model needs an activation_checkpointing(on) "
                  "method); set it to false")],
            )  # fmt: skip
        enable(True)
    if params.train.packing:
        train.pack_width = packing_width(model, train)  # type: ignore[union-attr]
        if group.is_main:
            print(f"train: batches packed ({PACKED[train.pack_width]}), validation padded", file=sys.stderr)  # type: ignore[union-attr]
    source = user_source(model)  # before FSDP swaps the model's class for a sharded one
    if group.distributed:
        seed_everything(params.seed * 1_000_003 + group.rank)  # but each rank its own dropout masks
    dhash = data_hash(paths)
    task = objective(params.train, schema, pre, frames["train"], str(files["train"]), device)
    # batch_size auto becomes numbers here, before the Trainer (which only sees numbers). The fingerprint keeps the
    # params as written: the same global batch split otherwise on another machine resumes (exact accumulation).
    train_params, choice = batch_size.resolve(params.train, model, train, task, precision, device, group)
    if choice is not None and group.is_main:
        print(choice.describe(), file=sys.stderr)
    trainer = Trainer(
        model,
        train_params,
        seed=params.seed,
        device=device,
        precision=precision,
        objective=task,
        checkpoint_dir=checkpoint_dir,
        # the order as resolved: auto resumes only where it resolves the same (a changed data.memory_budget_mb may not)
        fingerprint=fingerprint(
            seed=params.seed,
            model=params.model,
            features=params.features,
            train=params.train.model_copy(update={"shuffle": shuffle}),
            data=dhash,
            root=paths.root,
        ),
        logger=logger,
        group=group,
    )
    val_head = stream.head(files["val"], 5)
    kept = scratch if held.streamed else None
    return Setup(trainer, train, val, pre, schema, config, source, precision, dhash, val_head, choice, kept)


PACKINGS = {"one row": ONE_ROW, "rows": LONGEST}  # a model's `packing` layout -> TextData.pack's width
PACKED = {ONE_ROW: "one row each", LONGEST: "rows as wide as each batch's longest sequence"}


def packing_width(model: torch.nn.Module, train: Dataset) -> int:
    """train.packing's rows for `model` (its `packing` layout: TextData.pack), or a params error saying why not."""
    if not isinstance(train, TextData):
        raise ParamsError("params.yaml", [("train.packing", "packs token sequences; this data has no text column: "
                                           "set it to false")])  # fmt: skip
    layout = getattr(model, "packing", None)
    if layout not in PACKINGS:
        raise ParamsError(
            "params.yaml",
            [("train.packing", f"{type(model).__name__} takes padded batches only (text_bag, text_transformer and "
              "hf: encoders of BERT's family and decoders, under sdpa or eager attention, take packed ones): set it "
              "to false")],
        )  # fmt: skip
    return PACKINGS[layout]


def sample_order(shuffle: str, schema: Schema, streamed: bool) -> str:
    """train.shuffle resolved: auto is blocks for a table streamed from disk (a read per 64 rows, not per row), rows
    otherwise. Text (length buckets) and images (a read per image anyway) keep rows."""
    table = schema.text_column is None and schema.image_column is None
    if shuffle == "blocks" and not table:
        what = "text" if schema.text_column else "images"
        raise ParamsError(
            "params.yaml",
            [("train.shuffle", f"blocks orders the rows of a table, not {what}: set it to auto or rows")],
        )
    if shuffle == "auto":
        return "blocks" if table and streamed else "rows"
    return shuffle


def streamed_images(pre: Preprocessor, split: stream.Split, dest: Path, where: str) -> ImageData:
    """The images and targets of the split, as model_inputs makes them, without holding the images: their
    encoded bytes are copied a block of rows at a time to dest/images.bin, back to back, and a batch reads its rows
    by offset (`RecordFile`: 8 bytes a row held) and decodes them in the background. The targets are held (a few
    bytes a row), and the images' names (their paths, for messages) as Arrow strings."""
    column = pre.image_column
    assert column is not None, "streamed_images needs a preprocessor with an image column"
    read = stream.input_columns(pre, split)  # the images, their paths (where the file has them), the target
    named = column + PATH_SUFFIX in read
    n = len(split)
    dest.mkdir(parents=True, exist_ok=True)
    offsets = np.zeros(n + 1, dtype=np.int64)
    targets: list[np.ndarray] = []
    names: list[pa.Array] = []
    lo = 0
    with (dest / "images.bin").open("wb") as out:
        for frame in stream.blocks(split, stream.data_rows(split), read):
            images = frame[column].to_numpy(dtype=object)
            offsets[lo + 1 : lo + 1 + len(frame)] = offsets[lo] + np.cumsum([len(v) for v in images])
            out.write(b"".join(images))
            labels = pre.labels(frame, where)
            targets.append(pre.scale_target(labels) if pre.task == "regression" else labels)
            if named:
                names.append(pa.array(frame[column + PATH_SUFFIX].to_numpy(dtype=object), pa.string()))
            lo += len(frame)
    images_file = RecordFile(dest / "images.bin", offsets)
    shown = pa.chunked_array(names, pa.string()) if named else None

    def name(i: int) -> str:
        known = shown[i].as_py() if shown is not None else None
        return known or f"in {where}, row {i}"

    def decode(rows: list[int]) -> torch.Tensor:
        return torch.from_numpy(pre.decode(images_file.read(rows), [name(i) for i in rows], where))

    y = np.concatenate(targets) if targets else np.zeros(0, dtype=np.int64)
    return ImageData(decode, torch.from_numpy(y), pre.image_mean, pre.image_std)


def _train(
    params: Training,
    logged: dict[str, Any],
    paths: Paths,
    device: torch.device,
    group: distributed.Group,
    watch: Watch,
    mark: Path | None,
) -> dict[str, Any]:
    built = setup(params, paths, device, group, paths.checkpoints)
    trainer, precision, dhash = built.trainer, built.precision, built.data_hash
    run = tracking.TrainingRun(paths.root, params.tracking.experiment, paths.reports / "train_metrics_local.json")
    logger: Logger = NullLogger()
    try:
        watch.stop_before("training", mark)
        if group.is_main:
            tags = {"trainflow.data_sha256": dhash, "trainflow.precision": precision.name}
            run.start(logged, tags=tags, pipeline=True)
        tensorboard = paths.tensorboard if params.tracking.tensorboard else None
        logger = tracking.loggers(run, tensorboard) if group.is_main else NullLogger()
        trainer.logger = logger
        trainer.watch = watch  # a signal or train.max_time: checkpoint at the next update, raise Preempted
        trainer.profile_dir = paths.profile if params.train.profile is not None else None
        if trainer.profile_dir is not None and group.is_main:
            shutil.rmtree(trainer.profile_dir, ignore_errors=True)  # this run's trace alone
        group.barrier()
        failpoint("train-fit")
        watch.stop_before("training", mark)  # MLflow's start can take seconds
        fit_started = time.perf_counter()
        state = trainer.fit(built.train, built.val)
        fit_seconds = time.perf_counter() - fit_started
    except BaseException as exc:
        logger.close()
        if group.is_main:  # a run never started is not ended (TrainingRun)
            run.finish("KILLED" if isinstance(exc, KeyboardInterrupt | Preempted) else "FAILED")
        raise
    finally:
        built.discard()
    if trainer.resumed_from is not None:
        # This run's logs start at the update it resumed from; the evaluations before it are in the checkpoint's
        # history. Logged too, so a resumed run (an instant one, when tracking.tensorboard was just turned on) has
        # whole curves in MLflow and TensorBoard.
        for record in state.history:
            if record["update"] <= trainer.resumed_from:
                logger.log({k: v for k, v in record.items() if k.startswith("val_")}, step=int(record["update"]))
    logger.close()
    if not group.is_main:
        return {}
    # Rank 0 alone, from here: the summary, the export, plots, MLflow.
    assert trainer.final_weights is not None
    summary: dict[str, Any] = {
        "epochs": state.epoch,
        "updates": state.updates,
        # the run's plan: train.epochs as resolved (auto: by the updates an epoch takes) and the schedule's length
        "epochs_planned": trainer.plan.epochs,
        "updates_planned": trainer.plan.total,
        "skipped_updates": state.updates - state.applied,
        "monitor": params.train.monitor,
        "best_metric": state.best_metric,
        "best_update": state.best_update,
        "stopped_early": state.stopped_early,
        "precision": precision.name,
        "device": device.type,
        "world_size": group.world_size,
        "batch_size_auto": None if built.batch is None else built.batch.summary(),  # train.batch_size auto's choice
        "data_sha256": dhash,
        # train.class_weights: balanced, as fitted on this train split (None: every class weighs 1)
        "class_weights": None if (w := trainer.objective.class_weights) is None else w.tolist(),
    }
    if built.source is not None:  # a user model: evaluate and predict check its code is the same
        summary["model_source"] = {"module": built.source["module"], "sha256": built.source["sha256"]}
    if "pretrained" in built.config:  # hf: where the weights fine-tuned from came from
        directory = Path(built.config["pretrained"])
        summary["pretrained"] = {"model": params.model.name, "directory": str(directory),
                                 "sha256": hf.directory_hash(directory)}  # fmt: skip
    # models/final holds what the model is, never how this run went: a rerun that changes nothing (an instant resume
    # after train.progress changed, say) exports it byte for byte, so DVC reruns nothing after it and register adds
    # no version. How the run went goes into reports/train_run.json with the MLflow run.
    failpoint("train-export")
    export(trainer.final_weights, built.config, built.pre, built.schema, summary, paths.final)
    this_run = {
        "resumed_from_update": trainer.resumed_from,
        # fit()'s wall time (its validation passes and checkpoints in it) and what it trained on since it started
        # (of a resumed run: since the start of the first): throughput for a fresh run is these over fit_seconds
        "fit_seconds": fit_seconds,
        "samples": state.samples,
        "tokens": state.tokens,
        "peak_memory_mb": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
    }
    history = plots.history_frame(state.history)
    plots.write_csv(history, paths.plots / "history.csv")
    plots.training_curves(history, paths.plots / "training_curves.png")
    # MLflow's logging can take long (an upload to a server, seconds even locally): after a signal it is left to
    # register, which logs the model train did not (as when the tracking server was down), and the stage ends now.
    if watch.caught is None:
        run.log_metrics({f"best_{params.train.monitor}": state.best_metric or math.nan})
        run.log_artifact(paths.plots / "training_curves.png", "plots")
        for trace in sorted(paths.profile.glob("*.json")) if trainer.profile_dir is not None else []:
            run.log_artifact(trace, "profile")
    failpoint("train-log")
    if watch.caught is None:
        run.log_model(paths.final, built.val_head)
    else:
        said = f"{watch.caught.name} received after the last update"
        print(f"train: {said}: models/final and the reports are written, and the model is left for `trainflow stage "
              "register` to log to MLflow", file=sys.stderr)  # fmt: skip
    run.finish()
    write_json(paths.train_run, {**run.record(), **this_run})
    return {**summary, **this_run, "mlflow_run_id": run.run_id}
