"""The search space (trainflow.tune.space): each dimension as its Optuna distribution and back as params hold it, the
current params as a point of the space, the grid, and a bad dimension refused naming its path. The sweep code is called
in this process, so that mutation testing sees which function each test reached (tests/stages/test_tune*.py run
`trainflow tune` in subprocesses)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from support.sweeps import CURRENT

from trainflow.core.errors import ParamsError
from trainflow.params import Dimension, load_params
from trainflow.tune import space

optuna.logging.set_verbosity(optuna.logging.WARNING)


def dims(spec: dict[str, dict[str, Any]]) -> dict[str, Dimension]:
    return {path: Dimension.model_validate(d) for path, d in spec.items()}


def test_each_dimension_kind_becomes_its_optuna_distribution_and_values_come_back_as_params_hold_them() -> None:
    d = dims(
        {
            "train.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
            "model.dropout": {"type": "float", "low": 0.0, "high": 0.5, "step": 0.1},
            "train.epochs": {"type": "int", "low": 2, "high": 8, "step": 3},
            "train.accumulate": {"type": "int", "low": 1, "high": 4},
            "model.hidden_sizes": {"type": "categorical", "choices": [[128], [256, 128]]},
            "train.layer_decay": {"type": "categorical", "choices": [None, 0.8]},
        }
    )
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3)).ask()
    values = space.suggest(trial, d)
    assert trial.distributions == {
        "train.lr": FloatDistribution(1e-4, 1e-2, log=True),
        "model.dropout": FloatDistribution(0.0, 0.5, step=0.1),
        "train.epochs": IntDistribution(2, 8, step=3),
        "train.accumulate": IntDistribution(1, 4),
        "model.hidden_sizes": CategoricalDistribution(["[128]", "[256, 128]"]),
        "train.layer_decay": CategoricalDistribution([None, 0.8]),
    }
    assert values == {**trial.params, "model.hidden_sizes": json.loads(trial.params["model.hidden_sizes"])}
    assert isinstance(values["train.epochs"], int) and isinstance(values["model.hidden_sizes"], list)

    # A trial that already has its values (a resumed one; Ray's config) gets them back, decoded.
    fixed: Any = optuna.trial.FixedTrial(
        {
            "train.lr": 0.003,
            "model.dropout": 0.2,
            "train.epochs": 5,
            "train.accumulate": 3,
            "model.hidden_sizes": "[256, 128]",
            "train.layer_decay": None,
        }
    )
    assert space.suggest(fixed, d) == {
        "train.lr": 0.003,
        "model.dropout": 0.2,
        "train.epochs": 5,
        "train.accumulate": 3,
        "model.hidden_sizes": [256, 128],
        "train.layer_decay": None,
    }


def test_every_choice_goes_through_optuna_and_comes_back_with_its_type() -> None:
    choices: list[Any] = [None, True, 1, 1.5, "1", [1], [256, 128], {"a": 1}]
    d = Dimension.model_validate({"type": "categorical", "choices": choices})
    encoded = [space.encode(c) for c in choices]
    assert encoded == [None, True, 1, 1.5, "1", "[1]", "[256, 128]", '{"a": 1}']
    assert encoded[1] is True  # a bool stays a bool (Optuna takes it), not the text "true"
    back = [space.decode(d, e) for e in encoded]
    assert back == choices
    assert [type(b) for b in back] == [type(c) for c in choices]  # True is not 1, "1" is not 1


def test_the_current_params_are_a_point_of_the_space_only_inside_its_bounds_and_steps(params_file: Path) -> None:
    p = load_params(params_file)  # lr 0.002, dropout 0.1, hidden_sizes [256, 128]

    def point(lr: dict[str, Any], dropout: dict[str, Any], sizes: list[Any]) -> dict[str, Any] | None:
        d = dims(
            {
                "train.lr": {"type": "float", **lr},
                "model.dropout": {"type": "float", **dropout},
                "model.hidden_sizes": {"type": "categorical", "choices": sizes},
            }
        )
        return space.current_point(p, d)

    inside = point({"low": 0.001, "high": 0.002}, {"low": 0.0, "high": 0.5, "step": 0.05}, [[128], [256, 128]])
    assert inside == CURRENT  # lr at its high bound (included); dropout 0.1 on the 0.05 grid; the list as JSON text
    assert point({"low": 0.002, "high": 0.01}, {"low": 0.1, "high": 0.5}, [[256, 128]]) == CURRENT  # low included
    assert point({"low": 0.001, "high": 0.0019}, {"low": 0.0, "high": 0.5}, [[256, 128]]) is None  # lr above high
    assert point({"low": 0.0021, "high": 0.01}, {"low": 0.0, "high": 0.5}, [[256, 128]]) is None  # lr below low
    assert point({"low": 0.001, "high": 0.01}, {"low": 0.0, "high": 0.5, "step": 0.03}, [[256, 128]]) is None
    assert point({"low": 0.001, "high": 0.01}, {"low": 0.0, "high": 0.5}, [[128], [512, 256]]) is None

    assert space.value_at(p, "train.lr") == 0.002
    assert space.value_at(p, "model.hidden_sizes") == [256, 128]
    assert space.value_at(p, "model.kwargs.width") is None  # no such key
    assert space.value_at(p, "train.lr.x") is None  # below a value, not a section


def test_the_grid_lists_every_step_of_each_dimension_and_refuses_a_range_without_one() -> None:
    d = dims(
        {
            "train.epochs": {"type": "int", "low": 2, "high": 8, "step": 3},
            "train.accumulate": {"type": "int", "low": 1, "high": 3},
            "model.dropout": {"type": "float", "low": 0.1, "high": 0.3, "step": 0.1},
            "model.hidden_sizes": {"type": "categorical", "choices": [[8], [16, 8]]},
        }
    )
    g = space.grid(d)
    assert g["train.epochs"] == [2, 5, 8] and g["train.accumulate"] == [1, 2, 3]
    assert all(type(v) is int for v in g["train.epochs"] + g["train.accumulate"])
    assert g["model.dropout"] == pytest.approx([0.1, 0.2, 0.3])  # (0.3 - 0.1) / 0.1 is 1.999...: still 3 points
    assert g["model.hidden_sizes"] == ["[8]", "[16, 8]"]
    assert space.grid_size(d) == 3 * 3 * 3 * 2

    with pytest.raises(ParamsError) as err:
        space.grid(
            dims(
                {
                    "train.epochs": {"type": "int", "low": 1, "high": 2},
                    "train.lr": {"type": "float", "low": 0.1, "high": 1},
                }
            )
        )
    assert [path for path, _ in err.value.problems] == ["tune.space.train.lr"]
    assert "needs choices or a step" in err.value.problems[0][1] and "add step" in err.value.problems[0][1]


@pytest.mark.parametrize(
    ("dimension", "path", "why"),
    [
        ("train.lr: {type: float, low: 0.1, high: 0.01}", "tune.space.train.lr", "low (0.1) is above high (0.01)"),
        ("model.dropout: {type: float, low: 0.1}", "tune.space.model.dropout", "takes `low` and `high`"),
        (
            "model.hidden_sizes: {type: categorical, choices: [[8]], low: 1}",
            "tune.space.model.hidden_sizes",
            "takes `choices`",
        ),
        ("model.hidden_sizes: {type: categorical}", "tune.space.model.hidden_sizes", "takes `choices`"),
        ("train.lr: {type: float, low: 0, high: 0.1, log: true}", "tune.space.train.lr", "log: true needs low > 0"),
        ("train.epochs: {type: int, low: 1, high: 2.5}", "tune.space.train.epochs", "whole numbers"),
        ("train.lr: {type: normal, low: 0, high: 1}", "tune.space.train.lr.type", "'float', 'int' or 'categorical'"),
    ],
)
def test_a_bad_dimension_is_refused_naming_its_path(params_file: Path, dimension: str, path: str, why: str) -> None:
    with pytest.raises(ParamsError) as err:
        load_params(params_file, [f"tune.space={{{dimension}}}"])
    assert [p for p, _ in err.value.problems] == [path]
    assert why in err.value.problems[0][1]
