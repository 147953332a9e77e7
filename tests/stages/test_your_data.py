"""A new user's first hour, on tables shaped like the public CSVs people try first: the task is inferred sensibly and
said, changing the target, the task or the features just works, test rows stay put across feature changes, the
champion is compared on them with its own preprocessing, and the registry can be steered by hand. A new user's own
data, second try (issue 30): a source outside the project is refused with advice that works; a pandas index written
into a CSV is dropped and an id that leaks the label is warned about; a semicolon file gets a data.delimiter hint;
`trainflow predict` takes a flat folder of images, one image file, and the image column under the name the model was
trained with or `image`, and its errors name --input."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from support.projects import blobs, make_project
from support.shapes import cars, taxis, tips
from support.stages import trainflow

from trainflow import cli
from trainflow.artifacts.predict import ExportedModel
from trainflow.core.errors import ParamsError
from trainflow.core.io import read_json
from trainflow.core.paths import Paths
from trainflow.data.sources import read_source
from trainflow.params import DataParams, load_params, validate
from trainflow.stages import STAGES, run_stage

FAST = {"train.epochs": 4, "train.progress": "false", "train.batch_size": 32}


def project(tmp: Path, name: str, frame: pd.DataFrame, **params: object) -> Path:
    settings = {"data.source": f"data/raw/{name}.csv", "register.model_name": name, **FAST, **params}
    root = make_project(tmp / name, settings)
    frame.to_csv(root / "data" / "raw" / f"{name}.csv", index=False)
    return root


def pipeline(root: Path, monkeypatch: pytest.MonkeyPatch, *overrides: str) -> None:
    """Every stage, as dvc.yaml runs them, the first with the -S overrides."""
    sets = [a for o in overrides for a in ("-S", o)]
    for i, stage in enumerate(STAGES):
        assert trainflow(root, monkeypatch, "stage", stage, *(sets if i == 0 else [])) == 0, stage


def test_a_decimal_target_trains_as_regression_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    frame = taxis()
    assert 0.02 < frame["fare"].nunique() / len(frame) < 0.05  # few distinct values: a classifier's trap
    root = project(tmp_path, "taxis", frame, **{"data.target": "fare"})
    assert trainflow(root, monkeypatch, "stage", "ingest") == 0
    assert "ingest: task regression: target 'fare' holds numbers with fractions" in capsys.readouterr().err
    pipeline(root, monkeypatch)
    metrics = read_json(Paths(root).metrics)
    baselines = {f"baseline_{b}.{m}" for b in ("linear", "boosting") for m in ("r2", "rmse", "mae")}
    assert set(metrics) == {"r2", "rmse", "mae", "n_test", *baselines} and metrics["r2"] > 0.8


def test_a_number_read_as_mostly_one_row_classes_is_an_error_that_says_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    frame = tips().head(100).assign(code=np.arange(100))  # integer codes 0..99 over 100 rows: one row each
    root = project(tmp_path, "ids", frame, **{"data.target": "code"})
    assert trainflow(root, monkeypatch, "stage", "ingest") == 2
    err = capsys.readouterr().err
    assert "the target has 100 of them and 100 have a single row" in err and "set data.task: regression" in err
    assert trainflow(root, monkeypatch, "stage", "ingest", "-S", "data.task=regression") == 0  # the advice works


def test_target_task_and_feature_changes_just_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = project(tmp_path, "tips", tips(), **{"data.target": "tip", "register.model_name": "auto"})
    paths = Paths(root)

    def registered() -> tuple[str, int]:
        reg = read_json(paths.registration)
        return reg["model_name"], reg["version"]

    pipeline(root, monkeypatch)
    assert read_json(paths.split_schema)["task"] == "regression" and registered() == ("tips-tip", 1)
    pipeline(root, monkeypatch, "data.target=day")  # another target: no drift error, no deletion
    assert read_json(paths.split_schema)["task"] == "classification"
    assert registered() == ("tips-day", 1)  # a model of another target: its own name (one name, one kind)
    pipeline(root, monkeypatch, "data.target=size")
    assert read_json(paths.split_schema)["task"] == "classification"  # 6 distinct integers for 244 rows
    pipeline(root, monkeypatch, "data.task=regression")  # the user says otherwise: that is what it trains
    assert read_json(paths.split_schema)["task"] == "regression" and "r2" in read_json(paths.metrics)
    assert registered() == ("tips-size-regression", 1)
    pipeline(root, monkeypatch, "data.exclude=[sex, smoker]")
    assert "sex" not in read_json(paths.split_schema)["features"]
    assert "data params changed (data.exclude)" in capsys.readouterr().err


def test_a_feature_change_keeps_the_test_rows_and_the_better_model_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sklearn.metrics import r2_score

    root = project(tmp_path, "cars", cars(), **{"data.target": "mpg"})
    paths = Paths(root)
    pipeline(root, monkeypatch)
    first_test = pd.read_parquet(paths.split_file("test"))
    shutil.copytree(paths.final, tmp_path / "v1")
    pipeline(root, monkeypatch, "data.exclude=[name]")  # the name is an id: leave it out
    test = pd.read_parquet(paths.split_file("test"))
    assert sorted(test["name"]) == sorted(first_test["name"])  # the same rows, the name column still there
    # The champion (v1, which used `name`) was compared on these rows, scored with its own preprocessing.
    reg = read_json(paths.registration)
    v1, v2 = (r2_score(test["mpg"], ExportedModel.load(d).outputs(test)) for d in (tmp_path / "v1", paths.final))
    assert reg["previous_champion"] == 1 and reg["previous_value"] == pytest.approx(v1, rel=1e-6)  # float32 labels
    assert reg["value"] == pytest.approx(v2, rel=1e-6)
    assert reg["champion_version"] == (2 if v2 > v1 else 1)  # the better one is champion


def test_models_list_promote_and_rollback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow.tracking import MlflowClient

    from trainflow.core.io import write_json

    # register.decide: point: the r2 values below are made up (the paired rule re-scores both models instead)
    root = project(tmp_path, "tips", tips(), **{"data.target": "tip", "register.decide": "point"})
    paths = Paths(root)
    pipeline(root, monkeypatch)
    for seed, delta in ((1, 0.05), (2, -0.05)):  # version 2 better (champion), version 3 worse
        assert trainflow(root, monkeypatch, "stage", "train", "-S", f"seed={seed}") == 0
        assert trainflow(root, monkeypatch, "stage", "evaluate") == 0
        metrics = read_json(paths.metrics)
        write_json(paths.metrics, {**metrics, "r2": metrics["r2"] + delta + 1})
        assert trainflow(root, monkeypatch, "stage", "register") == 0
    client = MlflowClient()

    def champion() -> int:
        return int(client.get_model_version_by_alias("tips", "champion").version)

    assert champion() == 2
    capsys.readouterr()
    assert trainflow(root, monkeypatch, "models", "list") == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[0] == "tips: 3 versions" and listing[1].split()[:3] == ["version", "aliases", "mae"]
    rows = {line.split()[0]: line.split()[1] for line in listing[2:]}
    assert rows == {"3": "challenger", "2": "champion", "1": "-"}

    assert trainflow(root, monkeypatch, "models", "promote", "3", "--reason", "A/B test won") == 0
    assert champion() == 3
    assert (
        "promoted by hand (trainflow models promote): A/B test won"
        in client.get_model_version("tips", "3").tags["champion_change"]
    )
    assert trainflow(root, monkeypatch, "models", "rollback", "--reason", "latency") == 0
    assert champion() == 2  # back to the one before
    assert client.get_model_version("tips", "3").tags["rolled_back"].endswith("latency")
    assert trainflow(root, monkeypatch, "models", "rollback") == 0
    assert champion() == 1
    capsys.readouterr()
    assert trainflow(root, monkeypatch, "models", "rollback") == 2  # version 1 was the first champion
    assert "the only champion it has had" in capsys.readouterr().err
    assert trainflow(root, monkeypatch, "models", "promote", "9") == 2
    assert "tips has no version 9" in capsys.readouterr().err
    assert trainflow(root, monkeypatch, "models", "list", "--name", "nope") == 2
    assert "no registered model 'nope'" in capsys.readouterr().err


def test_rows_without_a_target_are_an_error_or_dropped_as_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    frame = tips().astype({"tip": object})
    frame.loc[[5, 17, 30], "tip"] = None
    root = project(tmp_path, "tips", frame, **{"data.target": "tip"})
    assert trainflow(root, monkeypatch, "stage", "ingest") == 2
    err = capsys.readouterr().err
    assert "line 7, column 'tip': the target value is missing (3 rows without one)" in err
    assert "set data.missing_target: drop" in err
    assert trainflow(root, monkeypatch, "stage", "ingest", "-S", "data.missing_target=drop") == 0  # following it
    assert "dropped 3 rows without a target value 'tip'" in capsys.readouterr().err
    assert read_json(Paths(root).schema)["n_rows"] == 244 - 3


def test_drift_advice_works_when_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = project(tmp_path, "tips", tips(), **{"data.target": "tip"})
    raw = root / "data" / "raw" / "tips.csv"
    assert trainflow(root, monkeypatch, "stage", "ingest") == 0
    tips().assign(table=3).to_csv(raw, index=False)  # the source grows a column under the same params
    capsys.readouterr()
    assert trainflow(root, monkeypatch, "stage", "ingest") == 2
    err = capsys.readouterr().err
    assert "'table' (numeric) is new" in err
    features = "data.features=[total_bill, sex, smoker, day, time, size]"
    assert f"-S '{features}'" in err
    assert trainflow(root, monkeypatch, "stage", "ingest", "-S", features) == 0  # the first way out
    # A column gone: the one way out is to accept the new schema once; then it is the baseline.
    root = project(tmp_path / "again", "tips", tips(), **{"data.target": "tip"})
    raw = root / "data" / "raw" / "tips.csv"
    assert trainflow(root, monkeypatch, "stage", "ingest") == 0
    tips().drop(columns=["sex"]).to_csv(raw, index=False)
    capsys.readouterr()
    assert trainflow(root, monkeypatch, "stage", "ingest") == 2
    err = capsys.readouterr().err
    assert "'sex' (categorical) is missing" in err and "data.features" not in err
    assert trainflow(root, monkeypatch, "stage", "ingest", "--accept-schema") == 0
    assert trainflow(root, monkeypatch, "stage", "ingest") == 0


@pytest.mark.parametrize(
    ("shape", "target"),
    [("taxis", "fare"), ("cars", "origin"), ("tips", "tip")],
    ids=["datetimes-and-missing", "ints-and-question-marks", "yes-no-strings"],
)
def test_the_printed_load_it_recipe_works_on_the_raw_csv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str, target: str
) -> None:
    import re

    from trainflow import serving
    from trainflow.stages.report import summary

    frame = {"taxis": taxis(n=1200), "cars": cars(), "tips": tips()}[shape]
    root = project(tmp_path, shape, frame, **{"data.target": target})
    pipeline(root, monkeypatch)
    recipe = next(line for line in summary(Paths(root), {}).splitlines() if "load it:" in line)
    match = re.fullmatch(r"\s*load it:\s+trainflow\.serving\.load\('([^']+)'\)", recipe)
    assert match is not None, recipe
    raw_file = root / "data" / "raw" / f"{shape}.csv"
    raw = pd.read_csv(raw_file)  # what a user does: ints stay ints, "?" and "Yes" stay text, dates are text
    served = serving.load(match.group(1)).predict(raw)
    assert trainflow(root, monkeypatch, "predict", "--model", match.group(1), "--input", str(raw_file),
                     "--output", "scored.parquet") == 0  # fmt: skip
    expected = pd.read_parquet(root / "scored.parquet")
    assert len(served) == len(raw)
    if not pd.api.types.is_numeric_dtype(frame[target]):
        assert list(served["prediction"]) == list(expected["prediction"])
    else:
        np.testing.assert_allclose(served["prediction"], expected["prediction"], rtol=1e-6)


def overrides_in(text: str) -> list[str]:
    """The -S arguments an advice gives (to the end of its line or its closing backtick), as the shell would pass them:
    -S 'data.exclude=[id]' -> data.exclude=[id]."""
    words = shlex.split(text[text.index("-S ") :].splitlines()[0].split("`")[0])
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-S"]


# --- item 4: a source outside the project ----------------------------------------------------------------------------


def test_a_source_outside_the_project_is_refused_and_copying_it_in_as_advised_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = make_project(tmp_path / "proj", {"data.target": "label", "train.progress": "false"})
    outside = tmp_path / "elsewhere" / "blobs.csv"
    outside.parent.mkdir()
    frame = blobs(n=90)
    frame.to_csv(outside, index=False)
    params_before = (root / "params.yaml").read_bytes()

    for source in (str(outside), "../elsewhere/blobs.csv"):  # absolute, and relative but resolving outside
        assert trainflow(root, monkeypatch, "stage", "ingest", "-S", f"data.source={source}") == 2
        err = capsys.readouterr().err
        assert f"data.source: {source} is outside the project ({root})" in err
        assert "DVC" in err and "stale" in err
        assert (root / "params.yaml").read_bytes() == params_before  # the refused override is not kept
        assert not Paths(root).table.exists()
    # params check refuses it too, before anything runs
    assert trainflow(root, monkeypatch, "params", "check", "-S", f"data.source={outside}") == 2
    err = capsys.readouterr().err
    assert f"data.source: {outside} is outside the project" in err

    # Follow the advice: the shell command in it, then the -S it gives.
    command = re.search(r"`(cp [^`]+)`", err)
    assert command is not None, err
    assert command.group(1) == f"cp {outside} data/raw/ && dvc add data/raw/blobs.csv"
    subprocess.run(["bash", "-c", command.group(1)], cwd=root, check=True, capture_output=True)
    assert (root / "data/raw/blobs.csv.dvc").is_file()  # tracked by DVC, as the README's "Your data" does it
    sets = overrides_in(err[err.index(command.group(0)) :])
    assert sets == ["data.source=data/raw/blobs.csv"]
    assert trainflow(root, monkeypatch, "stage", "ingest", *[a for s in sets for a in ("-S", s)]) == 0
    assert len(pd.read_parquet(Paths(root).table)) == len(frame)


def test_a_source_in_the_project_but_outside_data_raw_is_refused_too_and_the_advice_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """dvc.yaml's ingest depends on data/raw/ alone: rows appended to a file at the project's root left `dvc status`
    clean (a stale model, as for a file outside the project)."""
    root = make_project(tmp_path / "proj", {"data.target": "label", "train.progress": "false"})
    frame = blobs(n=60)
    frame.to_csv(root / "mydata.csv", index=False)
    assert trainflow(root, monkeypatch, "stage", "ingest", "-S", "data.source=mydata.csv") == 2
    err = capsys.readouterr().err
    assert "data.source: mydata.csv is outside data/raw/" in err and "stale" in err
    command = re.search(r"`(cp [^`]+)`", err)
    assert (
        command is not None and command.group(1) == f"cp {root / 'mydata.csv'} data/raw/ && dvc add data/raw/mydata.csv"
    )
    subprocess.run(["bash", "-c", command.group(1)], cwd=root, check=True, capture_output=True)
    sets = overrides_in(err[err.index(command.group(0)) :])
    assert sets == ["data.source=data/raw/mydata.csv"]
    assert trainflow(root, monkeypatch, "stage", "ingest", *[a for s in sets for a in ("-S", s)]) == 0
    assert len(pd.read_parquet(Paths(root).table)) == len(frame)


def test_a_folder_or_glob_outside_the_project_gets_advice_for_it(tmp_path: Path) -> None:
    root = make_project(tmp_path / "proj")
    folder = tmp_path / "my data"
    folder.mkdir()
    blobs(n=30).to_csv(folder / "a.csv", index=False)
    for source, command, setting in [
        (str(folder), f"cp -r '{folder}' data/raw/ && dvc add 'data/raw/my data'", "'data.source=data/raw/my data'"),
        (
            f"{folder}/*.csv",
            f"mkdir -p 'data/raw/my data' && cp '{folder}'/*.csv 'data/raw/my data/' && dvc add 'data/raw/my data'",
            "'data.source=data/raw/my data/*.csv'",
        ),
    ]:
        with pytest.raises(ParamsError) as caught:
            load_params(root / "params.yaml", [f"data.source={source}", "data.target=label"])
        message = str(caught.value)
        assert f"`{command}`, then rerun with `-S {setting}`" in message
    # the glob advice, followed, gives a source inside the project that reads the same rows
    subprocess.run(["bash", "-c", command], cwd=root, check=True, capture_output=True)
    params = load_params(root / "params.yaml", [*overrides_in(message[message.index(command) :]), "data.target=label"])
    assert len(read_source(params.data, root).frame) == 30


def test_the_refusal_comes_with_the_other_problems_and_at_ingest_too(tmp_path: Path) -> None:
    root = make_project(tmp_path / "proj")
    outside = tmp_path / "x.csv"
    blobs(n=30).to_csv(outside, index=False)
    with pytest.raises(ParamsError) as caught:
        load_params(root / "params.yaml", [f"data.source={outside}", "train.lr=-1"])
    assert [path for path, _ in caught.value.problems] == ["train.lr", "data.source"]  # all at once
    # params validated without load_params (a flow's own, a test's) meet the same refusal at ingest
    params = validate({"data": {"source": str(outside), "target": "label"}}, "test")
    with pytest.raises(ParamsError, match=f"data.source: {outside} is outside the project"):
        run_stage("ingest", params, Paths(root))
    assert not Paths(root).table.exists()


def test_sources_inside_the_project_stay_allowed(tmp_path: Path) -> None:
    root = make_project(tmp_path / "proj")
    (tmp_path / "link").symlink_to(root)  # the project seen through a symlink: still inside it
    for source in ("builtin:iris", "data/raw/x.csv", str(root / "data/raw/x.csv"), "data/raw/../raw/x.csv",
                   str(tmp_path / "link/data/raw/x.csv")):  # fmt: skip
        assert load_params(root / "params.yaml", [f"data.source={source}"]).data.source == source


# --- item 6: a pandas index column, and ids ------------------------------------------------------------------------


def leaky(n: int = 120, seed: int = 0) -> pd.DataFrame:
    """Rows sorted by label, an id counting them: the id alone gives the label; the features carry no signal."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "id": np.arange(1, n + 1),
            "f0": rng.normal(size=n),
            "f1": rng.normal(size=n),
            "label": np.where(np.arange(n) < n // 2, "a", "b"),
        }
    )


def test_a_pandas_index_column_is_dropped_and_an_id_that_leaks_the_label_is_warned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = make_project(tmp_path / "proj", {"data.source": "data/raw/exercise.csv", "data.target": "label"})
    frame = leaky()
    frame.to_csv(root / "data/raw/exercise.csv")  # pandas' default: the index too, under an empty header
    # independently: the file's first column is the unnamed index 0..n-1, and the id gives the label
    as_read = pd.read_csv(root / "data/raw/exercise.csv")
    assert as_read.columns[0] == "Unnamed: 0" and as_read["Unnamed: 0"].tolist() == list(range(len(frame)))
    assert (as_read["label"] == np.where(as_read["id"] > len(frame) // 2, "b", "a")).all()

    assert trainflow(root, monkeypatch, "stage", "ingest") == 0
    err = capsys.readouterr().err
    assert "ingest: data/raw/exercise.csv: dropped its first column" in err and "index" in err
    schema = read_json(Paths(root).schema)
    assert schema["features"] == ["id", "f0", "f1"]  # the file's columns but the index and the target
    assert "column_1" not in pd.read_parquet(Paths(root).table).columns
    warning = next(line for line in err.splitlines() if "look like ids" in line)
    assert "'id'" in warning and "'f0'" not in warning and "'f1'" not in warning
    assert warning.endswith("-S 'data.exclude=[id]'")

    # the advice, followed: the id is no feature, and no warning is left
    assert trainflow(root, monkeypatch, "stage", "ingest", "-S", *overrides_in(warning)) == 0
    assert "look like ids" not in capsys.readouterr().err
    assert read_json(Paths(root).schema)["features"] == ["f0", "f1"]


def test_the_id_advice_keeps_the_exclusions_already_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    frame = leaky().assign(name=[f"person {i}" for i in range(120)])  # text unique per row: an id too
    root = make_project(tmp_path / "proj", {"data.source": "data/raw/x.csv", "data.target": "label"})
    frame.to_csv(root / "data/raw/x.csv", index=False)
    assert frame["name"].is_unique and frame["f0"].is_unique  # f0 too, but floats are measurements, not ids
    assert trainflow(root, monkeypatch, "stage", "ingest", "-S", "data.exclude=[f1]") == 0
    warning = next(line for line in capsys.readouterr().err.splitlines() if "look like ids" in line)
    assert "'id'" in warning and "'name'" in warning and "'f0'" not in warning
    assert warning.endswith("-S 'data.exclude=[f1, id, name]'")
    assert trainflow(root, monkeypatch, "stage", "ingest", "-S", *overrides_in(warning)) == 0
    assert read_json(Paths(root).schema)["features"] == ["f0"]


@pytest.mark.parametrize("sep", [",", "\t"])
def test_reading_drops_a_pandas_index_but_keeps_named_and_non_index_first_columns(tmp_path: Path, sep: str) -> None:
    ext = "csv" if sep == "," else "tsv"
    frame = leaky(30).sample(frac=1, random_state=0)  # shuffled: the index is 0..n-1 out of order
    frame.to_csv(tmp_path / f"a.{ext}", sep=sep)
    read = read_source(DataParams.model_validate({"source": f"a.{ext}", "target": "label"}), tmp_path)
    assert list(read.frame.columns) == list(frame.columns)
    assert read.notes and "dropped its first column" in read.notes[0]
    frame.rename_axis("row").to_csv(tmp_path / f"b.{ext}", sep=sep)  # a named index is a column like any other
    kept = read_source(DataParams.model_validate({"source": f"b.{ext}", "target": "label"}), tmp_path).frame
    assert list(kept.columns) == ["row", *frame.columns]
    (tmp_path / f"c.{ext}").write_text(sep.join(["", "x", "label"]) + "\n" + sep.join(["u", "1", "a"]) + "\n")
    words = read_source(DataParams.model_validate({"source": f"c.{ext}", "target": "label"}), tmp_path).frame
    assert list(words.columns) == ["column_1", "x", "label"]  # not integers: not an index, kept as before


# --- item 10a: a semicolon (or tab) delimited file ------------------------------------------------------------------


@pytest.mark.parametrize("sep", [";", "\t"])
def test_a_file_with_another_delimiter_gets_a_data_delimiter_hint_that_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], sep: str
) -> None:
    root = make_project(tmp_path / "proj", {"data.source": "data/raw/blobs.csv", "data.target": "label"})
    frame = blobs(n=60)
    frame.to_csv(root / "data/raw/blobs.csv", sep=sep, index=False)
    assert trainflow(root, monkeypatch, "stage", "ingest") == 2
    err = capsys.readouterr().err
    assert "data.delimiter" in err and f"{sep!r}" in err and "Set data.target" not in err
    assert trainflow(root, monkeypatch, "stage", "ingest", "-S", *overrides_in(err)) == 0
    assert load_params(root / "params.yaml").data.delimiter == sep
    assert read_json(Paths(root).schema)["features"] == [c for c in frame.columns if c != "label"]


# --- item 10b, c: predict on images --------------------------------------------------------------------------------

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (40, 60, 230)}


def squares(folder: Path, per_class: int = 6) -> list[str]:
    """<folder>/<colour>_<i>.png: 8x8 squares of a colour on a noisy background; their names."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for name, colour in COLOURS.items():
        for i in range(per_class):
            x = rng.integers(0, 60, (8, 8, 3))
            x[2:6, 2:6] = colour
            Image.fromarray(x.astype(np.uint8)).save(folder / f"{name}_{i}.png")
            names.append(f"{name}_{i}.png")
    return names


@pytest.fixture(scope="module")
def image_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cnn trained on a table whose image column is `file` (not `image`): its exported directory."""
    root = make_project(
        tmp_path_factory.mktemp("img") / "proj",
        {"data.source": "data/raw/pets.csv", "data.image_column": "file", "data.target": "label",
         "train.progress": "false", "train.epochs": 1, "train.batch_size": 8, "model.cnn_channels": "[4]"},
    )  # fmt: skip
    names = squares(root / "data/raw/imgs")
    pd.DataFrame({"file": [f"imgs/{n}" for n in names], "label": [n.split("_")[0] for n in names]}).to_csv(
        root / "data/raw/pets.csv", index=False
    )
    paths = Paths(root)
    for stage in ("ingest", "split", "train"):
        run_stage(stage, load_params(paths.params), paths)
    assert read_json(paths.final / "schema.json")["image_column"] == "file"
    return paths.final


def predict(cwd: Path, monkeypatch: pytest.MonkeyPatch, model: Path, input: str, output: str) -> int:
    monkeypatch.chdir(cwd)
    return cli.main(["predict", "--model", str(model), "--input", input, "--output", output])


@pytest.fixture
def new_images(tmp_path: Path) -> Path:
    """Images to score, flat in one folder, and the reference: a table of their paths under the trained column name
    (`file`), scored by the form predict always took."""
    squares(tmp_path / "new", per_class=2)
    names = sorted(os.listdir(tmp_path / "new"))
    pd.DataFrame({"file": [f"new/{n}" for n in names]}).to_csv(tmp_path / "table.csv", index=False)
    return tmp_path


def test_predict_scores_a_flat_folder_of_images_and_one_image_file(
    image_model: Path, new_images: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert predict(new_images, monkeypatch, image_model, "table.csv", "reference.csv") == 0
    reference = pd.read_csv(new_images / "reference.csv")
    names = sorted(os.listdir(new_images / "new"))
    assert predict(new_images, monkeypatch, image_model, "new", "flat.csv") == 0
    flat = pd.read_csv(new_images / "flat.csv")
    assert flat["file_path"].tolist() == [f"new/{n}" for n in names]  # one row per file, sorted, named by its path
    assert flat["prediction"].tolist() == reference["prediction"].tolist()
    probas = [c for c in reference.columns if c.startswith("proba_")]
    np.testing.assert_array_equal(flat[probas].to_numpy(), reference[probas].to_numpy())
    assert predict(new_images, monkeypatch, image_model, f"new/{names[3]}", "one.csv") == 0
    one = pd.read_csv(new_images / "one.csv")
    assert one["file_path"].tolist() == [f"new/{names[3]}"]
    assert one["prediction"].tolist() == [reference["prediction"][3]]


@pytest.mark.parametrize("column", ["image", "file_path", "image_path"])
def test_predict_takes_the_image_column_as_trained_or_as_image(
    image_model: Path, new_images: Path, monkeypatch: pytest.MonkeyPatch, column: str
) -> None:
    assert predict(new_images, monkeypatch, image_model, "table.csv", "reference.csv") == 0
    reference = pd.read_csv(new_images / "reference.csv")
    pd.read_csv(new_images / "table.csv").rename(columns={"file": column}).to_csv(new_images / "t.csv", index=False)
    assert predict(new_images, monkeypatch, image_model, "t.csv", "out.csv") == 0
    out = pd.read_csv(new_images / "out.csv")
    assert list(out.columns) == [column, *reference.columns[1:]]  # the user's column name stays
    assert out["prediction"].tolist() == reference["prediction"].tolist()


def test_predict_input_errors_name_input_and_their_advice_works(
    image_model: Path, new_images: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a table without an image column under any name the model takes: rename it as advised
    pd.read_csv(new_images / "table.csv").rename(columns={"file": "picture"}).to_csv(new_images / "t.csv", index=False)
    assert predict(new_images, monkeypatch, image_model, "t.csv", "out.csv") == 2
    err = capsys.readouterr().err
    assert "--input t.csv" in err and "'picture'" in err and "data.source" not in err
    rename = re.search(r"rename .*? to '(\w+)'", err)
    assert rename is not None, err
    pd.read_csv(new_images / "t.csv").rename(columns={"picture": rename.group(1)}).to_csv(
        new_images / "t.csv", index=False
    )
    assert predict(new_images, monkeypatch, image_model, "t.csv", "out.csv") == 0

    # a flat folder with something else in it: remove it as advised
    (new_images / "new/notes.txt").write_text("not an image\n")
    assert predict(new_images, monkeypatch, image_model, "new", "out.csv") == 2
    err = capsys.readouterr().err
    assert "--input new" in err and "new/notes.txt" in err and "data.source" not in err
    (new_images / "new/notes.txt").unlink()
    assert predict(new_images, monkeypatch, image_model, "new", "out.csv") == 0

    # a folder of class folders with a stray file beside them (the class-folder reader's error): named as --input
    shutil.copytree(new_images / "new", new_images / "classes/red")
    shutil.copy(new_images / "new" / sorted(os.listdir(new_images / "new"))[0], new_images / "classes/stray.png")
    assert predict(new_images, monkeypatch, image_model, "classes", "out.csv") == 2
    err = capsys.readouterr().err
    assert "--input" in err and "classes/stray.png" in err and "data.source" not in err
