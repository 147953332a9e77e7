"""Exact behaviour of trainflow.params' functions: data.source outside data/raw/ and the commands that copy it in, the
registered model's default name, tune.space paths and values, overrides written into params.yaml (the file's text,
whole), keys given twice, and how every problem reaches ParamsError. Expected values are written out by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainflow import params as pm
from trainflow.core.errors import ParamsError
from trainflow.params import (
    Dimension,
    PipelineParams,
    TrainParams,
    default_model_name,
    duplicate_keys,
    load_params,
    source_outside,
    with_values,
    write_overrides,
)

TAIL = "for the ingest stage, so rows added to it later would leave `dvc status` clean and the model stale."


# --- data.source outside data/raw/ -----------------------------------------------------------------------------------


def test_sources_inside_data_raw_or_builtin_are_fine(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    (root / "data/raw").mkdir(parents=True)
    assert source_outside("builtin:iris", root) is None
    assert source_outside("builtin:../../x", root) is None
    assert source_outside("data/raw/x.csv", root) is None
    assert source_outside("data/raw/sub/*.csv", root) is None
    assert source_outside("data/other/../raw/x.csv", root) is None
    assert source_outside(str(root / "data/raw/x.csv"), root) is None
    assert source_outside("data/raw", root) is None


def test_a_source_in_the_project_but_not_in_data_raw(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    (root / "data").mkdir(parents=True)
    (root / "data/t.csv").write_text("a\n1\n")
    assert source_outside("data/t.csv", root) == (
        f"data/t.csv is outside data/raw/ ({root}/data/raw): DVC watches only data/raw/ {TAIL} Copy it into "
        f"data/raw/ and track it: `cp {root}/data/t.csv data/raw/ && dvc add data/raw/t.csv`, then rerun with "
        "`-S data.source=data/raw/t.csv`"
    )
    assert source_outside("data/raw/../t.csv", root) == (
        f"data/raw/../t.csv is outside data/raw/ ({root}/data/raw): DVC watches only data/raw/ {TAIL} Copy it into "
        f"data/raw/ and track it: `cp {root}/data/t.csv data/raw/ && dvc add data/raw/t.csv`, then rerun with "
        "`-S data.source=data/raw/t.csv`"
    )


def test_a_source_outside_the_project(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    outside = tmp_path / "my data"
    outside.mkdir()
    assert source_outside(str(outside), root) == (
        f"{outside} is outside the project ({root}): DVC watches only data/raw/ {TAIL} Copy it into data/raw/ and "
        f"track it: `cp -r '{outside}' data/raw/ && dvc add 'data/raw/my data'`, then rerun with "
        "`-S 'data.source=data/raw/my data'`"
    )
    assert source_outside("../x.csv", root) == (
        f"../x.csv is outside the project ({root}): DVC watches only data/raw/ {TAIL} Copy it into data/raw/ and "
        f"track it: `cp {tmp_path}/x.csv data/raw/ && dvc add data/raw/x.csv`, then rerun with "
        "`-S data.source=data/raw/x.csv`"
    )


def test_a_source_under_home_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    root = tmp_path / "proj"
    (root / "data/raw").mkdir(parents=True)
    assert source_outside("~/x.csv", root) == (
        f"~/x.csv is outside the project ({root}): DVC watches only data/raw/ {TAIL} Copy it into data/raw/ and "
        f"track it: `cp {tmp_path}/home/x.csv data/raw/ && dvc add data/raw/x.csv`, then rerun with "
        "`-S data.source=data/raw/x.csv`"
    )


def test_symlinks_inside_as_written_or_resolved(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "data/raw").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(real)
    # the project reached through a symlink, the source named by the real path: inside once resolved
    assert source_outside(str(real / "data/raw/x.csv"), link) is None
    assert source_outside(str(link / "data/raw/x.csv"), real) is None
    # data/raw/x.csv linking elsewhere: inside as written
    elsewhere = tmp_path / "elsewhere.csv"
    elsewhere.write_text("a\n")
    (real / "data/raw/x.csv").symlink_to(elsewhere)
    assert source_outside("data/raw/x.csv", real) is None
    # a link in the project (outside data/raw/) to a file outside it: outside the project
    (real / "data/l.csv").symlink_to(elsewhere)
    assert source_outside("data/l.csv", real) == (
        f"data/l.csv is outside the project ({real}): DVC watches only data/raw/ {TAIL} Copy it into data/raw/ and "
        f"track it: `cp {real}/data/l.csv data/raw/ && dvc add data/raw/l.csv`, then rerun with "
        "`-S data.source=data/raw/l.csv`"
    )


def test_copy_in_commands_for_files_folders_and_globs(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    (folder / "sub").mkdir(parents=True)
    assert pm.data._copy_in(folder / "sub" / "f.csv") == (
        f"`cp {folder}/sub/f.csv data/raw/ && dvc add data/raw/f.csv`, then rerun with `-S data.source=data/raw/f.csv`"
    )
    assert pm.data._copy_in(folder / "sub") == (
        f"`cp -r {folder}/sub data/raw/ && dvc add data/raw/sub`, then rerun with `-S data.source=data/raw/sub`"
    )
    assert pm.data._copy_in(folder / "sub" / "*.csv") == (
        f"`mkdir -p data/raw/sub && cp {folder}/sub/*.csv data/raw/sub/ && dvc add data/raw/sub`, then rerun with "
        "`-S 'data.source=data/raw/sub/*.csv'`"
    )
    assert pm.data._copy_in(folder / "p?rt[0-9]" / "*" / "x.csv") == (
        f"`cp -r {folder} data/raw/d && dvc add data/raw/d`, then rerun with "
        "`-S 'data.source=data/raw/d/p?rt[0-9]/*/x.csv'`"
    )
    assert pm.data._copy_in(Path("/*.csv")) == (
        "`mkdir -p data/raw/data && cp //*.csv data/raw/data/ && dvc add data/raw/data`, then rerun with "
        "`-S 'data.source=data/raw/data/*.csv'`"
    )
    spaced = tmp_path / "my files"
    assert pm.data._copy_in(spaced / "*.csv") == (
        f"`mkdir -p 'data/raw/my files' && cp '{spaced}'/*.csv 'data/raw/my files/' && dvc add 'data/raw/my files'`, "
        "then rerun with `-S 'data.source=data/raw/my files/*.csv'`"
    )


def test_load_params_reports_an_outside_source_after_the_other_problems(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    (tmp_path / "data").mkdir()
    path.write_text("seed: -1\ndata:\n  source: data/t.csv\n")
    why = (
        f"data/t.csv is outside data/raw/ ({tmp_path}/data/raw): DVC watches only data/raw/ {TAIL} Copy it into "
        f"data/raw/ and track it: `cp {tmp_path}/data/t.csv data/raw/ && dvc add data/raw/t.csv`, then rerun with "
        "`-S data.source=data/raw/t.csv`"
    )
    with pytest.raises(ParamsError) as bad:
        load_params(path)
    assert bad.value.source == str(path)
    assert bad.value.problems == [("seed", "Input should be greater than or equal to 0 (got -1)"), ("data.source", why)]
    with pytest.raises(ParamsError) as bad:
        load_params(path, ["seed=1"])
    assert bad.value.source == f"{path} with -S overrides" and bad.value.problems == [("data.source", why)]
    # the override that names a file under data/raw/ fixes it; a relative params path is resolved for the check
    assert load_params(path, ["seed=1", "data.source=data/raw/t.csv"]).data.source == "data/raw/t.csv"
    # data that is not a mapping, or a source that is not text: validation's problem alone
    path.write_text("data: 3\n")
    with pytest.raises(ParamsError) as bad:
        load_params(path)
    assert [p for p, _ in bad.value.problems] == ["data"]
    path.write_text("data:\n  source: [1]\n")
    with pytest.raises(ParamsError) as bad:
        load_params(path)
    assert bad.value.problems == [("data.source", "Input should be a valid string (got [1])")]


def test_load_params_checks_the_source_against_the_params_files_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "data/raw").mkdir(parents=True)
    (tmp_path / "params.yaml").write_text("data:\n  source: data/raw/t.csv\n")
    monkeypatch.chdir(tmp_path)
    assert load_params(Path("params.yaml")).data.source == "data/raw/t.csv"
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load_params(Path("../params.yaml")).data.source == "data/raw/t.csv"


# --- the registered model's default name -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "target", "task", "name"),
    [
        ("builtin:iris", "target", None, "trainflow-iris"),
        ("builtin:diabetes", "target", "regression", "trainflow-diabetes-regression"),
        ("data/raw/titanic.csv", "Survived", None, "titanic-Survived"),
        ("data/raw/titanic.csv", "Survived", "classification", "titanic-Survived-classification"),
        ("data/raw/parts/*.csv", "y", None, "parts-y"),
        ("data/raw/p?rts/*/x.csv", "y", None, "raw-y"),
        ("data/raw/parts/", "y", None, "parts-y"),
        ("data/raw/my file.csv", "price ($)", None, "my-file-price"),
        ("*.csv", "y", None, "data-y"),
        (".hidden.csv", "y.", None, "hidden-y"),
        ("/abs/dir/t.tar.gz", "a_b", None, "t.tar-a_b"),
    ],
)
def test_default_model_name(source: str, target: str, task: str | None, name: str) -> None:
    assert default_model_name(source, target, task) == name


def test_register_model_name_auto_is_the_data_s_name() -> None:
    p = PipelineParams.model_validate({"data": {"source": "data/raw/h.csv", "target": "p", "task": "regression"}})
    assert p.register.model_name == "h-p-regression"
    p = PipelineParams.model_validate({"data": {"source": "data/raw/h.csv", "target": "p"}})
    assert p.register.model_name == "h-p"
    p = PipelineParams.model_validate({"register": {"model_name": "mine"}})
    assert p.register.model_name == "mine"


# --- tune.space ------------------------------------------------------------------------------------------------------


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


# --- problems as ParamsError -----------------------------------------------------------------------------------------


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


# --- batch sizes and world size --------------------------------------------------------------------------------------


def test_known_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert pm.train._known_world_size(3) == 3
    assert pm.train._known_world_size("auto") is None
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert pm.train._known_world_size(3) == 3
    monkeypatch.setenv("RANK", "0")
    assert pm.train._known_world_size(3) is None
    monkeypatch.delenv("WORLD_SIZE")
    assert pm.train._known_world_size(3) == 3


def test_global_batch_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    train = TrainParams.model_validate({"batch_size": 8, "accumulate": 2, "global_batch": 64, "world_size": 4})
    assert pm.global_batch_problem(train, 4) is None
    assert pm.global_batch_problem(train, 2) == (
        "train.global_batch (64) is not train.batch_size * train.accumulate * world size (8 * 2 * 2 = 32); make them "
        "agree, set global_batch: null, or set batch_size: auto to have batch_size and accumulate chosen for it"
    )
    assert pm.global_batch_problem(TrainParams.model_validate({"batch_size": 8}), 3) is None
    auto = TrainParams.model_validate({"batch_size": "auto", "global_batch": 64})
    assert pm.global_batch_problem(auto, 3) is None
    # under torchrun the params alone do not know the world size: no check until the train stage
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert TrainParams.model_validate({"batch_size": 8, "global_batch": 64}).global_batch == 64


# --- cron ------------------------------------------------------------------------------------------------------------


def test_check_cron() -> None:
    assert pm.check_cron(pm.DEFAULT_CRON) == "0 3 * * *"
    assert pm.check_cron("0 4 * * 1") == "0 4 * * 1"
    with pytest.raises(ValueError) as bad:
        pm.check_cron("every day")
    assert str(bad.value) == (
        "not a cron expression Prefect accepts: five fields minute hour day-of-month month day-of-week, e.g. "
        "'0 3 * * *' (daily at 03:00) or '0 3 * * 1' (Mondays at 03:00); H and R are not supported"
    )


# --- durations -------------------------------------------------------------------------------------------------------


def test_durations_with_spaces_and_parts() -> None:
    assert pm.duration_seconds(" 1h 30m ") == 5400.0
    assert pm.duration_seconds("2d") == 172800.0
    assert pm.duration_seconds("1.5m") == 90.0
    with pytest.raises(ValueError) as bad:  # a number as text has no unit
        pm.duration_seconds("10")
    assert str(bad.value) == "'10' is not a duration; write seconds (3600) or e.g. 20s, 45m, 2h, 1h30m, 1d"
    assert TrainParams.model_validate({"max_time": "1h"}).max_time == 3600.0
    assert TrainParams.model_validate({"max_time": None}).max_time is None


# --- keys given twice ------------------------------------------------------------------------------------------------


def test_duplicate_keys_at_every_depth() -> None:
    text = "a: 1\nb:\n  c: 1\n  c: 2\n  d:\n    - {e: 1}\n    - {e: 1, e: 2}\na: 3\n"
    assert duplicate_keys(text) == [
        ("b.c", "given twice (lines 3 and 4); keep one of them"),
        ("b.d[1].e", "given twice (lines 7 and 7); keep one of them"),
        ("a", "given twice (lines 1 and 8); keep one of them"),
    ]
    assert duplicate_keys("a: 1\na: 2\na: 3\n") == [
        ("a", "given twice (lines 1 and 2); keep one of them"),
        ("a", "given twice (lines 1 and 3); keep one of them"),
    ]
    assert duplicate_keys("") == [] and duplicate_keys("a: [1, 2]\nb: {c: 1}\n") == []
    assert duplicate_keys("- {x: 1, x: 2}\n") == [("[0].x", "given twice (lines 1 and 1); keep one of them")]


# --- overrides written into params.yaml ------------------------------------------------------------------------------


def test_write_overrides_keeps_comments_and_writes_flow_style(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text(
        "seed: 1  # the seed\ndata:\n  target: y\n  exclude: []  # leaks\n  delimiter: null\ntrain:\nmodel:\n"
    )
    space = "tune.space={train.lr: {type: float, low: 0.0001, high: 0.01, log: true}}"
    write_overrides(path, ["data.exclude=[a, b]", "seed=2", "model.kwargs={depth: 3, widths: [4, 5]}", "train.lr=0.001",
                           space])  # fmt: skip
    assert path.read_text() == (
        "seed: 2  # the seed\n"
        "data:\n"
        "  target: y\n"
        "  exclude: [a, b] # leaks\n"
        "  delimiter: null\n"
        "train:\n"
        "  lr: 0.001\n"
        "model:\n"
        "  kwargs: {depth: 3, widths: [4, 5]}\n"
        "tune:\n"
        "  space: {train.lr: {type: float, low: 0.0001, high: 0.01, log: true}}\n"
    )
    assert load_params(path).tune.space["train.lr"].log is True


def test_write_overrides_does_nothing_without_overrides_and_validates_first(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    write_overrides(path, [])  # not even read
    assert not path.exists()
    path.write_text("seed: 1\n")
    with pytest.raises(ParamsError) as bad:
        write_overrides(path, ["seed=-2"])
    assert bad.value.problems == [("seed", "Input should be greater than or equal to 0 (got -2)")]
    assert path.read_text() == "seed: 1\n"
    long = "x" * 300
    write_overrides(path, [f"tracking.experiment={long}", "data.exclude=[" + ", ".join(["c" * 50] * 5) + "]"])
    assert path.read_text() == (
        f"seed: 1\ntracking:\n  experiment: {long}\ndata:\n  exclude: [{', '.join(['c' * 50] * 5)}]\n"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["params.yaml"]


def test_flow_makes_nested_lists_and_mappings_flow_style() -> None:
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    got = pm.pipeline._flow({"a": [1, {"b": 2}], "c": "x"})
    assert isinstance(got, CommentedMap) and got.fa.flow_style() is True
    assert isinstance(got["a"], CommentedSeq) and got["a"].fa.flow_style() is True
    assert isinstance(got["a"][1], CommentedMap) and got["a"][1].fa.flow_style() is True
    assert got == {"a": [1, {"b": 2}], "c": "x"}
    assert pm.pipeline._flow(3) == 3 and pm.pipeline._flow(None) is None


def test_overrides_set_into_a_copy_through_non_mappings() -> None:
    raw: dict[str, Any] = {"a": {"b": 1}, "c": None}
    assert pm.apply_overrides(raw, ["a.b.c=2", "c.d=[1]"]) == {"a": {"b": {"c": 2}}, "c": {"d": [1]}}
    assert raw == {"a": {"b": 1}, "c": None}
    node: dict[str, Any] = {}
    pm.pipeline._set(node, ["x"], 1)
    assert node == {"x": 1}


def test_write_overrides_keeps_the_quotes_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text("data:\n  target: 'y'\n  source: \"data/raw/t.csv\"\nseed: 1\n")
    (tmp_path / "data/raw").mkdir(parents=True)
    write_overrides(path, ["seed=3"])
    assert path.read_text() == "data:\n  target: 'y'\n  source: \"data/raw/t.csv\"\nseed: 3\n"


def test_schema_is_the_json_schema_of_every_section() -> None:
    s = pm.schema()
    assert s["title"] == "PipelineParams" and s["type"] == "object"
    assert list(s["properties"]) == ["seed", "data", "features", "split", "model", "train", "evaluate", "register",
                                     "tracking", "deploy", "tune"]  # fmt: skip
