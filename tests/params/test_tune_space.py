"""tune.space in params.yaml (trainflow.params): which paths a sweep may vary, the values a sampler may draw checked
beside the other params, every bad value reported with its own path and its whole message, and the default space.
Expected messages are written out by hand."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from trainflow import params as pm
from trainflow.core.errors import ParamsError
from trainflow.params import Dimension, PipelineParams, _problems


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("train.lr", None),
        ("model.kwargs.depth", None),
        ("model.hidden_sizes", None),
        ("features.max_categories", None),
        ("features.nope", "tune.space.features.nope: features has no field 'nope' (`trainflow params schema` lists "
                          "them)"),
        ("model.nope", "tune.space.model.nope: model has no field 'nope' (`trainflow params schema` lists them)"),
        ("train.max_categories", "tune.space.train.max_categories: train has no field 'max_categories' "
                                 "(`trainflow params schema` lists them)"),
        ("model.hidden_sizes.0", "tune.space.model.hidden_sizes.0: model.hidden_sizes has no sub-fields"),
        ("train", "tune.space.train: a sweep varies features, model, train params (data and split stay fixed for a "
                  "study); write section.field, e.g. train.lr"),
        ("split.val_fraction", "tune.space.split.val_fraction: a sweep varies features, model, train params (data "
                               "and split stay fixed for a study); write section.field, e.g. train.lr"),
        ("train.progress", "tune.space.train.progress: not a hyperparameter (a trial runs in one process)"),
        ("train.resume", "tune.space.train.resume: not a hyperparameter (a trial runs in one process)"),
    ],
)  # fmt: skip
def test_check_path(path: str, why: str | None) -> None:
    assert pm.tune._check_path(path) == why


def test_values_to_check_bound_what_a_sampler_draws() -> None:
    dim = Dimension.model_validate
    assert dim({"type": "categorical", "choices": [[1], 2, "x"]}).values_to_check() == [[1], 2, "x"]
    ints = dim({"type": "int", "low": 2, "high": 9.0}).values_to_check()
    assert ints == [2, 9] and all(type(x) is int for x in ints)
    floats = dim({"type": "float", "low": 0.5, "high": 2}).values_to_check()
    assert floats == [0.5, 2.0] and all(type(x) is float for x in floats)


def test_every_bad_value_of_the_space_is_reported_with_its_own_path() -> None:
    space = {
        "train.epochs": {"type": "int", "low": 0, "high": 3},
        "model.dropout": {"type": "float", "low": 0.1, "high": 1.0},
        "model.name": {"type": "categorical", "choices": ["mlp", "bad name"]},
    }
    with pytest.raises(ParamsError) as bad:
        pm.validate({"tune": {"space": space}}, "p.yaml")
    assert bad.value.problems == [
        ("tune.space.train.epochs", "0 is not a valid value (must be at least 1 (or auto) (got 0))"),
        ("tune.space.model.dropout", "1.0 is not a valid value (Input should be less than 1 (got 1.0))"),
        ("tune.space.model.name", "'bad name' is not a valid value (model.name must be auto, mlp, text_transformer, "
                                  "text_bag, cnn, hf:<directory> or an import path package.module:Class, got "
                                  "'bad name')"),
    ]  # fmt: skip
    with pytest.raises(ParamsError) as bad:
        space = {"data.x": {"type": "float", "low": 0, "high": 1},
                 "train.device": {"type": "categorical", "choices": ["cpu"]}}  # fmt: skip
        pm.validate({"tune": {"space": space}}, "p.yaml")
    assert bad.value.problems == [
        ("tune.space.data.x", "a sweep varies features, model, train params (data and split stay fixed for a study); "
                              "write section.field, e.g. train.lr"),
        ("tune.space.train.device", "not a hyperparameter (a trial runs in one process)"),
    ]  # fmt: skip


def test_a_space_value_is_checked_beside_the_other_params() -> None:
    """model.n_heads 3 is valid alone, but must divide the current d_model (128)."""
    raw: dict[str, Any] = {"tune": {"space": {"model.n_heads": {"type": "categorical", "choices": [4, 3]}}}}
    with pytest.raises(ParamsError) as bad:
        pm.validate(raw, "p.yaml")
    assert bad.value.problems == [
        ("tune.space.model.n_heads", "3 is not a valid value (model.n_heads (3) must divide model.d_model (128))")
    ]
    raw["model"] = {"d_model": 96}
    assert pm.validate(raw, "p.yaml").model.d_model == 96
    kwargs = {"tune": {"space": {"model.kwargs.depth": {"type": "int", "low": 1, "high": 3}}}}
    assert pm.validate(kwargs, "p.yaml").tune.space["model.kwargs.depth"].values_to_check() == [1, 3]


def test_a_tune_space_problem_keeps_the_whole_of_its_message_after_the_path() -> None:
    """A sampled model.name "hf:" is refused with a message that itself holds ": " ("hf: needs ..."): the problem is
    split from its path at the first ": " only, so the message arrives whole."""
    with pytest.raises(ValidationError) as exc:
        PipelineParams.model_validate({"tune": {"space": {"model.name": {"type": "categorical", "choices": ["hf:"]}}}})
    assert _problems(exc.value) == [
        (
            "tune.space.model.name",
            "'hf:' is not a valid value (model.name hf: needs the model's directory or hub id after it, e.g. "
            "hf:models/tiny-bert)",
        )
    ]


def test_the_default_search_space_is_lr_dropout_and_hidden_sizes() -> None:
    from trainflow.params import default_space

    assert {k: v.model_dump() for k, v in default_space().items()} == {
        "train.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True, "step": None, "choices": None},
        "model.dropout": {"type": "float", "low": 0.0, "high": 0.5, "log": False, "step": None, "choices": None},
        "model.hidden_sizes": {
            "type": "categorical", "low": None, "high": None, "log": False, "step": None,
            "choices": [[128], [256, 128], [512, 256]],
        },
    }  # fmt: skip
