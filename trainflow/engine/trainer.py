"""The trainer: `fit()` runs epochs of optimizer updates; `train_step()` is one whole update, top to bottom.

Units: an *update* is one optimizer step over a *window* of up to `batch_size * accumulate` samples, split into
micro-batches of `batch_size`. The loss of an update is the sum of per-sample losses over the window divided once by
the number of samples in that window, so a smaller last window is weighted exactly like a full one and micro-batch
B x accumulate 1 computes the same gradient as micro-batch B/4 x accumulate 4.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from trainflow.engine.checkpoint import (
    capture_rng,
    flatten_optimizer,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
    unflatten_optimizer,
)
from trainflow.engine.precision import Precision
from trainflow.engine.schedule import warmup_cosine
from trainflow.errors import UserError
from trainflow.params import TrainParams

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (outputs, targets) -> per-sample losses


class Logger(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...
    def close(self) -> None: ...


class NullLogger:
    def log(self, metrics: dict[str, float], step: int) -> None:
        pass

    def close(self) -> None:
        pass


class NonFiniteError(UserError):
    """Too many consecutive updates had a non-finite loss or gradient."""


@dataclass
class TrainState:
    """Progress counters; everything here goes into meta.json of each checkpoint."""

    epoch: int = 0  # epochs completed
    updates: int = 0  # optimizer updates applied (the schedule's clock)
    skipped: int = 0  # updates skipped for a non-finite loss/gradient, in total
    best_val_loss: float = math.inf
    best_epoch: int = -1
    bad_evals: int = 0  # evaluations since the last improvement (early stopping patience is counted in these)
    stopped_early: bool = False
    history: list[dict[str, float]] = field(default_factory=list)


@dataclass
class Split:
    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """Sample order for one epoch: a function of (seed, epoch) only, never of batch size or accumulation."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)


class Trainer:
    def __init__(
        self,
        model: nn.Module,
        params: TrainParams,
        *,
        seed: int,
        device: torch.device,
        precision: Precision,
        loss_fn: LossFn,
        checkpoint_dir: Path,
        fingerprint: str,
        logger: Logger | None = None,
    ) -> None:
        self.model = model.to(device)
        self.p = params
        self.seed = seed
        self.device = device
        self.precision = precision
        self.loss_fn = loss_fn
        self.checkpoint_dir = checkpoint_dir
        self.fingerprint = fingerprint
        self.logger = logger or NullLogger()
        decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]  # biases and norm weights
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": params.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=params.lr,
            foreach=device.type == "cuda",
        )
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision.uses_scaler)
        self.state = TrainState()
        self.total_updates = 0
        self.consecutive_nonfinite = 0

    # --- the training step --------------------------------------------------------------------------------------

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One optimizer update over one window (x, y); returns the window's summed loss, still on the device."""
        count = len(y)  # samples in this window: the last window of an epoch may be smaller
        self.optimizer.zero_grad(set_to_none=True)
        window_loss = torch.zeros((), device=self.device)
        for xb, yb in zip(x.split(self.p.batch_size), y.split(self.p.batch_size)):
            with self.precision.autocast():
                out = self.model(xb)
            loss_sum = self.loss_fn(out.float(), yb).sum()
            # Divide once by the window's sample count: every sample weighs 1/count, whatever the micro-batching.
            self.scaler.scale(loss_sum / count).backward()
            window_loss += loss_sum.detach()
        self.scaler.unscale_(self.optimizer)  # clip true gradients, not scaled ones
        max_norm = self.p.max_grad_norm if self.p.max_grad_norm is not None else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        # One host sync per update: deciding to skip must happen on the host, because the schedule lives there.
        finite = bool(torch.isfinite(grad_norm) & torch.isfinite(window_loss))
        if finite:
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr_at(self.state.updates)
            self.scaler.step(self.optimizer)
            self.state.updates += 1  # the schedule advances only on applied updates
            self.consecutive_nonfinite = 0
        else:
            self.state.skipped += 1
            self.consecutive_nonfinite += 1
            if self.consecutive_nonfinite >= self.p.max_nonfinite:
                raise NonFiniteError(
                    f"train: {self.consecutive_nonfinite} consecutive updates had a non-finite loss or gradient "
                    f"(epoch {self.state.epoch}); lower train.lr, set train.max_grad_norm, or use fp32. "
                    f"The last good checkpoint is kept in {self.checkpoint_dir}."
                )
        self.scaler.update()  # with fp16, an overflow lowers the scale for the next update
        return window_loss

    def lr_at(self, update: int) -> float:
        warmup = round(self.p.warmup_fraction * self.total_updates)
        return warmup_cosine(update, self.total_updates, warmup, self.p.lr, self.p.min_lr)

    # --- the loop ---------------------------------------------------------------------------------------------

    def fit(self, train: Split, val: Split) -> TrainState:
        window = self.p.batch_size * self.p.accumulate
        updates_per_epoch = math.ceil(len(train) / window)
        self.total_updates = updates_per_epoch * self.p.epochs
        if self.p.resume == "auto":
            self._maybe_resume()
        train_x, train_y = train.x.to(self.device), train.y.to(self.device)
        from tqdm.auto import tqdm

        bar = tqdm(
            total=self.total_updates,
            initial=self.state.epoch * updates_per_epoch,
            unit="upd",
            desc="train",
            disable=not self.p.progress,
            file=sys.stderr,
            dynamic_ncols=True,
        )
        try:
            while self.state.epoch < self.p.epochs and not self.state.stopped_early:
                self.model.train()
                order = epoch_order(len(train), self.seed, self.state.epoch).to(self.device)
                epoch_loss = torch.zeros((), device=self.device)
                for start in range(0, len(train), window):
                    idx = order[start : start + window]
                    epoch_loss += self.train_step(train_x[idx], train_y[idx])
                    bar.update(1)
                record = {"train_loss": float(epoch_loss) / len(train), **self.evaluate(val)}
                record["lr"] = self.lr_at(self.state.updates)
                self._end_epoch(record)
                bar.set_postfix(
                    epoch=self.state.epoch,
                    val_loss=f"{record['val_loss']:.4f}",
                    val_acc=f"{record['val_accuracy']:.4f}",
                )
        finally:
            bar.close()
        self._load_best()
        return self.state

    @torch.no_grad()
    def evaluate(self, split: Split, batch_size: int = 4096) -> dict[str, float]:
        self.model.eval()
        loss = torch.zeros((), device=self.device)
        correct = torch.zeros((), device=self.device, dtype=torch.long)
        for xb, yb in zip(split.x.split(batch_size), split.y.split(batch_size)):
            xb, yb = xb.to(self.device), yb.to(self.device)
            with self.precision.autocast():
                out = self.model(xb)
            loss += self.loss_fn(out.float(), yb).sum()
            correct += (out.argmax(dim=1) == yb).sum()
        n = len(split)
        return {"val_loss": float(loss) / n, "val_accuracy": float(correct) / n}

    def _end_epoch(self, record: dict[str, float]) -> None:
        s = self.state
        s.epoch += 1
        record["epoch"] = s.epoch
        s.history.append(record)
        improved = record["val_loss"] < s.best_val_loss - self.p.min_delta
        if improved:
            s.best_val_loss, s.best_epoch, s.bad_evals = record["val_loss"], s.epoch, 0
        else:
            s.bad_evals += 1
            s.stopped_early = s.bad_evals >= self.p.patience
        self.logger.log(record, step=s.epoch)
        if improved:
            save_checkpoint(self.checkpoint_dir / "best", {"model": self.model.state_dict()}, {"epoch": s.epoch})
        self._save_last()

    # --- checkpoints ------------------------------------------------------------------------------------------

    def _save_last(self) -> None:
        opt_tensors, opt_meta = flatten_optimizer(self.optimizer.state_dict())
        rng_tensors, rng_meta = capture_rng()
        meta = {
            "fingerprint": self.fingerprint,
            "state": asdict(self.state),
            "optimizer": opt_meta,
            "scaler": self.scaler.state_dict(),
            "rng": rng_meta,
            "params": self.p.model_dump(),
        }
        tensors = {"model": self.model.state_dict(), "optimizer": opt_tensors, "rng": rng_tensors}
        save_checkpoint(self.checkpoint_dir / "last", tensors, meta)

    def _maybe_resume(self) -> None:
        last = self.checkpoint_dir / "last"
        if not (last / "meta.json").is_file():
            return
        ckpt = load_checkpoint(last)
        if ckpt.meta.get("fingerprint") != self.fingerprint:
            # A changed lr or changed data must retrain, not "resume" a finished run and change nothing.
            print(f"train: checkpoint {last} is from other training params or data; starting fresh", file=sys.stderr)
            return
        self.model.load_state_dict(ckpt.tensors["model"])
        self.optimizer.load_state_dict(unflatten_optimizer(ckpt.tensors["optimizer"], ckpt.meta["optimizer"]))
        self.scaler.load_state_dict(ckpt.meta["scaler"])
        restore_rng(ckpt.tensors["rng"], ckpt.meta["rng"])
        self.state = TrainState(**ckpt.meta["state"])
        print(f"train: resumed from {last} after epoch {self.state.epoch}", file=sys.stderr)

    def _load_best(self) -> None:
        best = self.checkpoint_dir / "best"
        if self.state.best_epoch >= 1 and (best / "meta.json").is_file():
            self.model.load_state_dict(load_checkpoint(best).tensors["model"])
