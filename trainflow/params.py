"""Every parameter of the pipeline, validated. params.yaml holds one top-level key per stage (contract).

`load_params(path, overrides)` merges dotted `key=value` overrides (YAML values, as `dvc exp run -S`) into the file's
contents, validates the result and raises ParamsError listing every problem with its dotted path.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainflow.core.errors import ParamsError


class Section(BaseModel):
    # coerce_numbers_to_str: a column named 1 is the text "1" (`-S data.target=1` is YAML's integer 1, as is
    # `target: 1` in params.yaml); without it pydantic answers "Input should be a valid string".
    model_config = ConfigDict(extra="forbid", validate_default=True, coerce_numbers_to_str=True)


# digits_images: the digits as 8x8 grayscale images (pixel values 0..16), for the cnn.
BUILTIN_DATASETS = ("digits", "iris", "wine", "breast_cancer", "diabetes", "digits_images")


class DataParams(Section):
    source: str = Field(
        "builtin:digits",
        description="Where the raw data comes from: a file, a glob (data/raw/*.csv) or a directory of files of one "
        "format, relative to the project root; a directory of class folders of images (<dir>/<class>/<file>.png, "
        ".jpg): an image column and the target = the folder's name; or builtin:<name> for a dataset that ships inside "
        "scikit-learn (digits, iris, wine, breast_cancer, diabetes; digits_images = digits as 8x8 images).",
    )
    format: Literal["auto", "csv", "tsv", "parquet", "jsonl"] = Field(
        "auto", description="File format; auto = from the extension (.csv, .tsv/.tab, .parquet/.pq, .jsonl/.ndjson)."
    )
    delimiter: str | None = Field(
        None,
        min_length=1,
        max_length=1,
        description="Field delimiter of csv/tsv files; null = ',' for csv, tab for tsv.",
    )
    header: bool = Field(True, description="Whether csv/tsv files start with a header line of column names.")
    header_rows: int = Field(
        1,
        ge=1,
        description="Lines the header of csv/tsv files spans (with data.header: true). Over 1, a column's name is its "
        "cells on those lines joined by '.', empty cells left out: 'network.node.hemi' for a column headed network, "
        "node and hemi on three lines.",
    )
    quoting: Literal["auto", "double", "none"] = Field(
        "auto",
        description='Quoted fields: double ("a, b" is one value; quoted values may hold delimiters and line '
        "breaks) or none (a quote is an ordinary character); auto = double for csv, none for tsv.",
    )
    columns: list[str] | None = Field(
        None, description="Column names for files without a header (data.header: false), in file order."
    )
    encoding: str = Field("utf-8", description="Text encoding of csv/tsv/jsonl files.")
    target: str = Field("target", min_length=1, description="Name of the column to predict.")
    task: Literal["auto", "classification", "regression"] = Field(
        "auto",
        description="auto: regression for a numeric target with non-integer values, or integers too many to be "
        "classes (more than 20 distinct, or fewer than 10 rows each; integer codes 0..K-1 or 1..K up to K=100 stay "
        "classes); classification for text, booleans and few integers. The choice and its reason are printed; a "
        "changed target or task is inferred afresh.",
    )
    features: list[str] | None = Field(
        None, description="Columns to use as features; null means every column except the target and `exclude`."
    )
    exclude: list[str] = Field(default_factory=list, description="Columns never used as features (ids, leaks).")
    text_column: str | None = Field(
        None,
        description="A free-text column to model with the text transformer (tokenized by a subword tokenizer "
        "trained on the train split); null = no text. With a text column the other features are not used.",
    )
    image_column: str | None = Field(
        None,
        description="A column of image file paths (PNG, JPEG, ...; relative to the table file's folder, or absolute) "
        "to model with the cnn; ingest stores each image's bytes in the table. With a folder of class folders it "
        "names the image column (null = image). With an image column the other features are not used.",
    )
    missing: Literal["impute", "drop", "error"] = Field(
        "impute",
        description="Missing feature values: impute (train median/mean plus a missing indicator, or an unknown "
        "category), drop the row, or error naming file, line and column.",
    )
    duplicates: Literal["keep", "drop", "error"] = Field(
        "keep", description="Rows that are exact duplicates of an earlier row: keep, drop, or error."
    )
    missing_target: Literal["error", "drop"] = Field(
        "error",
        description="Rows whose target value is missing: error naming file, line and column, or drop them (with a "
        "count on stderr).",
    )
    unseen_labels: Literal["error", "drop"] = Field(
        "error",
        description="When data is ingested again, target labels the saved schema has not seen: error, or drop "
        "those rows (with a count on stderr).",
    )
    memory_budget_mb: float | None = Field(
        None,
        gt=0,
        description="Memory (MiB) the data of a stage may take; null = a quarter of this machine's memory. Data "
        "that would take more than it in memory (about 3 times a source file's bytes, 6 times a split's Parquet "
        "data) is streamed, tables and images (not text yet): ingest parses a csv/tsv/jsonl/parquet source in "
        "chunks into a spill and types it a column at a time (images, of a folder or a table of paths: spilled in "
        "chunks as they are read), split assigns and writes rows a block at a time, train fits the preprocessing "
        "column by column (images: a block at a time) and reads the preprocessed rows (images: their encoded bytes) "
        "from a file on disk by row (models/.streamed/), and evaluate scores the test split a block of whole batches "
        "at a time, with the same table, statistics, sample order, weights and metrics as in memory. It changes "
        "where data is held, never the model. "
        "train.memory_budget_mb bounds the model's memory (batch_size auto), not the data's.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> DataParams:
        if self.features is not None and self.target in self.features:
            raise ValueError(f"data.features lists the target column {self.target!r}; remove it from the list")
        if self.target in self.exclude:
            raise ValueError(f"data.exclude lists the target column {self.target!r}; the target is never a feature")
        if self.columns is not None and self.header:
            raise ValueError("data.columns names the columns of header-less files: set data.header: false too")
        if self.header_rows > 1 and not self.header:
            raise ValueError("data.header_rows counts the lines of a header: set data.header: true, or header_rows: 1")
        if self.text_column is not None and self.text_column == self.target:
            raise ValueError("data.text_column is the target column; name the text feature")
        if self.image_column is not None and self.image_column in (self.target, self.text_column):
            raise ValueError("data.image_column is the target or the text column; name the column of image paths")
        if self.source.startswith("builtin:") and self.source.removeprefix("builtin:") not in BUILTIN_DATASETS:
            raise ValueError(
                f"data.source: unknown built-in dataset; choose one of builtin:{', builtin:'.join(BUILTIN_DATASETS)}"
            )
        return self


GLOB_CHARS = re.compile(r"[*?\[]")


RAW = "data/raw"  # what the ingest stage depends on in dvc.yaml: the only data DVC watches for it


def source_outside(source: str, root: Path) -> str | None:
    """Why data.source cannot be used from the project at `root`, or None: it names files outside data/raw/.

    The ingest stage's DVC dependency is data/raw/, so a file anywhere else (outside the project, or in it but not
    under data/raw/) can change (rows appended) while `dvc status` stays clean and the model goes stale. Outside =
    outside both as written (`..` collapsed) and with symlinks resolved: a project reached through a symlink, or
    data/raw/x.csv linking elsewhere, is inside it as written."""
    if source.startswith("builtin:"):
        return None
    given = Path(os.path.expanduser(source))
    full = Path(os.path.normpath(given if given.is_absolute() else root / given))
    raw = root / RAW
    if full.is_relative_to(os.path.normpath(raw)) or full.resolve().is_relative_to(raw.resolve()):
        return None
    where = "the project" if not full.resolve().is_relative_to(root.resolve()) else f"{RAW}/"
    return (
        f"{source} is outside {where} ({root / RAW if where != 'the project' else root}): DVC watches only {RAW}/ "
        f"for the ingest stage, so rows added to it later would leave `dvc status` clean and the model stale. Copy "
        f"it into {RAW}/ and track it: {_copy_in(full)}"
    )


def _copy_in(full: Path) -> str:
    """The shell commands that copy `full` (a file, a folder or a glob) under data/raw/ and track it with DVC, as the
    README's "Your data" does, then the data.source that names the copy."""
    from shlex import quote

    raw = RAW
    if GLOB_CHARS.search(full.as_posix()):  # the files of a glob go to a folder named as theirs; the glob moves along
        folder = next(p for p in full.parents if not GLOB_CHARS.search(p.as_posix()))
        inside = full.relative_to(folder).as_posix()
        copy = f"{raw}/{folder.name or 'data'}"
        if "/" in inside:  # a pattern over subfolders: copy them all, so it matches there as here
            command = f"cp -r {quote(str(folder))} {quote(copy)}"
        else:
            command = f"mkdir -p {quote(copy)} && cp {quote(str(folder))}/{inside} {quote(copy + '/')}"
        command += f" && dvc add {quote(copy)}"
        source = f"{copy}/{inside}"
    else:
        copy = f"{raw}/{full.name}"
        command = f"cp {'-r ' if full.is_dir() else ''}{quote(str(full))} {raw}/ && dvc add {quote(copy)}"
        source = copy
    return f"`{command}`, then rerun with `-S {quote('data.source=' + source)}`"


def default_model_name(source: str, target: str, task: str | None = None) -> str:
    """register.model_name auto: trainflow-<name> for builtin:<name> (its target is fixed), else the file's or
    folder's name (a glob's folder) and the target, and the task when data.task says it (a target modelled as
    the other task is another kind of model), as MLflow takes a name."""
    if source.startswith("builtin:"):
        return f"trainflow-{source.removeprefix('builtin:')}" + (f"-{task}" if task else "")
    path = Path(source.rstrip("/"))
    while GLOB_CHARS.search(path.as_posix()) and path != path.parent:
        path = path.parent
    name = f"{path.stem or 'data'}-{target}" + (f"-{task}" if task else "")
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.")


class SplitParams(Section):
    val_fraction: float = Field(0.15, gt=0, lt=1, description="Fraction of rows held out for validation.")
    test_fraction: float = Field(0.15, gt=0, lt=1, description="Fraction of rows held out for the final test.")
    stratify: bool = Field(
        True,
        description="Classification: split each class in the given fractions, within one row (a class too small "
        "for val and test stays in train, with a warning); still stable under appended rows.",
    )
    key: list[str] | None = Field(
        None,
        description="Columns whose seeded hash keys a row (an id); null = the hash of the whole row. Each key's split "
        "is saved with the splits, so a row keeps its split when new rows are appended.",
    )
    group_by: str | None = Field(
        None,
        description="Column of group ids (a user, a patient): all rows of a group land in the same split (stratified "
        "by each group's most frequent class).",
    )
    time_column: str | None = Field(
        None,
        description="Column of timestamps (or numbers, or text that parses as one or the other): train on the oldest "
        "rows, validate on later ones, test on the newest; equal timestamps never straddle a boundary (overrides "
        "key/group_by/stratify).",
    )
    seed: int = Field(
        42,
        ge=0,
        description="Seed of the row keys' hash, which decides which rows are train, val and test. The split's own: "
        "the top-level seed is the training seed and never moves a row between splits. Changing this one assigns "
        "every row afresh, so the champion may have trained on this split's test rows: the gate then compares the "
        "two only on rows the champion's split held out, or keeps the champion and says why.",
    )

    @model_validator(mode="after")
    def _leaves_rows_to_train_on(self) -> SplitParams:
        if self.val_fraction + self.test_fraction >= 0.9:
            raise ValueError(
                f"split.val_fraction + split.test_fraction = {self.val_fraction + self.test_fraction:g} leaves "
                "under 10% of the rows to train on; lower one of them"
            )
        return self


class AugmentParams(Section):
    """Random changes to each train image, per sample and epoch (features.augment)."""

    shift: int = Field(
        0,
        ge=0,
        description="Pad by this many pixels (zeros) and crop back at a random offset: shifts of up to +-shift pixels.",
    )
    flip: bool = Field(False, description="Mirror left-right with probability 1/2 (off for digits and text).")
    rotate: float = Field(0.0, ge=0, le=180, description="Rotate by a random angle in [-rotate, rotate] degrees.")


class FeatureParams(Section):
    """Preprocessing, fitted on the train split by the train stage and saved with the model."""

    max_categories: int = Field(
        50,
        ge=1,
        description="Categorical columns become one-hot columns for the categories most frequent in train, at most "
        "this many per column; rarer ones and ones never seen in train share an `unknown` column.",
    )
    missing_indicators: bool = Field(
        True, description="Add a 0/1 column per numeric feature that had missing values in train."
    )
    vocab_size: int = Field(
        8000, ge=100, description="Text: subword vocabulary size of the tokenizer (hf: models bring their own)."
    )
    max_length: int = Field(
        128,
        ge=8,
        description="Text: tokens kept per text (longer texts are truncated); with an hf: model, its special tokens "
        "included.",
    )
    image_size: int | list[int] | None = Field(
        None,
        description="Images: [height, width] (or one number for squares) every image is resized to (bilinear); "
        "null = keep the train images' size, which must then be the same for all (a different one is an error "
        "naming the file).",
    )
    augment: AugmentParams = Field(
        default_factory=lambda: AugmentParams.model_validate({}),
        description="Images: random augmentation of the train split only (drawn per sample from seed, epoch and "
        "sample index, so a resumed run is bit-identical); off by default.",
    )

    @field_validator("image_size")
    @classmethod
    def _size(cls, v: int | list[int] | None) -> int | list[int] | None:
        sizes = [v] if isinstance(v, int) else v
        if sizes is not None and (len(sizes) != 2 and not isinstance(v, int) or any(s < 1 for s in sizes)):
            raise ValueError(f"must be null, a positive number or [height, width] of positive numbers, got {v!r}")
        return v


MODEL_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
BUILTIN_MODEL_CODE = "trainflow/models"


class ModelParams(Section):
    name: str = Field(
        "auto",
        description="auto (for text: text_bag on a CPU, text_transformer on a GPU; cnn for images; else mlp; the "
        "train stage prints its choice), mlp (a multilayer perceptron for tables), text_transformer (a Transformer "
        "encoder for text), text_bag (the mean of the embeddings of a text's subword tokens and token pairs, "
        "fastText-like: seconds on a CPU), cnn (a small "
        "residual convolutional net for images), hf:<directory or hub id> (a pretrained Hugging Face Transformers "
        "model fine-tuned on data.text_column with its own tokenizer: a save_pretrained directory, relative to the "
        "project or absolute, or a hub id in the local Hugging Face cache; nothing is downloaded), or a user model "
        "by import path package.module:Class, built with `kwargs`.",
    )
    hidden_sizes: list[int] = Field(
        default_factory=lambda: [256, 128], min_length=1, description="mlp: width of each hidden layer."
    )
    dropout: float = Field(0.1, ge=0, lt=1, description="Dropout probability (mlp and text_transformer).")
    d_model: int = Field(128, ge=8, description="text_transformer and text_bag: width of token representations.")
    n_heads: int = Field(4, ge=1, description="text_transformer: attention heads; must divide d_model.")
    n_layers: int = Field(2, ge=1, description="text_transformer: encoder blocks.")
    cnn_channels: list[int] = Field(
        default_factory=lambda: [32, 64],
        min_length=1,
        description="cnn: channels of each stage (the first after a 3x3 conv stem); every stage after the first "
        "halves the height and width.",
    )
    cnn_blocks: int = Field(1, ge=1, description="cnn: residual blocks (two 3x3 convs and a skip) per stage.")
    cnn_norm: Literal["batch", "group"] = Field(
        "batch",
        description="cnn: normalisation after each conv: batch (BatchNorm; statistics of the batch in training, "
        "running averages at evaluation) or group (GroupNorm, 8 groups; the same in both, any batch size).",
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra keyword arguments for the model's constructor (user models; overrides for built-ins).",
    )
    code: str = Field(
        BUILTIN_MODEL_CODE,
        min_length=1,
        description="The source of the model, relative to the project root: a user model's module file or package "
        "(mymodels.py for mymodels:TinyNet). The train stage depends on it (dvc.yaml), so editing it retrains; "
        "the default is trainflow's own models.",
    )

    @model_validator(mode="after")
    def _valid(self) -> ModelParams:
        hf = self.name.startswith("hf:")
        if hf and not self.name[3:].strip():
            raise ValueError("model.name hf: needs the model's directory or hub id after it, e.g. hf:models/tiny-bert")
        if (
            self.name not in ("auto", "mlp", "text_transformer", "text_bag", "cnn")
            and not hf
            and not MODEL_PATH.match(self.name)
        ):
            raise ValueError(
                "model.name must be auto, mlp, text_transformer, text_bag, cnn, hf:<directory> or an import path "
                f"package.module:Class, got {self.name!r}"
            )
        if any(h <= 0 for h in self.hidden_sizes):
            raise ValueError(f"model.hidden_sizes must all be positive, got {self.hidden_sizes}")
        if any(c <= 0 for c in self.cnn_channels):
            raise ValueError(f"model.cnn_channels must all be positive, got {self.cnn_channels}")
        if self.d_model % self.n_heads:
            raise ValueError(f"model.n_heads ({self.n_heads}) must divide model.d_model ({self.d_model})")
        if not hf and MODEL_PATH.match(self.name) and self.code == BUILTIN_MODEL_CODE:
            module = self.name.partition(":")[0]
            raise ValueError(
                f"model.name {self.name!r} is your model: set model.code to its source so that editing it retrains, "
                f"e.g. -S model.code={module.replace('.', '/')}.py (or the package directory)"
            )
        return self


Monitor = Literal["val_loss", "val_accuracy", "val_ece", "val_roc_auc", "val_pr_auc", "val_rmse", "val_r2"]
MINIMIZED = ("val_loss", "val_rmse", "val_ece")  # the validation metrics that are better lower
RANKED = ("val_roc_auc", "val_pr_auc")  # computed only when train.monitor is one of them (they keep every score)


class ParamGroupRule(Section):
    """Optimizer settings for the parameters whose names match `match` (see train.param_groups)."""

    match: str = Field(min_length=1, description="Glob on parameter names (fnmatch), e.g. 'encoder.layer.0.*'.")
    lr_scale: float = Field(1.0, gt=0, description="The scheduled learning rate times this, for these parameters.")
    weight_decay: float | None = Field(
        None, ge=0, description="Weight decay of these parameters (all of them, biases too); null = train's rule."
    )


class ProfileParams(Section):
    start: int = Field(5, ge=1, description="The first profiled update: the ones before it warm up (not recorded).")
    updates: int = Field(5, ge=1, description="How many updates to record.")


class TrainParams(Section):
    epochs: int | Literal["auto"] = Field(
        "auto",
        description="Maximum number of passes over the training split (early stopping may end it sooner). auto: "
        "enough passes for at least 1,000 optimizer updates and at least 40 passes, so a small table (a few "
        "updates a pass) trains as long as a large one; resolved where the updates per pass are known, recorded as "
        "epochs_planned in models/final/training.json, and kept by a resumed run. A number: exactly that many.",
    )
    batch_size: int | Literal["auto"] = Field(
        64,
        description="Micro-batch size per process: samples per forward/backward pass. auto (with global_batch) = the "
        "largest that fits (CUDA: probed; CPU: within memory_budget_mb) among the divisors of global_batch / "
        "world_size, with accumulate making up the rest exactly.",
    )
    accumulate: int = Field(
        1, ge=1, description="Micro-batches per optimizer update; an update sees batch_size * accumulate samples."
    )
    global_batch: int | None = Field(
        None,
        ge=1,
        description="Samples per optimizer update over all processes: batch_size * accumulate * world_size. Needed "
        "by batch_size auto, which keeps it exact on any machine; with a fixed batch_size it must equal that product "
        "(a check). null = whatever the product is.",
    )
    memory_budget_mb: float | None = Field(
        None,
        gt=0,
        description="batch_size auto: the most memory (MiB, 2**20 bytes) one micro-batch may take: parameters, "
        "gradients, optimizer state and the activations saved for backward (CPU: estimated from small "
        "forward/backward passes; CUDA: the probe's measured peak, within the GPU's memory anyway). null = no limit "
        "on CPU (the whole global batch at once), the GPU's memory on CUDA.",
    )
    shuffle: Literal["auto", "rows", "blocks"] = Field(
        "auto",
        description="Each epoch's sample order, a function of (seed, epoch) alone either way, the same for any batch "
        "size, accumulation or number of processes. rows: a random permutation of the rows. blocks (tables): "
        "blocks of 64 consecutive rows in a random order, the rows of each 16 blocks mixed; a table streamed "
        "from disk is then read 64 rows at a time, not one. auto: blocks for a table streamed from disk "
        "(data.memory_budget_mb), rows otherwise. Set blocks to train on the same order whether or not the data "
        "is streamed.",
    )
    optimizer: Literal["adamw", "sgd"] = Field(
        "adamw", description="adamw, or sgd with momentum; weight decay never applies to biases and norm weights."
    )
    lr: float = Field(2e-3, gt=0, le=10, description="Peak learning rate, reached after the warmup.")
    min_lr: float = Field(
        2e-5,
        ge=0,
        description="Floor of the schedule (absolute learning rate): where cosine, linear and one_cycle end.",
    )
    momentum: float = Field(0.9, ge=0, lt=1, description="sgd: momentum.")
    weight_decay: float = Field(0.01, ge=0, description="Decoupled weight decay (not applied to biases and norms).")
    layer_decay: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Layer-wise learning-rate decay (text_transformer and hf: models): the head learns at the "
        "scheduled rate, each layer below it at this factor times the one above (layer l of L: "
        "layer_decay**(L + 1 - l), the embeddings l = 0); null = one rate for all.",
    )
    param_groups: list[ParamGroupRule] = Field(
        default_factory=list,
        description="Optimizer settings for parameters by name: a list of {match: glob on parameter names "
        "(e.g. 'encoder.*'), lr_scale, weight_decay}; the first rule matching a parameter applies (times "
        "layer_decay's factor). A rule that matches no parameter is an error listing the model's parameter names.",
    )
    label_smoothing: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Classification: the training loss's targets put this much probability on the other classes "
        "(val_loss and the test metrics stay the plain cross-entropy).",
    )
    class_weights: Literal["none", "balanced"] = Field(
        "none",
        description="Classification: weigh each sample's training loss by its class: balanced = n / (classes * "
        "count of the class) over the train split (sklearn's definition; saved in training.json with the model).",
    )
    ema_decay: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Keep an exponential moving average of the weights (ema = decay * ema + (1 - decay) * weights, "
        "after each applied update); validation, the best checkpoint and the exported model use it. null = off.",
    )
    activation_checkpointing: bool = Field(
        False,
        description="text_transformer and hf: models: keep only each layer's input for backward and recompute the "
        "rest (less activation memory for about one more forward pass; the same gradients).",
    )
    schedule: Literal["constant", "cosine", "linear", "one_cycle", "plateau"] = Field(
        "cosine",
        description="Learning rate over optimizer updates: constant, cosine or linear decay to min_lr after a linear "
        "warmup; one_cycle (cosine up from lr/25 during the warmup, then down to min_lr); plateau (constant after "
        "the warmup, times plateau_factor after plateau_patience evaluations without improvement of `monitor`).",
    )
    warmup_fraction: float = Field(
        0.05, ge=0, lt=1, description="Fraction of all optimizer updates spent warming the learning rate up."
    )
    plateau_factor: float = Field(0.5, gt=0, lt=1, description="plateau: multiply the learning rate by this.")
    plateau_patience: int = Field(
        2, ge=1, description="plateau: evaluations without improvement before the learning rate is lowered."
    )
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto",
        description="Numeric precision: fp32; bf16 autocast (CPU and CUDA); fp16 autocast with a GradScaler "
        "(CUDA; on CPU it runs, slowly); auto = bf16 on GPUs with native bf16 (compute capability 8.0+: A100, "
        "H100, RTX 30xx+), else fp32.",
    )
    tf32: bool = Field(False, description="CUDA: allow TF32 tensor cores for fp32 matmuls and convolutions.")
    max_grad_norm: float | None = Field(
        1.0, gt=0, description="Clip the global gradient norm to this value (after unscaling); null disables."
    )
    max_nonfinite: int = Field(
        5,
        ge=1,
        description="Stop with an error after this many consecutive updates with a non-finite loss/gradient (fp16: "
        "16 more, the GradScaler's own overflow probes as it halves its initial scale of 2**16).",
    )
    eval_every: int | None = Field(
        None, ge=1, description="Evaluate on the val split every this many optimizer updates; null = once per epoch."
    )
    monitor: Monitor = Field(
        "val_loss",
        description="Validation metric for early stopping, the best checkpoint and the plateau schedule. "
        "Classification: val_loss, val_accuracy, val_ece (expected calibration error), val_roc_auc, val_pr_auc "
        "(average precision; binary: of class index 1, else the macro one-vs-rest average; one label per sample "
        "only, and only computed when monitored); regression: val_loss, val_rmse, val_r2.",
    )
    mode: Literal["auto", "min", "max"] = Field(
        "auto",
        description="Whether `monitor` should go down (min) or up (max); auto: min for loss/rmse/ece, else max.",
    )
    patience: int = Field(
        8,
        ge=1,
        description="Early stopping: stop after this many evaluations (not epochs, unless eval_every is null) without "
        "an improvement of `monitor` by more than min_delta.",
    )
    min_delta: float = Field(0.0, ge=0, description="Early stopping: the least change in `monitor` that counts.")
    checkpoint_every: int | None = Field(
        None, ge=1, description="Also checkpoint every this many optimizer updates (always at each epoch end)."
    )
    keep_last: int = Field(
        2, ge=1, description="Periodic checkpoints to keep; the last and the best are never deleted."
    )
    resume: str = Field(
        "auto",
        min_length=1,
        description="auto: resume from the newest checkpoint in models/checkpoints if its training params, code "
        "and data match the current ones, else start fresh; never: always start fresh; or the path of a "
        "checkpoint directory to continue from (whatever params wrote it).",
    )
    log_every: int = Field(
        50, ge=1, description="Read the loss from the device and log it every this many optimizer updates."
    )
    compile: bool = Field(False, description="torch.compile the model for training (the uncompiled model is saved).")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Where to train; auto = cuda if available.")
    world_size: int | Literal["auto"] = Field(
        1,
        description="Training processes (ranks). With more than 1, the train stage starts them itself on this machine "
        "(torch's elastic launcher); under torchrun (multi-node) WORLD_SIZE wins. auto = the visible GPUs, or 1 on "
        "CPU. batch_size is per process: an update's global batch is batch_size * accumulate * world_size.",
    )
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="With several ranks: ddp (a full model copy per rank) or fsdp (FSDP2 fully_shard: parameters, "
        "gradients and optimizer state sharded across ranks; fp32 or bf16).",
    )
    backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="torch.distributed backend with several ranks; auto = nccl on CUDA, gloo on CPU."
    )
    sync_batchnorm: bool = Field(
        False,
        description="With several ranks on CUDA: BatchNorm layers become SyncBatchNorm, normalising each micro-batch "
        "with the statistics of every rank's micro-batch at that step (batch_size * world_size samples). false: each "
        "rank normalises its own micro-batch, as one process with accumulate * world_size would.",
    )
    deterministic: bool = Field(
        False, description="Deterministic kernels only (torch.use_deterministic_algorithms, cuDNN, cuBLAS workspace)."
    )
    max_steps: int | None = Field(None, ge=1, description="Stop after this many optimizer updates (smoke runs).")
    limit_batches: int | None = Field(
        None, ge=1, description="Smoke runs: at most this many updates per epoch and batches per evaluation."
    )
    overfit_batches: int | None = Field(
        None,
        ge=1,
        description="Debug: train and validate on the same first N windows of samples; the loss should reach ~0.",
    )
    detect_anomaly: bool = Field(
        False, description="Debug: autograd anomaly detection names the op that produced a NaN (slow)."
    )
    progress: bool = Field(True, description="Show a progress bar on stderr.")
    profile: ProfileParams | None = Field(
        None,
        description="Record a torch.profiler trace of `updates` updates from update `start` (CPU, and CUDA where "
        "present) into reports/profile/, logged with the MLflow run; open it in Perfetto or TensorBoard. null: off "
        "(costs nothing).",
    )
    preempt_signals: list[str] = Field(
        ["SIGTERM", "SIGINT", "SIGUSR1"],
        description="Signals that stop training at the next update boundary with a checkpoint and exit code 75 "
        "(preempted, resumable: a rerun continues bit for bit); a second signal stops at once. [] to leave them be.",
    )
    max_time: float | None = Field(
        None,
        description="Wall-clock budget of one training run, from its first update (seconds, or 20s, 45m, 2h, 1h30m): "
        "past it, stop at the next update with a checkpoint and exit code 75, so the next run (a job's next "
        "allocation) continues. null: no limit.",
    )

    @field_validator("preempt_signals")
    @classmethod
    def _known_signals(cls, v: list[str]) -> list[str]:
        import signal

        unknown = [name for name in v if name not in signal.Signals.__members__]
        if unknown:
            raise ValueError(f"unknown signal(s) {', '.join(unknown)}; use names such as SIGTERM, SIGINT, SIGUSR1")
        if uncatchable := [name for name in v if name in ("SIGKILL", "SIGSTOP")]:
            raise ValueError(f"{', '.join(uncatchable)} cannot be caught; a process killed so resumes from its last "
                             "periodic checkpoint")  # fmt: skip
        return v

    @field_validator("max_time", mode="before")
    @classmethod
    def _duration(cls, v: float | str | None) -> float | None:
        if v is None:
            return None
        value = duration_seconds(v)
        if value <= 0:
            raise ValueError(f"must be a positive duration, got {v!r}")
        return value

    @field_validator("world_size", "batch_size", "epochs")
    @classmethod
    def _positive_world(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be at least 1 (or auto)")  # the message adds "(got 0)"
        return v

    @model_validator(mode="after")
    def _global_batch(self) -> TrainParams:
        if self.batch_size == "auto":
            if self.global_batch is None:
                raise ValueError(
                    "train.batch_size auto needs train.global_batch (the samples per optimizer update to keep, "
                    "e.g. global_batch: 64); set it, or set batch_size to a number"
                )
            if self.accumulate != 1:
                raise ValueError(
                    f"train.accumulate ({self.accumulate}): batch_size auto chooses it (global_batch / world_size / "
                    "batch_size); leave accumulate at 1, or set batch_size to a number"
                )
        elif (world := _known_world_size(self.world_size)) and (problem := global_batch_problem(self, world)):
            raise ValueError(problem)
        return self

    @property
    def micro_batch(self) -> int:
        """batch_size as the engine sees it: a number (the train stage's setup() resolves auto before training)."""
        if not isinstance(self.batch_size, int):
            raise TypeError("train.batch_size auto must be resolved (trainflow.engine.batch_size.resolve) first")
        return self.batch_size

    @model_validator(mode="after")
    def _floor_below_peak(self) -> TrainParams:
        if self.min_lr > self.lr:
            raise ValueError(f"train.min_lr ({self.min_lr:g}) is above train.lr ({self.lr:g}); lower min_lr")
        return self

    @property
    def minimize(self) -> bool:
        return self.mode == "min" or (self.mode == "auto" and self.monitor in MINIMIZED)


_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$")


def duration_seconds(value: float | str) -> float:
    """A duration: seconds as a number, or text such as 20s, 45m, 2h, 1h30m, 1d."""
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.match(value.replace(" ", ""))
    if not match or not any(match.groups()):
        raise ValueError(f"{value!r} is not a duration; write seconds (3600) or e.g. 20s, 45m, 2h, 1h30m, 1d")
    days, hours, minutes, secs = (float(g) if g else 0.0 for g in match.groups())
    return days * 86400 + hours * 3600 + minutes * 60 + secs


def _known_world_size(world_size: int | str) -> int | None:
    """The number of processes, when the params alone say it: not auto, and not under torchrun (its WORLD_SIZE wins;
    the train stage checks global_batch again with the real number)."""
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    return world_size if isinstance(world_size, int) and not launched else None


def global_batch_problem(train: TrainParams, world: int) -> str | None:
    """Why a fixed batch_size disagrees with train.global_batch on `world` processes, or None when it agrees."""
    if train.global_batch is None or not isinstance(train.batch_size, int):
        return None
    product = train.batch_size * train.accumulate * world
    if product == train.global_batch:
        return None
    return (
        f"train.global_batch ({train.global_batch}) is not train.batch_size * train.accumulate * world size "
        f"({train.batch_size} * {train.accumulate} * {world} = {product}); make them agree, set global_batch: null, "
        "or set batch_size: auto to have batch_size and accumulate chosen for it"
    )


class EvaluateParams(Section):
    batch_size: int = Field(
        1024,
        ge=1,
        description="Rows per forward pass when scoring the test split. 1024 is also what `trainflow predict` and the "
        "served model use, so their outputs match evaluate's bit for bit.",
    )


GateMetric = Literal["auto", "accuracy", "f1_macro", "log_loss", "roc_auc", "pr_auc", "ece", "r2", "rmse", "mae"]


class RegisterParams(Section):
    model_name: str = Field(
        "auto",
        min_length=1,
        description="Registered model name in MLflow. One name holds one kind of model (one target, one task): a run "
        "predicting something else is refused under a name that holds another. auto = named after the data: "
        "trainflow-<name> for builtin:<name> (trainflow-digits), else <file or folder name>-<target> "
        "(data/raw/titanic.csv, Survived: titanic-Survived), with -<task> after it when data.task is set.",
    )
    gate_metric: GateMetric = Field(
        "auto",
        description="Test metric that decides whether a new version becomes the champion: accuracy, f1_macro, "
        "log_loss, roc_auc, pr_auc or ece (classification; log_loss and ece lower is better), r2, rmse or mae "
        "(regression); auto = accuracy or r2.",
    )
    decide: Literal["paired", "point"] = Field(
        "paired",
        description="How the gate decides. paired = champion and challenger scored on the same test rows, a seeded "
        "paired permutation test of the gate metric's improvement (sign flips of the per-row differences, or swaps "
        "of the two models' outputs per row; McNemar's test too for accuracy): promoted only when it shows an "
        "improvement above min_improvement at `confidence`, and never on fewer than 20 test rows, so a difference "
        "of a prediction or two on a small test set does not flip the champion. point = the challenger's value "
        "beats the champion's by more than min_improvement (no test).",
    )
    confidence: float = Field(
        0.95, gt=0.5, lt=1, description="decide: paired: the one-sided confidence of the bound that decides."
    )
    min_improvement: float = Field(
        0.0,
        ge=0,
        description="The improvement of the gate metric (in its units: 0.01 = one accuracy point) the challenger must "
        "show, beyond the bound (paired) or the champion's value (point), to take the alias.",
    )
    promote_if: Literal["better", "not_worse"] = Field(
        "better",
        description="decide: paired: better = promote when shown better; not_worse = promote unless shown worse by "
        "more than min_improvement (retrains whose purpose is fresher data).",
    )
    flavor: Literal["package", "code"] = Field(
        "package",
        description="How the registered model is stored in MLflow. package = its data only (weights, ONNX, JSON) and "
        "`loader_module: trainflow.serving` of the installed trainflow (pinned by version): loading it runs no code "
        "from the artifact store. code = MLflow models-from-code, trainflow's code stored with the model, for "
        "machines that serve it without trainflow installed; loading it runs that stored code, so whoever can write "
        "to the artifact store can run code where it is loaded. `trainflow predict` reads either as data.",
    )
    tags: dict[str, str] = Field(
        default_factory=dict,
        description="Extra tags for each registered version (the lineage tags win on a clash); `trainflow tune "
        "--apply` sets tune_study and tune_trial here, naming where the params came from.",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "min_delta" in data:
            raise ValueError(
                "min_delta was renamed register.min_improvement (it applies to both register.decide rules); "
                "rename it in params.yaml"
            )
        return data


class TrackingParams(Section):
    experiment: str = Field("trainflow", min_length=1, description="MLflow experiment name for training runs.")
    tensorboard: bool = Field(
        False,
        description="Also write the training metrics as TensorBoard event files under reports/tensorboard/, a "
        "subfolder per run (sweep trials: tune/<study>/trial_NNNN/); `tensorboard --logdir reports/tensorboard`.",
    )


DEFAULT_CRON = "0 3 * * *"
DEPLOYMENT_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*$")


class DeployParams(Section):
    """Scheduled retraining (`trainflow deploy`, prefect.yaml). No stage reads it, so changing it reruns nothing."""

    name: str = Field(
        "nightly",
        description="Deployment name; runs are started with `prefect deployment run training_pipeline/<name>`.",
    )
    cron: str = Field(
        DEFAULT_CRON,
        description="When to retrain: a five-field cron expression (minute hour day-of-month month day-of-week), "
        "e.g. '0 3 * * *' = every day at 03:00.",
    )
    timezone: str = Field(
        "UTC", description="IANA time zone the cron expression is read in (e.g. UTC, Europe/Paris, America/New_York)."
    )
    work_pool: str = Field(
        "trainflow-pool",
        min_length=1,
        description="Process work pool of the prefect.yaml deployment, for teams running a Prefect server and workers.",
    )
    push: bool = Field(
        True,
        description="After a successful flow run, push the DVC outputs (data, checkpoints, model) to DVC's default "
        "remote; skipped when no default remote is configured.",
    )
    on_new_data: bool = Field(
        True,
        description="Also retrain when new data lands: the deployment gets a trigger on the Prefect event "
        "trainflow.data.added that `trainflow data add` (and `trainflow data watch`) emit for each new file.",
    )

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str) -> str:
        if not DEPLOYMENT_NAME.match(v):
            raise ValueError("must be letters, digits, '.', '_' or '-', starting with a letter or digit")
        return v

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, v: str) -> str:
        return check_cron(v)

    @field_validator("timezone")
    @classmethod
    def _valid_timezone(cls, v: str) -> str:
        from zoneinfo import available_timezones  # the list Prefect checks schedules against

        if v not in available_timezones():
            raise ValueError("unknown time zone; use an IANA name such as UTC, Europe/Paris, America/New_York")
        return v


# --- sweeps ----------------------------------------------------------------------------------------------------------

# The sections a sweep may vary: what the trained model depends on, beyond the split (fixed for a whole study).
TUNABLE_SECTIONS = ("features", "model", "train")
# Resources and bookkeeping: not hyperparameters (a trial runs in one process).
UNTUNABLE = {"train.world_size", "train.strategy", "train.backend", "train.device", "train.resume", "train.progress"}


class Dimension(Section):
    """One dimension of the search space: a float or int range, or a list of choices."""

    type: Literal["float", "int", "categorical"] = Field(description="float, int (a range) or categorical (choices).")
    low: float | None = Field(None, description="float/int: the smallest value.")
    high: float | None = Field(None, description="float/int: the largest value (included).")
    log: bool = Field(False, description="float/int: sample on a log scale (learning rates, weight decay).")
    step: float | None = Field(None, gt=0, description="float/int: sample on a grid of this spacing from low.")
    choices: list[Any] | None = Field(
        None, min_length=1, description="categorical: the values, any YAML (e.g. lists for model.hidden_sizes)."
    )

    @model_validator(mode="after")
    def _complete(self) -> Dimension:
        if self.type == "categorical":
            if self.choices is None or self.low is not None or self.high is not None:
                raise ValueError("a categorical dimension takes `choices` (a list), not low/high")
            return self
        if self.low is None or self.high is None or self.choices is not None:
            raise ValueError(f"a {self.type} dimension takes `low` and `high`, not choices")
        if self.low > self.high:
            raise ValueError(f"low ({self.low:g}) is above high ({self.high:g})")
        if self.log and (self.low <= 0 or self.step is not None):
            raise ValueError("log: true needs low > 0 and no step")
        if self.type == "int" and not all(float(v).is_integer() for v in (self.low, self.high, self.step or 1)):
            raise ValueError("an int dimension takes whole numbers for low, high and step")
        return self

    def values_to_check(self) -> list[Any]:
        """The values that bound what a sampler can draw: each sampled value lies between (or among) them."""
        if self.type == "categorical":
            assert self.choices is not None
            return list(self.choices)
        assert self.low is not None and self.high is not None
        if self.type == "int":
            return [int(self.low), int(self.high)]
        return [self.low, self.high]


def default_space() -> dict[str, Dimension]:
    return {
        "train.lr": Dimension.model_validate({"type": "float", "low": 1e-4, "high": 1e-2, "log": True}),
        "model.dropout": Dimension.model_validate({"type": "float", "low": 0.0, "high": 0.5}),
        "model.hidden_sizes": Dimension.model_validate(
            {"type": "categorical", "choices": [[128], [256, 128], [512, 256]]}
        ),
    }


class TuneParams(Section):
    """Hyperparameter sweeps (`trainflow tune`, flows/sweep.py). No stage reads it, so changing it reruns nothing."""

    study: str = Field(
        "trainflow",
        min_length=1,
        description="Study name in the storage. Rerunning `trainflow tune` continues it (same params required); "
        "start a new study under a new name.",
    )
    trials: int = Field(
        12, ge=1, description="Total number of trials of the study, across restarts, workers and machines."
    )
    workers: int = Field(2, ge=1, description="Trials run at the same time by one `trainflow tune` (processes).")
    metric: Literal["auto"] | Monitor = Field(
        "auto",
        description="Validation metric to optimise, reported at every evaluation (for pruning); a trial's value is "
        "it at the trial's best checkpoint. auto = train.monitor (val_roc_auc and val_pr_auc only as train.monitor).",
    )
    direction: Literal["auto", "minimize", "maximize"] = Field(
        "auto", description="auto: as train.mode for train.monitor; minimize for loss/rmse/ece, maximize otherwise."
    )
    sampler: Literal["tpe", "random", "grid"] = Field(
        "tpe",
        description="tpe (Optuna's default Bayesian sampler), random, or grid (every combination of categorical and "
        "stepped dimensions). Trial n is sampled with a seed derived from (seed, n), so a restarted study suggests "
        "what the uninterrupted one would have.",
    )
    pruner: Literal["median", "hyperband", "none"] = Field(
        "median",
        description="Stop unpromising trials early, from the metric at each evaluation: median (below the median of "
        "earlier trials at the same update), hyperband, or none.",
    )
    seed: int | None = Field(None, ge=0, description="Seed of the sampler; null = the top-level seed.")
    backend: Literal["optuna", "ray"] = Field(
        "optuna",
        description="optuna (trainflow's own workers on the study's storage) or ray (Ray Tune with ASHA, the "
        "optional extra `.[ray]`: on the cluster of RAY_ADDRESS, else a local one; tune.storage is not used).",
    )
    storage: str | None = Field(
        None,
        description="Where the study lives: null = an Optuna journal file, models/tune/journal.log (safe for "
        "parallel local workers); a file path for another journal; or a database URL (postgresql://..., "
        "mysql://...) that workers on many machines share.",
    )
    space: dict[str, Dimension] = Field(
        default_factory=default_space,
        description="What to search: dotted param paths (features, model or train) to dimensions, e.g. "
        "train.lr: {type: float, low: 1e-4, high: 1e-2, log: true}. The current params are trial 0 (with tpe or "
        "random) when they lie in the space, so the best trial is never worse than what you have.",
    )

    @model_validator(mode="after")
    def _space_paths(self) -> TuneParams:
        problems = [why for path in self.space if (why := _check_path(path))]
        if problems:
            raise ValueError("\n".join(problems))  # one problem per line, each reported with its own path
        return self


def _check_path(path: str) -> str | None:
    """Why `path` cannot be a dimension of the space, or None: it names a field (or a key of model.kwargs) of a
    section a sweep may vary."""
    section, _, field = path.partition(".")
    if path in UNTUNABLE:
        return f"tune.space.{path}: not a hyperparameter (a trial runs in one process)"
    if section not in TUNABLE_SECTIONS or not field:
        return (
            f"tune.space.{path}: a sweep varies {', '.join(TUNABLE_SECTIONS)} params (data and split stay fixed for "
            "a study); write section.field, e.g. train.lr"
        )
    fields = {"features": FeatureParams.model_fields, "model": ModelParams.model_fields}.get(
        section, TrainParams.model_fields
    )
    name = field.split(".")[0]
    if name not in fields:
        return f"tune.space.{path}: {section} has no field {name!r} (`trainflow params schema` lists them)"
    if "." in field and name != "kwargs":
        return f"tune.space.{path}: {section}.{name} has no sub-fields"
    return None


def check_cron(expr: str) -> str:
    """Validate a cron expression the way Prefect's scheduler will read it.

    Prefect's check lives behind `import prefect`, a slow import that every `trainflow stage` process would pay on
    loading params; the default expression is known good (a unit test runs it through Prefect), so only a
    changed one is checked there.
    """
    if expr == DEFAULT_CRON:
        return expr
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=expr)
    except ValidationError:
        raise ValueError(
            "not a cron expression Prefect accepts: five fields minute hour day-of-month month day-of-week, "
            "e.g. '0 3 * * *' (daily at 03:00) or '0 3 * * 1' (Mondays at 03:00); H and R are not supported"
        ) from None
    return expr


# `register` is a stage name here, not ABCMeta.register; pydantic warns about the shadowing, harmlessly.
warnings.filterwarnings("ignore", message='Field name "register"', category=UserWarning)


class PipelineParams(Section):
    seed: int = Field(
        42,
        ge=0,
        description="The training seed: initialisation, data order, augmentation and the paired gate's permutations. "
        "It does not move rows between splits (split.seed does).",
    )
    data: DataParams = Field(default_factory=DataParams, description="Raw data source and schema (ingest).")  # type: ignore[arg-type]
    features: FeatureParams = Field(default_factory=FeatureParams, description="Preprocessing fitted on train (train).")  # type: ignore[arg-type]
    split: SplitParams = Field(default_factory=SplitParams, description="Train/val/test split (split).")  # type: ignore[arg-type]
    model: ModelParams = Field(default_factory=ModelParams, description="Model architecture (train).")  # type: ignore[arg-type]
    train: TrainParams = Field(default_factory=TrainParams, description="Training loop (train).")  # type: ignore[arg-type]
    evaluate: EvaluateParams = Field(default_factory=EvaluateParams, description="Test scoring (evaluate).")  # type: ignore[arg-type]
    register: RegisterParams = Field(default_factory=RegisterParams, description="Model registry (register).")  # type: ignore[arg-type]
    tracking: TrackingParams = Field(default_factory=TrackingParams, description="MLflow tracking.")  # type: ignore[arg-type]
    deploy: DeployParams = Field(default_factory=DeployParams, description="Scheduled retraining (no stage).")  # type: ignore[arg-type]
    tune: TuneParams = Field(default_factory=TuneParams, description="Hyperparameter sweeps (no stage).")  # type: ignore[arg-type]

    def sections(self, names: Iterable[str]) -> dict[str, Any]:
        """{name: its value} of the named top-level params: what the dispatcher hands a stage (its keywords), so
        that a stage's signature shows what it may read. The one place a stage's params are picked out of the
        whole."""
        unknown = [n for n in names if n not in type(self).model_fields]
        if unknown:
            raise ValueError(f"no top-level params named {', '.join(unknown)}")
        return {n: getattr(self, n) for n in names}

    @model_validator(mode="after")
    def _model_name(self) -> PipelineParams:
        """register.model_name auto becomes the name of the data, so that new data is registered under its own name."""
        if self.register.model_name == "auto":
            task = None if self.data.task == "auto" else self.data.task
            self.register.model_name = default_model_name(self.data.source, self.data.target, task)
        return self

    @model_validator(mode="after")
    def _space_values(self) -> PipelineParams:
        """Every bound and choice of tune.space is a valid value of its param, beside the other params as they are
        (a sampled value lies between or among them, so trials do not fail on invalid params)."""
        problems = []
        for path, dim in self.tune.space.items():
            section, _, field = path.partition(".")
            current: Section = getattr(self, section)
            for value in dim.values_to_check():
                raw = current.model_dump()
                _set(raw, field.split("."), value)
                try:
                    type(current).model_validate(raw)
                except ValidationError as exc:
                    why = "; ".join(msg for _, msg in _problems(exc))
                    problems.append(f"tune.space.{path}: {value!r} is not a valid value ({why})")
        if problems:
            raise ValueError("\n".join(problems))  # one problem per line, each reported with its own path
        return self


# --- overrides -------------------------------------------------------------------------------------------------------


def parse_override(text: str) -> tuple[list[str], Any]:
    """`train.lr=3e-4` -> (["train", "lr"], 0.0003). The value is YAML, as in `dvc exp run -S`."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ParamsError("-S", [(text, "an override must look like key.subkey=value, e.g. -S train.lr=3e-4")])
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ParamsError("-S", [(key, f"value {raw!r} is not valid YAML: {exc}")]) from None
    return key.split("."), value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set each dotted key in a copy of `raw`; unknown keys are left for validation to report."""
    import copy

    out = copy.deepcopy(raw)
    for text in overrides:
        _set(out, *parse_override(text))
    return out


def _set(node: dict[str, Any], keys: list[str], value: Any) -> None:
    for k in keys[:-1]:
        child = node.get(k)
        if not isinstance(child, dict):
            child = {}
            node[k] = child
        node = child
    node[keys[-1]] = value


def with_values(params: PipelineParams, values: dict[str, Any], source: str) -> PipelineParams:
    """`params` with each dotted path set to its value, validated (ParamsError naming `source` otherwise)."""
    raw = params.model_dump(mode="json")
    for path, value in values.items():
        _set(raw, path.split("."), value)
    return validate(raw, source)


def _problems(exc: ValidationError) -> list[tuple[str, str]]:
    problems = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown parameter (check the spelling; `trainflow params schema` lists the valid ones)"
        elif "input" in err and not isinstance(err["input"], dict):
            msg = f"{msg} (got {err['input']!r})"
        elif LOCATED.match(msg):  # a validator's list of "dotted.path: problem" lines (tune.space)
            problems += [(line.split(": ", 1)[0], line.split(": ", 1)[1]) for line in msg.splitlines()]
            continue
        problems.append((path or "<root>", msg))
    return problems


LOCATED = re.compile(r"^(tune\.space\.\S+: .+\n?)+$")


# libyaml's parser where PyYAML was built with it (its wheels are): params.yaml is read by every stage and command,
# and PyYAML's pure-Python parser is an order of magnitude slower. Same resolver and constructor.
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _compose(text: str) -> tuple[yaml.Node | None, yaml.SafeLoader]:
    """The document's node tree, and the loader that made it (to construct the values from it: one parse)."""
    loader = _LOADER(text)
    try:
        return loader.get_single_node(), loader
    finally:
        loader.dispose()


def duplicate_keys(text: str) -> list[tuple[str, str]]:
    """Every key given twice in one mapping, as (dotted path, where): YAML forbids them, PyYAML silently keeps the
    last one (so `params check` passed), and DVC refuses the whole file with a traceback."""
    return _duplicates(_compose(text)[0])


def _duplicates(root: yaml.Node | None) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []

    def walk(node: yaml.Node, path: str) -> None:
        if isinstance(node, yaml.MappingNode):
            first: dict[str, int] = {}
            for key_node, value in node.value:
                key, line = str(key_node.value), key_node.start_mark.line + 1
                dotted = f"{path}.{key}" if path else key
                if key in first:
                    problems.append((dotted, f"given twice (lines {first[key]} and {line}); keep one of them"))
                first.setdefault(key, line)
                walk(value, dotted)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, f"{path}[{i}]")

    if root is not None:
        walk(root, "")
    return problems


def read_raw(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ParamsError(str(path), [("<file>", "file not found; run from the project root or create params.yaml")])
    text = path.read_text()
    try:
        root, loader = _compose(text)
        if duplicates := _duplicates(root):
            raise ParamsError(str(path), duplicates)
        raw = (loader.construct_document(root) if root is not None else None) or {}
    except yaml.YAMLError as exc:
        raise ParamsError(str(path), [("<file>", f"not valid YAML: {exc}")]) from None
    if not isinstance(raw, dict):
        raise ParamsError(str(path), [("<root>", "params.yaml must be a mapping of sections")])
    return raw


def validate(raw: dict[str, Any], source: str) -> PipelineParams:
    try:
        return PipelineParams.model_validate(raw)
    except ValidationError as exc:
        raise ParamsError(source, _problems(exc)) from None


def load_params(path: Path, overrides: list[str] | None = None) -> PipelineParams:
    """Read, override and validate params.yaml (contract). Raises ParamsError with every problem."""
    raw = apply_overrides(read_raw(path), overrides or [])
    source = str(path) + (" with -S overrides" if overrides else "")
    # data.source outside the project is checked here, where the project root is known (params.yaml's folder), so
    # that `params check`, `run` and every stage refuse it before anything runs or -S is written.
    data = raw.get("data")
    given = data.get("source") if isinstance(data, dict) else None
    outside = source_outside(given, path.parent.absolute()) if isinstance(given, str) else None
    problems = [("data.source", outside)] if outside else []
    try:
        params = validate(raw, source)
    except ParamsError as exc:
        raise ParamsError(source, exc.problems + problems) from None  # every problem at once
    if problems:
        raise ParamsError(source, problems)
    return params


def write_overrides(path: Path, overrides: list[str]) -> None:
    """Write validated overrides into params.yaml in place, keeping comments, as `dvc exp run -S` does."""
    if not overrides:
        return
    from ruamel.yaml import YAML

    from trainflow.core.io import atomic_path

    load_params(path, overrides)  # validate first: an invalid override never reaches the file
    rt = YAML()
    rt.preserve_quotes = True
    rt.width = 4096  # never wrap a line (a flow-style mapping such as a tune.space dimension stays on its line)
    # ruamel writes None as an empty value; keep the file's `null`s as they are written.
    rt.representer.add_representer(
        type(None), lambda dumper, _: dumper.represent_scalar("tag:yaml.org,2002:null", "null")
    )
    doc = rt.load(path.read_text())
    for text in overrides:
        keys, value = parse_override(text)
        node = doc
        for k in keys[:-1]:
            if k not in node or node[k] is None:
                node[k] = {}
            node = node[k]
        node[keys[-1]] = _flow(value)
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        rt.dump(doc, f)


def _flow(value: Any) -> Any:
    """Lists and mappings from -S in flow style (`exclude: [a, b]`), so they stay on the line of their comment."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if isinstance(value, list):
        seq = CommentedSeq(_flow(v) for v in value)
        seq.fa.set_flow_style()
        return seq
    if isinstance(value, dict):
        mapping = CommentedMap((k, _flow(v)) for k, v in value.items())
        mapping.fa.set_flow_style()
        return mapping
    return value


def schema() -> dict[str, Any]:
    return PipelineParams.model_json_schema()
