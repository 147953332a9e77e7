"""How every problem of the params reaches ParamsError (trainflow.params): the dotted path and the whole message of
each invalid value, all problems at once, a root or a section that is not a mapping, the tune.space lines, and the
source named when values are set on params already made. Expected messages are written out by hand."""

from __future__ import annotations

from typing import Any

import pytest

from trainflow import params as pm
from trainflow.core.errors import ParamsError
from trainflow.params import PipelineParams, with_values

FIX = "Fix params.yaml or the -S override, then rerun (`trainflow params schema` lists every field)."


@pytest.mark.parametrize(
    ("raw", "path", "message"),
    [
        ({"train": {"min_lr": 1, "lr": 0.1}}, "train", "train.min_lr (1) is above train.lr (0.1); lower min_lr"),
        ({"data": {"target": "y", "features": ["a", "y"]}}, "data",
         "data.features lists the target column 'y'; remove it from the list"),
        ({"data": {"target": "y", "exclude": ["y"]}}, "data",
         "data.exclude lists the target column 'y'; the target is never a feature"),
        ({"data": {"columns": ["a", "b"]}}, "data",
         "data.columns names the columns of header-less files: set data.header: false too"),
        ({"data": {"target": "t", "text_column": "t"}}, "data",
         "data.text_column is the target column; name the text feature"),
        ({"data": {"text_column": "t", "image_column": "t"}}, "data",
         "data.image_column is the target or the text column; name the column of image paths"),
        ({"data": {"source": "builtin:nope"}}, "data",
         "data.source: unknown built-in dataset; choose one of builtin:digits, builtin:iris, builtin:wine, "
         "builtin:breast_cancer, builtin:diabetes, builtin:digits_images"),
        ({"register": {"min_delta": 0.1}}, "register",
         "min_delta was renamed register.min_improvement (it applies to both register.decide rules); rename it in "
         "params.yaml"),
        ({"train": {"max_time": "abc"}}, "train.max_time",
         "'abc' is not a duration; write seconds (3600) or e.g. 20s, 45m, 2h, 1h30m, 1d (got 'abc')"),
        ({"train": {"max_time": 0}}, "train.max_time", "must be a positive duration, got 0 (got 0)"),
        ({"train": {"preempt_signals": ["SIGFOO", "SIGBAR"]}}, "train.preempt_signals",
         "unknown signal(s) SIGFOO, SIGBAR; use names such as SIGTERM, SIGINT, SIGUSR1 (got ['SIGFOO', 'SIGBAR'])"),
        ({"train": {"preempt_signals": ["SIGKILL", "SIGSTOP"]}}, "train.preempt_signals",
         "SIGKILL, SIGSTOP cannot be caught; a process killed so resumes from its last periodic checkpoint "
         "(got ['SIGKILL', 'SIGSTOP'])"),
        ({"train": {"world_size": 0}}, "train.world_size", "must be at least 1 (or auto) (got 0)"),
        ({"train": {"batch_size": 0}}, "train.batch_size", "must be at least 1 (or auto) (got 0)"),
        ({"trian": {}}, "trian",
         "unknown parameter (check the spelling; `trainflow params schema` lists the valid ones)"),
        ({"train": {"batch_size": "auto"}}, "train",
         "train.batch_size auto needs train.global_batch (the samples per optimizer update to keep, e.g. "
         "global_batch: 64); set it, or set batch_size to a number"),
        ({"train": {"batch_size": "auto", "global_batch": 64, "accumulate": 2}}, "train",
         "train.accumulate (2): batch_size auto chooses it (global_batch / world_size / batch_size); leave accumulate "
         "at 1, or set batch_size to a number"),
        ({"train": {"global_batch": 64, "batch_size": 16, "accumulate": 2, "world_size": 1}}, "train",
         "train.global_batch (64) is not train.batch_size * train.accumulate * world size (16 * 2 * 1 = 32); make "
         "them agree, set global_batch: null, or set batch_size: auto to have batch_size and accumulate chosen for "
         "it"),
        ({"tune": {"space": {"data.x": {"type": "float", "low": 0, "high": 1}}}}, "tune.space.data.x",
         "a sweep varies features, model, train params (data and split stay fixed for a study); write section.field, "
         "e.g. train.lr"),
        ({"tune": {"space": {"train.device": {"type": "categorical", "choices": ["cpu"]}}}}, "tune.space.train.device",
         "not a hyperparameter (a trial runs in one process)"),
        ({"tune": {"space": {"train.nope": {"type": "categorical", "choices": [1]}}}}, "tune.space.train.nope",
         "train has no field 'nope' (`trainflow params schema` lists them)"),
        ({"tune": {"space": {"train.lr.x": {"type": "categorical", "choices": [1]}}}}, "tune.space.train.lr.x",
         "train.lr has no sub-fields"),
        ({"tune": {"space": {"train.lr": {"type": "float", "low": 2, "high": 1}}}}, "tune.space.train.lr",
         "low (2) is above high (1)"),
        ({"tune": {"space": {"train.lr": {"type": "float", "choices": [1]}}}}, "tune.space.train.lr",
         "a float dimension takes `low` and `high`, not choices"),
        ({"tune": {"space": {"train.lr": {"type": "categorical", "low": 1}}}}, "tune.space.train.lr",
         "a categorical dimension takes `choices` (a list), not low/high"),
        ({"tune": {"space": {"train.lr": {"type": "float", "low": 0, "high": 1, "log": True}}}}, "tune.space.train.lr",
         "log: true needs low > 0 and no step"),
        ({"tune": {"space": {"train.epochs": {"type": "int", "low": 1, "high": 2.5}}}}, "tune.space.train.epochs",
         "an int dimension takes whole numbers for low, high and step"),
        ({"tune": {"space": {"train.epochs": {"type": "int", "low": 0, "high": 3}}}}, "tune.space.train.epochs",
         "0 is not a valid value (must be at least 1 (or auto) (got 0))"),
        ({"deploy": {"name": "-x"}}, "deploy.name",
         "must be letters, digits, '.', '_' or '-', starting with a letter or digit (got '-x')"),
        ({"deploy": {"timezone": "Mars/Base"}}, "deploy.timezone",
         "unknown time zone; use an IANA name such as UTC, Europe/Paris, America/New_York (got 'Mars/Base')"),
    ],
)  # fmt: skip
def test_an_invalid_value_is_reported_with_its_path_and_the_whole_message(
    raw: dict[str, Any], path: str, message: str
) -> None:
    from trainflow.params import validate

    with pytest.raises(ParamsError) as bad:
        validate(raw, "p.yaml")
    assert bad.value.problems == [(path, message)]
    assert str(bad.value) == f"p.yaml: 1 invalid parameter:\n  {path}: {message}\n{FIX}"


def test_every_problem_is_reported_at_once_counted_in_the_plural() -> None:
    from trainflow.params import validate

    with pytest.raises(ParamsError) as bad:
        validate({"seed": -1, "train": {"lr": "fast"}, "x": 1}, "src")
    assert str(bad.value).splitlines() == [
        "src: 3 invalid parameters:",
        "  seed: Input should be greater than or equal to 0 (got -1)",
        "  train.lr: Input should be a valid number, unable to parse string as a number (got 'fast')",
        "  x: unknown parameter (check the spelling; `trainflow params schema` lists the valid ones)",
        FIX,
    ]


def test_problems_of_a_root_that_is_not_a_mapping_and_of_mappings() -> None:
    with pytest.raises(ParamsError) as bad:
        pm.validate(["a"], "src")  # type: ignore[arg-type]
    assert bad.value.problems == [
        ("<root>", "Input should be a valid dictionary or instance of PipelineParams (got ['a'])")
    ]
    with pytest.raises(ParamsError) as bad:
        pm.validate({"register": {"min_delta": 1}}, "src")  # the input is a mapping: not repeated
    assert bad.value.problems == [
        ("register", "min_delta was renamed register.min_improvement (it applies to both register.decide rules); "
                     "rename it in params.yaml")
    ]  # fmt: skip
    with pytest.raises(ParamsError) as bad:
        pm.validate({"train": 3}, "src")
    assert bad.value.problems == [("train", "Input should be a valid dictionary or instance of TrainParams (got 3)")]


def test_located_problems_are_tune_space_lines_only() -> None:
    assert pm.LOCATED.match("tune.space.a: x\ntune.space.b: y: z")
    assert pm.LOCATED.match("tune.space.a: x\n")
    assert not pm.LOCATED.match("tune.space.a: x\nother: y")
    assert not pm.LOCATED.match("model.x: y")


def test_with_values_sets_dotted_paths_and_names_the_source_of_a_problem() -> None:
    base = PipelineParams.model_validate({"model": {"kwargs": {"a": 1}}})
    got = with_values(base, {"train.lr": 0.5, "model.kwargs.depth": 3, "seed": 7}, "trial 3")
    assert (got.train.lr, got.model.kwargs, got.seed) == (0.5, {"a": 1, "depth": 3}, 7)
    assert base.train.lr == 2e-3 and base.model.kwargs == {"a": 1}
    with pytest.raises(ParamsError) as bad:
        with_values(base, {"train.lr": -1}, "trial 3")
    assert bad.value.source == "trial 3"
    assert bad.value.problems == [("train.lr", "Input should be greater than 0 (got -1)")]
