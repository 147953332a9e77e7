"""The champion gate: which metrics go down, what beating by min_improvement means, and gate_metric's resolution."""

from __future__ import annotations

import pytest

from trainflow.core.errors import ParamsError
from trainflow.params import RegisterParams
from trainflow.registry.registry import beats, gate_metric


@pytest.mark.parametrize(
    ("new", "old", "metric", "min_improvement", "expected"),
    [
        (0.5, None, "rmse", 0.0, True),  # no champion yet: anything beats nothing
        (0.1, None, "accuracy", 0.5, True),
        (0.80, 0.90, "accuracy", 0.0, False),  # higher is better
        (0.91, 0.90, "accuracy", 0.0, True),
        (0.90, 0.90, "accuracy", 0.0, False),  # a tie keeps the champion
        (0.905, 0.90, "accuracy", 0.01, False),  # better, but not by more than min_improvement
        (0.95, 0.90, "accuracy", 0.01, True),
        (2.0, 3.0, "rmse", 0.0, True),  # lower is better
        (3.5, 3.0, "rmse", 0.0, False),
        (3.0, 3.0, "rmse", 0.0, False),
        (2.95, 3.0, "rmse", 0.1, False),
        (0.2, 0.3, "log_loss", 0.0, True),
        (0.4, 0.3, "mae", 0.0, False),
        (0.02, 0.05, "ece", 0.0, True),  # calibration error: lower is better
        (0.05, 0.02, "ece", 0.0, False),
        (0.91, 0.90, "roc_auc", 0.0, True),  # areas: higher is better
        (0.89, 0.90, "pr_auc", 0.0, False),
    ],
)
def test_beats(new: float, old: float | None, metric: str, min_improvement: float, expected: bool) -> None:
    assert beats(new, old, metric, min_improvement) is expected


def test_gate_metric_auto_and_a_metric_the_task_does_not_measure() -> None:
    assert gate_metric(RegisterParams(gate_metric="auto"), {"accuracy": 0.9, "f1_macro": 0.8}) == "accuracy"
    assert gate_metric(RegisterParams(gate_metric="auto"), {"rmse": 1.0, "r2": 0.5}) == "r2"
    assert gate_metric(RegisterParams(gate_metric="f1_macro"), {"accuracy": 0.9, "f1_macro": 0.8}) == "f1_macro"
    with pytest.raises(ParamsError, match="register.gate_metric: rmse is not measured for this task"):
        gate_metric(RegisterParams(gate_metric="rmse"), {"accuracy": 0.9})
