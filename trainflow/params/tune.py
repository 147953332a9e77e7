"""tune: hyperparameter sweeps."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from trainflow.params.base import Section
from trainflow.params.features import FeatureParams
from trainflow.params.model import ModelParams
from trainflow.params.train import Monitor, TrainParams

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
