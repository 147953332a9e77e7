"""The champion gate: which metrics go down, what beating by min_improvement means, and gate_metric's resolution."""

from __future__ import annotations

import pytest

from trainflow.core.errors import ParamsError
from trainflow.params import RegisterParams
from trainflow.registry import registry
from trainflow.registry.registry import beats, gate_metric

FIX = "Fix params.yaml or the -S override, then rerun (`trainflow params schema` lists every field)."


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


def test_beats_is_strict_by_more_than_the_margin_in_the_metric_s_direction() -> None:
    assert registry.beats(0.5, None, "accuracy", 0.0)
    assert registry.beats(0.81, 0.8, "accuracy", 0.0)
    assert not registry.beats(0.8, 0.8, "accuracy", 0.0)
    assert not registry.beats(0.85, 0.8, "accuracy", 0.05)  # 0.85 is not more than 0.8 + 0.05
    assert registry.beats(0.86, 0.8, "accuracy", 0.05)
    for lower in ("log_loss", "ece", "rmse", "mae"):
        assert registry.beats(0.7, 0.8, lower, 0.05)
        assert not registry.beats(0.75, 0.8, lower, 0.05)
        assert not registry.beats(0.9, 0.8, lower, 0.0)
    assert registry.beats(0.9, 0.8, "r2", 0.0)


def test_the_gate_metric_auto_is_accuracy_or_r2_and_an_unmeasured_one_is_refused() -> None:
    assert registry.gate_metric(RegisterParams(), {"accuracy": 1.0, "r2": 0.1}) == "accuracy"
    assert registry.gate_metric(RegisterParams(), {"r2": 0.1, "rmse": 2.0}) == "r2"
    assert registry.gate_metric(RegisterParams(gate_metric="rmse"), {"r2": 0.1, "rmse": 2.0}) == "rmse"
    with pytest.raises(ParamsError) as bad:
        registry.gate_metric(RegisterParams(gate_metric="f1_macro"), {"r2": 0.1, "rmse": 2.0})
    assert str(bad.value) == (
        "params.yaml: 1 invalid parameter:\n"
        "  register.gate_metric: f1_macro is not measured for this task; the metrics are ['r2', 'rmse']\n" + FIX
    )
