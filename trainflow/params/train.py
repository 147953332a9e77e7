"""train: the training loop (optimizer, schedule, precision, ranks, checkpoints, stopping)."""

from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from trainflow.params.base import Section

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
    packing: bool = Field(
        False,
        description="Text: train on the real tokens only. Each micro-batch's sequences (the same samples, in the same "
        "order, as without packing) are packed back to back instead of padded to the longest: text_bag reads "
        "them as one row, text_transformer as rows as wide as the batch's longest sequence, attention, "
        "positions and pooling kept within each sequence, so a sequence's output is what it is unpadded. The "
        "loss, accumulation and sample order are unchanged; validation and prediction pad as before. For "
        "text_bag, text_transformer and hf: models (encoders of BERT's family and decoders, sdpa or eager "
        "attention, no sliding window).",
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
    precision: Literal["auto", "fp32", "bf16", "fp16", "fp8"] = Field(
        "auto",
        description="Numeric precision: fp32; bf16 autocast (CPU and CUDA); fp16 autocast with a GradScaler "
        "(CUDA; on CPU it runs, slowly); fp8 runs the model's Linear layers (sizes multiples of 16, not the output "
        "head) as torchao's float8 training, with bf16 autocast around them, on an H100/H200 (compute capability "
        "9.0+) with torchao installed (pip install -e '.[fp8]'); auto = bf16 on GPUs with native bf16 "
        "(compute capability 8.0+: A100, H100, RTX 30xx+), else fp32.",
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
    compile: Literal[False, True, "reduce-overhead"] = Field(
        False,
        description="torch.compile the model for training (the uncompiled model is saved). reduce-overhead: also "
        "replay its forward and backward as CUDA graphs (torch.compile's mode of that name), for small models whose "
        "step the host's Python paces; one process on CUDA, tables and images or text of one length (otherwise it "
        "compiles as true, saying why); on CPU it runs as true.",
    )
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
