"""data.source and the name it gives the model (trainflow.params): a source outside data/raw/ is refused with the
commands that copy it in and track it (files, folders, globs, paths with spaces, under ~, through symlinks), after
the other problems and against the params file's folder; the registered model's default name. Expected messages are
written out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainflow import params as pm
from trainflow.core.errors import ParamsError
from trainflow.params import PipelineParams, default_model_name, load_params, source_outside

TAIL = "for the ingest stage, so rows added to it later would leave `dvc status` clean and the model stale."


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


def test_a_source_outside_data_raw_is_refused_with_the_commands_that_copy_it_in(tmp_path: Path) -> None:
    from trainflow.params import load_params

    project = tmp_path / "proj"
    project.mkdir()
    (project / "params.yaml").write_text("data:\n  source: ../x.csv\n  target: y\nseed: -1\n")
    with pytest.raises(ParamsError) as bad:
        load_params(project / "params.yaml")
    assert bad.value.problems == [
        ("seed", "Input should be greater than or equal to 0 (got -1)"),
        ("data.source",
         f"../x.csv is outside the project ({project}): DVC watches only data/raw/ for the ingest stage, so rows added "
         f"to it later would leave `dvc status` clean and the model stale. Copy it into data/raw/ and track it: "
         f"`cp {tmp_path / 'x.csv'} data/raw/ && dvc add data/raw/x.csv`, then rerun with "
         "`-S data.source=data/raw/x.csv`"),
    ]  # fmt: skip
    (project / "params.yaml").write_text("data:\n  source: data/raw/x.csv\n  target: y\n")
    assert load_params(project / "params.yaml").data.source == "data/raw/x.csv"


def test_a_glob_outside_data_raw_is_copied_in_as_a_folder_of_its_own(tmp_path: Path) -> None:
    from trainflow.params import source_outside

    project = tmp_path / "proj"
    project.mkdir()
    assert source_outside("../in/*.csv", project) == (
        f"../in/*.csv is outside the project ({project}): DVC watches only data/raw/ for the ingest stage, so rows "
        "added to it later would leave `dvc status` clean and the model stale. Copy it into data/raw/ and track it: "
        f"`mkdir -p data/raw/in && cp {tmp_path / 'in'}/*.csv data/raw/in/ && dvc add data/raw/in`, then rerun with "
        "`-S 'data.source=data/raw/in/*.csv'`"
    )
    assert source_outside("builtin:iris", project) is None
    assert source_outside("data/raw/a.csv", project) is None


# --- the registered model's default name -----------------------------------------------------------------------


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
