"""register: the registry and the champion gate."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from trainflow.params.base import Section

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
