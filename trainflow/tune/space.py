"""The search space: tune.space as Optuna distributions, the values a trial takes, the current params as a point.

Optuna's categorical choices are scalars; a choice such as `[256, 128]` (model.hidden_sizes) goes through Optuna as
its JSON text and comes back as the list.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from trainflow.core.errors import ParamsError
from trainflow.params import Dimension, PipelineParams

if TYPE_CHECKING:
    import optuna

SCALAR = (type(None), bool, int, float, str)


def encode(choice: Any) -> Any:
    return choice if isinstance(choice, SCALAR) else json.dumps(choice)


def decode(dim: Dimension, value: Any) -> Any:
    assert dim.choices is not None
    return {json.dumps(encode(c)): c for c in dim.choices}[json.dumps(value)]


def suggest(trial: optuna.Trial, space: dict[str, Dimension]) -> dict[str, Any]:
    """The trial's value of each dimension (sampled now, or the values it already has when it is resumed)."""
    values: dict[str, Any] = {}
    for path, d in space.items():
        if d.type == "categorical":
            assert d.choices is not None
            values[path] = decode(d, trial.suggest_categorical(path, [encode(c) for c in d.choices]))
        elif d.type == "int":
            assert d.low is not None and d.high is not None
            values[path] = trial.suggest_int(path, int(d.low), int(d.high), step=int(d.step or 1), log=d.log)
        else:
            assert d.low is not None and d.high is not None
            values[path] = trial.suggest_float(path, d.low, d.high, step=d.step, log=d.log)
    return values


def value_at(params: PipelineParams, path: str) -> Any:
    node: Any = params.model_dump(mode="json")
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def current_point(params: PipelineParams, space: dict[str, Dimension]) -> dict[str, Any] | None:
    """The current params as a point of the space (Optuna's encoding), or None when one lies outside it."""
    point: dict[str, Any] = {}
    for path, d in space.items():
        value = value_at(params, path)
        if d.type == "categorical":
            assert d.choices is not None
            if value not in d.choices:
                return None
            point[path] = encode(value)
        else:
            assert d.low is not None and d.high is not None
            if not isinstance(value, int | float) or not d.low <= value <= d.high:
                return None
            if d.step is not None and not math.isclose((value - d.low) / d.step, round((value - d.low) / d.step)):
                return None
            point[path] = value
    return point


def grid(space: dict[str, Dimension]) -> dict[str, list[Any]]:
    """Every value of each dimension, for the grid sampler: choices, or the steps of a stepped range."""
    out: dict[str, list[Any]] = {}
    for path, d in space.items():
        if d.type == "categorical":
            assert d.choices is not None
            out[path] = [encode(c) for c in d.choices]
        elif d.type == "int" or d.step is not None:
            assert d.low is not None and d.high is not None
            step = d.step or 1
            n = int(math.floor((d.high - d.low) / step + 1e-9)) + 1
            values = [d.low + i * step for i in range(n)]
            out[path] = [int(v) for v in values] if d.type == "int" else values
        else:
            raise ParamsError(
                "params.yaml",
                [(f"tune.space.{path}", "the grid sampler needs choices or a step for every dimension; add step")],
            )
    return out


def grid_size(space: dict[str, Dimension]) -> int:
    return math.prod(len(v) for v in grid(space).values())
