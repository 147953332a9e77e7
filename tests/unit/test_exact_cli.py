"""The command line, pinned exactly: each command's help (the frozen CLI surface), what each subcommand hands to the
function that does its work (every option's default included), and every line it prints, on stdout or stderr, with
its exit code. The work itself is replaced by recorders, so each test runs in-process in milliseconds."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from trainflow import cli, stages, tracking
from trainflow.artifacts import batch_predict
from trainflow.core.errors import Preempted, ServiceError, UserError
from trainflow.core.paths import Paths
from trainflow.data import arrival
from trainflow.params import write_overrides
from trainflow.registry import registry

HELP = {
    "": (
        "usage: trainflow [-h] [--version] {stage,run,predict,params,models,verify,tune,data,deploy} ...\n"
        "\n"
        "`trainflow` command line. Exit codes: 0 ok, 2 invalid params or data (the message names what to\n"
        "fix), 75 training preempted (a signal or train.max_time: checkpointed, a rerun resumes), 1 other.\n"
        "\n"
        "positional arguments:\n"
        "  {stage,run,predict,params,models,verify,tune,data,deploy}\n"
        "    stage               run one pipeline stage (what dvc.yaml calls)\n"
        "    run                 run the whole pipeline through the Prefect flow (stages DVC sees as\n"
        "                        changed)\n"
        "    predict             score a table with a registered or exported model; writes its rows plus\n"
        "                        the predictions\n"
        "    params              check params.yaml or print its JSON Schema\n"
        "    models              the registered model's versions: list them, promote one to champion, roll\n"
        "                        the champion back\n"
        "    verify              retrain a registered version from its commit, params and data; check it\n"
        "                        comes out byte for byte\n"
        "    tune                hyperparameter sweep (Optuna): trials of the tune: section, results in\n"
        "                        reports/tune/\n"
        "    data                new data: add a file to data.source (tracked with DVC; a Prefect event\n"
        "                        starts the deployed retrain)\n"
        "    deploy              serve the pipeline on a cron schedule from a Prefect server\n"
        "                        (PREFECT_API_URL); runs until Ctrl-C\n"
        "\n"
        "options:\n"
        "  -h, --help            show this help message and exit\n"
        "  --version             print trainflow's version and exit\n"
    ),
    "stage": (
        "usage: trainflow stage [-h] [--accept-schema] [-S KEY=VALUE]\n"
        "                       {ingest,split,train,evaluate,register}\n"
        "\n"
        "Run one stage of the pipeline, whatever DVC thinks of it (dvc.yaml runs each stage this way). -S\n"
        "KEY=VALUE sets a parameter of params.yaml (dotted path, YAML value, as `dvc exp run -S`): it is\n"
        "validated, then written into params.yaml (comments kept) so DVC's record of what ran stays true.\n"
        "If the command then fails on your params or data (exit code 2), params.yaml is put back as it was,\n"
        "and if stages had already run with the overrides, the message names them and what to run to make\n"
        "the outputs consistent again.\n"
        "\n"
        "positional arguments:\n"
        "  {ingest,split,train,evaluate,register}\n"
        "                        ingest, split, train, evaluate or register\n"
        "\n"
        "options:\n"
        "  -h, --help            show this help message and exit\n"
        "  --accept-schema       ingest: take the data's columns and labels as they are now, without the\n"
        "                        drift check against the previous ingest (after the source changed on\n"
        "                        purpose)\n"
        "  -S KEY=VALUE, --set KEY=VALUE\n"
        "                        override a parameter, YAML value, as `dvc exp run -S` (written into\n"
        "                        params.yaml, then used); e.g. -S train.lr=3e-4 -S data.exclude=[a,b];\n"
        "                        repeat for more\n"
        "\n"
        "Outputs: data/processed/ (typed table, schema), data/splits/ (train/val/test), models/checkpoints/\n"
        "(resume state), models/final/ (the model: safetensors + JSON), reports/metrics.json,\n"
        "reports/plots/, reports/registration.json; MLflow runs and the registry in mlflow.db (or\n"
        "MLFLOW_TRACKING_URI).\n"
    ),
    "run": (
        "usage: trainflow run [-h] [-S KEY=VALUE]\n"
        "\n"
        "Run ingest, split, train, evaluate and register as a Prefect flow, each stage only if DVC sees it\n"
        "changed (then `dvc commit`ted, so `dvc status` stays clean), then push the outputs to the DVC\n"
        "remote (deploy.push). Ends with a summary: the inferred task, the metrics, the model, the registry\n"
        "decision. -S KEY=VALUE sets a parameter of params.yaml (dotted path, YAML value, as `dvc exp run\n"
        "-S`): it is validated, then written into params.yaml (comments kept) so DVC's record of what ran\n"
        "stays true. If the command then fails on your params or data (exit code 2), params.yaml is put\n"
        "back as it was, and if stages had already run with the overrides, the message names them and what\n"
        "to run to make the outputs consistent again.\n"
        "\n"
        "options:\n"
        "  -h, --help            show this help message and exit\n"
        "  -S KEY=VALUE, --set KEY=VALUE\n"
        "                        override a parameter, YAML value, as `dvc exp run -S` (written into\n"
        "                        params.yaml, then used); e.g. -S train.lr=3e-4 -S data.exclude=[a,b];\n"
        "                        repeat for more\n"
        "\n"
        "Outputs: data/processed/ (typed table, schema), data/splits/ (train/val/test), models/checkpoints/\n"
        "(resume state), models/final/ (the model: safetensors + JSON), reports/metrics.json,\n"
        "reports/plots/, reports/registration.json; MLflow runs and the registry in mlflow.db (or\n"
        "MLFLOW_TRACKING_URI).\n"
    ),
    "predict": (
        "usage: trainflow predict [-h] --model MODEL --input INPUT --output OUTPUT\n"
        "                         [--batch-size BATCH_SIZE] [--runtime {torch,onnx}]\n"
        "                         [--memory-budget-mb MEMORY_BUDGET_MB]\n"
        "\n"
        "Score every row of --input with --model and write the rows plus a `prediction` column (and\n"
        "`proba_<class>` columns for classification) to --output, as csv, tsv, parquet or jsonl by its\n"
        "extension.\n"
        "\n"
        "options:\n"
        "  -h, --help            show this help message and exit\n"
        "  --model MODEL         models:/<name>@champion, models:/<name>/<version>, runs:/<run>/model, or\n"
        "                        an exported model directory\n"
        "  --input INPUT         a csv, tsv, parquet or jsonl file\n"
        "  --output OUTPUT       where to write (.csv, .tsv, .parquet, .jsonl)\n"
        "  --batch-size BATCH_SIZE\n"
        "                        rows per forward pass (default 1024)\n"
        "  --runtime {torch,onnx}\n"
        "                        score with the torch model (default) or with its model.onnx in ONNX\n"
        "                        Runtime\n"
        "  --memory-budget-mb MEMORY_BUDGET_MB\n"
        "                        a Parquet --input bigger than this once read is streamed a block at a time\n"
        "                        (default: a quarter of this machine's memory)\n"
    ),
    "params": (
        "usage: trainflow params [-h] {check,schema} ...\n"
        "\n"
        "positional arguments:\n"
        "  {check,schema}\n"
        "    check         validate params.yaml (with -S overrides); changes nothing\n"
        "    schema        print the JSON Schema of params.yaml\n"
        "\n"
        "options:\n"
        "  -h, --help      show this help message and exit\n"
    ),
    "params check": (
        "usage: trainflow params check [-h] [-S KEY=VALUE]\n"
        "\n"
        "Validate params.yaml with the -S overrides; changes nothing. Valid: exit 0, the resolved params\n"
        "(every field, defaults included) as JSON on stdout, e.g. `trainflow params check | jq .train.lr`.\n"
        "Invalid: exit 2, every problem with its dotted path on stderr, nothing on stdout.\n"
        "\n"
        "options:\n"
        "  -h, --help            show this help message and exit\n"
        "  -S KEY=VALUE, --set KEY=VALUE\n"
        "                        override a parameter, YAML value, as `dvc exp run -S` (not written\n"
        "                        anywhere); e.g. -S train.lr=3e-4 -S data.exclude=[a,b]; repeat for more\n"
    ),
    "params schema": (
        "usage: trainflow params schema [-h] [-S KEY=VALUE]\n"
        "\n"
        "options:\n"
        "  -h, --help            show this help message and exit\n"
        "  -S KEY=VALUE, --set KEY=VALUE\n"
        "                        override a parameter, YAML value, as `dvc exp run -S` (not written\n"
        "                        anywhere); e.g. -S train.lr=3e-4 -S data.exclude=[a,b]; repeat for more\n"
    ),
    "models": (
        "usage: trainflow models [-h] {list,promote,rollback,show} ...\n"
        "\n"
        "The MLflow registry of register.model_name (or --name): `list` shows every version with its\n"
        "aliases, test metrics and data hash; `promote VERSION` makes a version the champion by hand;\n"
        "`rollback` gives the champion back to the version that held it before. Each change is tagged on\n"
        "the version with its reason.\n"
        "\n"
        "positional arguments:\n"
        "  {list,promote,rollback,show}\n"
        "    list                every version, newest first\n"
        "    promote             make VERSION the champion\n"
        "    rollback            champion back to the previous champion\n"
        "    show                print the model card of a version (NAME@ALIAS or NAME/VERSION)\n"
        "\n"
        "options:\n"
        "  -h, --help            show this help message and exit\n"
    ),
    "models list": (
        "usage: trainflow models list [-h] [--name NAME] [--all]\n"
        "\n"
        "options:\n"
        "  -h, --help   show this help message and exit\n"
        "  --name NAME  registered model name (default: register.model_name in params.yaml)\n"
        "  --all        every registered model name instead, one row each\n"
    ),
    "models promote": (
        "usage: trainflow models promote [-h] [--name NAME] [--reason REASON] version\n"
        "\n"
        "positional arguments:\n"
        "  version          the version to make champion\n"
        "\n"
        "options:\n"
        "  -h, --help       show this help message and exit\n"
        "  --name NAME      registered model name (default: register.model_name in params.yaml)\n"
        "  --reason REASON  why; recorded as a tag on the version\n"
    ),
    "models rollback": (
        "usage: trainflow models rollback [-h] [--name NAME] [--reason REASON]\n"
        "\n"
        "options:\n"
        "  -h, --help       show this help message and exit\n"
        "  --name NAME      registered model name (default: register.model_name in params.yaml)\n"
        "  --reason REASON  why; recorded as a tag on the version\n"
    ),
    "models show": (
        "usage: trainflow models show [-h] [--html HTML] model\n"
        "\n"
        "positional arguments:\n"
        "  model        NAME@champion, NAME/VERSION (or models:/...)\n"
        "\n"
        "options:\n"
        "  -h, --help   show this help message and exit\n"
        "  --html HTML  also write the card's self-contained HTML page here\n"
    ),
    "verify": (
        "usage: trainflow verify [-h] [--commit COMMIT] model\n"
        "\n"
        "Prove a registered version reproduces: the code of its git commit with the params it was trained\n"
        "with, the splits it was trained on out of the DVC cache (each file checked against DVC's md5), the\n"
        "train stage run in a temporary folder, and the exported model's hash compared with the version's.\n"
        "Exit 0 when it matches.\n"
        "\n"
        "positional arguments:\n"
        "  model            NAME@champion, NAME@challenger, NAME/VERSION (or models:/...)\n"
        "\n"
        "options:\n"
        "  -h, --help       show this help message and exit\n"
        "  --commit COMMIT  retrain from this commit's code (e.g. HEAD), for a version trained from changes\n"
        "                   committed after it\n"
    ),
    "tune": (
        "usage: trainflow tune [-h] [-S KEY=VALUE] [--trials TRIALS] [--workers WORKERS] [--apply]\n"
        "                      [--deployment FLOW/NAME]\n"
        "\n"
        "Run the study of params.yaml's tune: section to its budget: each trial trains on data/splits\n"
        "(ingest and split run first if DVC sees them changed) in models/tune/<study>/trial_NNNN, is pruned\n"
        "when unpromising, and is tracked as a child of the study's MLflow run. A rerun continues the study\n"
        "and resumes trials a killed worker left. Writes reports/tune/trials.csv, best_params.yaml and\n"
        "plots. -S overrides apply to this sweep only: params.yaml is never rewritten, except by --apply.\n"
        "\n"
        "options:\n"
        "  -h, --help            show this help message and exit\n"
        "  -S KEY=VALUE, --set KEY=VALUE\n"
        "                        override a parameter, YAML value, as `dvc exp run -S` (not written\n"
        "                        anywhere); e.g. -S train.lr=3e-4 -S data.exclude=[a,b]; repeat for more\n"
        "  --trials TRIALS       total trials of the study (default: tune.trials)\n"
        "  --workers WORKERS     trials at the same time, as processes (default: tune.workers)\n"
        "  --apply               write the best trial's params into params.yaml (comments kept), with\n"
        "                        register.tags naming the study and trial; the next `trainflow run` trains\n"
        "                        and registers them through the usual gate\n"
        "  --deployment FLOW/NAME\n"
        "                        run the trials as flow runs of this deployment of\n"
        "                        flows/sweep.py:tune_worker on a Prefect work pool (workers on many\n"
        "                        machines; needs PREFECT_API_URL and a tune.storage database), e.g.\n"
        "                        tune_worker/tune-worker\n"
    ),
    "data": (
        "usage: trainflow data [-h] {add,watch} ...\n"
        "\n"
        "`add FILE...` reads each file as ingest will (a malformed row or other columns: refused, nothing\n"
        "added), copies it into the folder data.source names (or its glob's folder), `dvc add`s it and\n"
        "emits the Prefect event trainflow.data.added, which `trainflow deploy`'s deployment retrains on. A\n"
        "file byte-identical to one already there is not added and starts nothing. `watch INBOX` adds each\n"
        "file that lands in INBOX and moves it to INBOX/added/ (or INBOX/rejected/ with a .why.txt).\n"
        "\n"
        "positional arguments:\n"
        "  {add,watch}\n"
        "    add        add files to data.source and tell the deployment\n"
        "    watch      add every file that lands in a folder (polls; Ctrl-C stops)\n"
        "\n"
        "options:\n"
        "  -h, --help   show this help message and exit\n"
    ),
    "data add": (
        "usage: trainflow data add [-h] [--no-event] FILE [FILE ...]\n"
        "\n"
        "positional arguments:\n"
        "  FILE\n"
        "\n"
        "options:\n"
        "  -h, --help  show this help message and exit\n"
        "  --no-event  add the files without emitting the Prefect event\n"
    ),
    "data watch": (
        "usage: trainflow data watch [-h] [--interval INTERVAL] [--once] inbox\n"
        "\n"
        "positional arguments:\n"
        "  inbox                the folder files arrive in (outside data/raw/)\n"
        "\n"
        "options:\n"
        "  -h, --help           show this help message and exit\n"
        "  --interval INTERVAL  seconds between polls (default 5)\n"
        "  --once               handle the files there now, then exit\n"
    ),
    "deploy": (
        "usage: trainflow deploy [-h] [--cron CRON] [--name NAME] [--timezone TIMEZONE]\n"
        "\n"
        "options:\n"
        "  -h, --help           show this help message and exit\n"
        "  --cron CRON          cron expression, e.g. '0 3 * * *' (default: deploy.cron in params.yaml)\n"
        "  --name NAME          deployment name (default: deploy.name in params.yaml)\n"
        "  --timezone TIMEZONE  IANA time zone of the cron (default: deploy.timezone in params.yaml)\n"
    ),
}


@pytest.mark.parametrize("command", list(HELP))
def test_each_command_s_help_is_the_frozen_cli_surface(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A change to an option, its help or a command's description is deliberate: it shows here (at 100 columns)."""
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exit_:
        cli.main([*command.split(), "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == HELP[command]


@pytest.fixture
def project(params_file: Path, monkeypatch: pytest.MonkeyPatch) -> Paths:
    """The committed params.yaml with register.model_name set, as the cwd; the MLflow setup recorded, not done."""
    write_overrides(params_file, ["register.model_name=penguins"])
    monkeypatch.chdir(params_file.parent)
    monkeypatch.setattr(tracking, "configure", lambda root: CONFIGURED.append(root))
    CONFIGURED.clear()
    return Paths(params_file.parent)


CONFIGURED: list[Path] = []


def recorder(calls: list[Any], result: Any = None) -> Any:
    def record(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        if isinstance(result, BaseException):
            raise result
        return result

    return record


# --- predict ----------------------------------------------------------------------------------------------------------


def test_predict_hands_its_defaults_to_predict_file_and_prints_its_result_as_json(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --batch-size: 1024 rows a pass; no --memory-budget-mb: None (predict_file picks a quarter of the memory);
    no --runtime: torch.
    The project's registry is configured and its root importable before the model loads."""
    calls: list[Any] = []
    monkeypatch.setattr(batch_predict, "predict_file", recorder(calls, {"rows": 3, "output": "out.csv"}))
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert cli.main(["predict", "--model", "models:/m@champion", "--input", "in.csv", "--output", "out.csv"]) == 0
    assert calls == [(("models:/m@champion", Path("in.csv"), Path("out.csv"), 1024, None, "torch"), {})]
    assert capsys.readouterr() == ('{\n  "rows": 3,\n  "output": "out.csv"\n}\n', "")
    assert [project.root] == CONFIGURED and sys.path[0] == str(project.root)


def test_predict_passes_the_batch_size_memory_budget_and_runtime_given(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(batch_predict, "predict_file", recorder(calls, {}))
    argv = ["predict", "--model", "runs:/r/model", "--input", "a.parquet", "--output", "b.jsonl"]
    assert cli.main([*argv, "--batch-size", "1", "--memory-budget-mb", "2.5", "--runtime", "onnx"]) == 0
    assert calls == [(("runs:/r/model", Path("a.parquet"), Path("b.jsonl"), 1, 2.5, "onnx"), {})]
    assert capsys.readouterr().out == "{}\n"


@pytest.mark.parametrize("size", ["0", "-3"])
def test_a_batch_size_under_one_is_refused_before_anything_loads(
    size: str, project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(batch_predict, "predict_file", recorder(calls, {}))
    argv = ["predict", "--model", "m", "--input", "a.csv", "--output", "b.csv", "--batch-size", size]
    assert cli.main(argv) == 2
    assert capsys.readouterr() == ("", f"error: --batch-size must be at least 1, not {size}\n")
    assert calls == [] and CONFIGURED == []


# --- models -----------------------------------------------------------------------------------------------------------


def test_models_promote_and_rollback_pass_the_name_version_and_reason_and_say_who_is_champion(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--name defaults to register.model_name; --reason to "(no reason given)"."""
    promoted: list[Any] = []
    rolled: list[Any] = []
    monkeypatch.setattr(registry, "promote", recorder(promoted, {"champion": 4, "previous_champion": 2}))
    monkeypatch.setattr(registry, "rollback", recorder(rolled, {"champion": 2, "previous_champion": None}))
    assert cli.main(["models", "promote", "4"]) == 0
    assert cli.main(["models", "promote", "5", "--name", "iris", "--reason", "better"]) == 0
    assert promoted == [(("penguins", 4, "(no reason given)"), {}), (("iris", 5, "better"), {})]
    assert cli.main(["models", "rollback"]) == 0
    assert cli.main(["models", "rollback", "--name", "iris", "--reason", "bad week"]) == 0
    assert rolled == [(("penguins", "(no reason given)"), {}), (("iris", "bad week"), {})]
    assert capsys.readouterr() == (
        "penguins: champion is now version 4 (was 2)\n"
        "iris: champion is now version 4 (was 2)\n"
        "penguins: champion is now version 2 (was None)\n"
        "iris: champion is now version 2 (was None)\n",
        "",
    )
    assert [project.root] * 4 == CONFIGURED


def version(number: int, **more: Any) -> dict[str, Any]:
    return {"version": number, "aliases": [], "metrics": {}, "data_hash": "", "run_id": "", "champion_change": "",
            **more}  # fmt: skip


def test_models_list_prints_the_table_of_the_named_model_s_versions(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked: list[Any] = []
    versions = [
        version(
            12,
            aliases=["champion", "challenger"],
            metrics={"accuracy": 0.91234, "n_test": 40.0},
            data_hash="0123456789abcdef.dir",
            run_id="fedcba9876543210",
            champion_change="2026-11-01 promoted",
            target="species",
            task="classification",
        ),
        version(3, metrics={"accuracy": 1.0, "n_test": 7.5}, run_id="r1"),
    ]
    monkeypatch.setattr(registry, "list_versions", recorder(asked, versions))
    assert cli.main(["models", "list"]) == 0
    assert asked == [(("penguins",), {})]
    assert capsys.readouterr().out == (
        "penguins: 2 versions\n"
        "version  aliases              accuracy  n_test  target   task            data_hash     run           "
        "became champion\n"
        "12       champion,challenger  0.9123    40      species  classification  0123456789ab  fedcba987654  "
        "2026-11-01 promoted\n"
        "3        -                    1.0000    7.5000  -        -               -             r1            -\n"
    )


def test_a_one_version_table_says_version_and_a_missing_metric_is_a_dash() -> None:
    table = cli.models_table("m", [version(1, metrics={"r2": 0.5}), version(2, metrics={"n_rows": 3.0})][:1])
    assert table == (
        "m: 1 version\n"
        "version  aliases  r2      target  task  data_hash  run  became champion\n"
        "1        -        0.5000  -       -     -               -"
    )
    two = cli.models_table("m", [version(1, metrics={"r2": 0.5}), version(2, metrics={"n_rows": 3.0})])
    assert two.splitlines()[2:] == [
        "1        -        -       0.5000  -       -     -               -",
        "2        -        3       -       -       -     -               -",
    ]


@pytest.mark.parametrize(
    ("name", "value", "cell"),
    [("n_test", 41.0, "41"), ("n_test", 2.5, "2.5000"), ("accuracy", 3.0, "3.0000"), ("xn_test", 4.0, "4.0000")],
)
def test_a_whole_count_shows_as_an_integer_anything_else_to_four_decimals(name: str, value: float, cell: str) -> None:
    assert cli.metric_cell(name, value) == cell


def card_download(files: dict[str, str] | None, seen: list[Any]) -> Any:
    def download(**kwargs: Any) -> str:
        seen.append({k: v for k, v in kwargs.items() if k != "dst_path"})
        if files is None:
            from mlflow.exceptions import MlflowException

            raise MlflowException("no such artifact")
        folder = Path(kwargs["dst_path"]) / "card"
        folder.mkdir()
        for name, text in files.items():
            (folder / name).write_text(text)
        return str(folder)

    return download


def test_models_show_prints_the_version_s_card_and_copies_its_html_page(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import mlflow.artifacts

    from trainflow.registry import verify

    seen: list[Any] = []
    looked: list[Any] = []
    monkeypatch.setattr(verify, "version_of", recorder(looked, types.SimpleNamespace(run_id="run9", version="9")))
    card = {"card.md": "# m v9\n", "card.html": "<p>m</p>"}
    monkeypatch.setattr(mlflow.artifacts, "download_artifacts", card_download(card, seen))
    assert cli.main(["models", "show", "m@champion"]) == 0
    assert capsys.readouterr() == ("# m v9\n\n", "")
    html = tmp_path / "card.html"
    assert cli.main(["models", "show", "m/9", "--html", str(html)]) == 0
    assert capsys.readouterr() == ("# m v9\n\n", f"models show: the HTML card is in {html}\n")
    assert html.read_text() == "<p>m</p>"
    assert looked == [(("m@champion",), {}), (("m/9",), {})]
    assert seen == [{"run_id": "run9", "artifact_path": "card"}] * 2
    assert [project.root] * 2 == CONFIGURED


@pytest.mark.parametrize("files", [None, {"other.md": "x"}])
def test_models_show_of_a_version_without_a_card_says_how_one_is_written(
    files: dict[str, str] | None, project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import mlflow.artifacts

    from trainflow.registry import verify

    monkeypatch.setattr(verify, "version_of", lambda model: types.SimpleNamespace(run_id="r", version="3"))
    monkeypatch.setattr(mlflow.artifacts, "download_artifacts", card_download(files, []))
    assert cli.main(["models", "show", "m/3"]) == 2
    assert capsys.readouterr() == (
        "",
        "error: m/3: version 3 has no model card (registered before cards); `trainflow stage register` writes one "
        "for the run it registers\n",
    )


# --- verify -----------------------------------------------------------------------------------------------------------

RESULT = {
    "model": "m/3",
    "git_commit": "0123456789abcdef0123",
    "data_hash": "d41d8.dir",
    "model_sha256": "aaaaaaaaaaaaaaaabbbb",
    "retrained_sha256": "ccccccccccccccccdddd",
    "metrics_differ": [],
    "environment_differs": None,
}


@pytest.mark.parametrize(("args", "commit"), [([], None), (["--commit", "HEAD"], "HEAD")])
def test_verify_says_a_version_reproduces_on_stdout(
    args: list[str],
    commit: str | None,
    project: Paths,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from trainflow.registry import verify

    calls: list[Any] = []
    monkeypatch.setattr(verify, "verify", recorder(calls, {**RESULT, "verified": True}))
    assert cli.main(["verify", "m/3", *args]) == 0
    assert calls == [(("m/3", project.root, commit), {})] and [project.root] == CONFIGURED
    assert capsys.readouterr() == (
        "verify: m/3 (commit 0123456789ab, data d41d8.dir) reproduces: the retrained model is byte for byte the "
        "registered one (sha256 aaaaaaaaaaaaaaaa)\n",
        "",
    )


DID_NOT = (
    "error: verify: m/3 (commit 0123456789ab, data d41d8.dir) did not reproduce: the retrained model's sha256 is "
    "cccccccccccccccc, the registered one's aaaaaaaaaaaaaaaa{said}. The data, code and params were checked before "
    "retraining and are the ones it was trained with; "
)


@pytest.mark.parametrize(
    ("differ", "env", "why"),
    [
        (
            [],
            None,
            "the environment it was trained in was not recorded (an older trainflow), so what differed is the training "
            "itself: another device or precision (bit-exact on a CPU, or on one GPU with train.deterministic), or "
            "other library versions",
        ),
        (
            ["accuracy", "f1"],
            ["env.numpy: 1.0 when trained, 2.0 here", "env.torch: 2.12.0 when trained, 2.13.0 here"],
            "the environment differs from the one it was trained in: env.numpy: 1.0 when trained, 2.0 here; env.torch: "
            "2.12.0 when trained, 2.13.0 here. Training is bit-exact in one environment: verify it where it was "
            "trained, or retrain and register it here",
        ),
        (
            [],
            [],
            "so is the environment recorded with it, so the training itself was not deterministic: bit-exact on a CPU, "
            "and on one GPU with train.deterministic",
        ),
    ],
    ids=["no-environment-recorded", "another-environment", "the-same-environment"],
)
def test_verify_says_a_version_did_not_reproduce_and_names_the_environment_on_stderr_exit_1(
    differ: list[str],
    env: list[str] | None,
    why: str,
    project: Paths,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from trainflow.registry import verify

    result = {**RESULT, "verified": False, "metrics_differ": differ, "environment_differs": env}
    monkeypatch.setattr(verify, "verify", lambda model, root, commit: result)
    assert cli.main(["verify", "m/3"]) == 1
    said = "; test metrics differ: accuracy, f1" if differ else ""
    assert capsys.readouterr() == ("", DID_NOT.format(said=said) + why + "\n")


# --- data -------------------------------------------------------------------------------------------------------------


def test_data_add_passes_the_files_and_says_what_each_became(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[Any] = []
    result = [
        arrival.Added("data/raw/s/feb.csv", "0123456789abcdef" + "f" * 48, 30, new=True, event=True),
        arrival.Added("data/raw/s/mar.csv", "fedcba9876543210" + "0" * 48, 5, new=True, event=False),
        arrival.Added("data/raw/s/jan.csv", "1" * 64, 0, new=False),
    ]
    monkeypatch.setattr(arrival, "add", recorder(calls, result))
    assert cli.main(["data", "add", "feb.csv", "mar.csv", "jan2.csv"]) == 0
    assert cli.main(["data", "add", "--no-event", "x.csv"]) == 0
    assert calls == [
        ((Paths(project.root), [Path("feb.csv"), Path("mar.csv"), Path("jan2.csv")]), {"emit": True}),
        ((Paths(project.root), [Path("x.csv")]), {"emit": False}),
    ]
    lines = (
        "data add: added data/raw/s/feb.csv (30 rows, sha256 0123456789abcdef); event trainflow.data.added sent\n"
        "data add: added data/raw/s/mar.csv (5 rows, sha256 fedcba9876543210)\n"
        "data add: byte-identical to data/raw/s/jan.csv, already in data.source: nothing added, no retrain\n"
    )
    assert capsys.readouterr() == (lines * 2, "")


def test_data_watch_passes_the_inbox_interval_and_once_and_a_ctrl_c_stops_it_with_130(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(arrival, "watch", recorder(calls, 2))
    assert cli.main(["data", "watch", "inbox"]) == 0
    assert cli.main(["data", "watch", "in2", "--interval", "0.5", "--once"]) == 0
    assert calls == [
        ((Paths(project.root), Path("inbox"), 5.0, False), {}),
        ((Paths(project.root), Path("in2"), 0.5, True), {}),
    ]
    assert capsys.readouterr() == ("", "")
    monkeypatch.setattr(arrival, "watch", recorder([], KeyboardInterrupt()))
    assert cli.main(["data", "watch", "inbox"]) == 130
    assert capsys.readouterr() == ("", "trainflow data watch: stopped\n")


# --- deploy and tune --------------------------------------------------------------------------------------------------


def fake_module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: Any) -> None:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)


def test_deploy_serves_with_the_cron_name_and_timezone_given_none_by_default(
    project: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Any] = []
    fake_module(monkeypatch, "flows.deploy", serve=recorder(calls, 0))
    assert cli.main(["deploy"]) == 0
    fake_module(monkeypatch, "flows.deploy", serve=recorder(calls, 3))
    assert cli.main(["deploy", "--cron", "0 4 * * *", "--name", "n", "--timezone", "Europe/Oslo"]) == 3
    assert calls == [
        ((Paths(project.root),), {"cron": None, "name": None, "timezone": None}),
        ((Paths(project.root),), {"cron": "0 4 * * *", "name": "n", "timezone": "Europe/Oslo"}),
    ]


def test_tune_prepares_the_data_then_runs_the_study_with_the_options_given(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainflow import tune

    checked: list[Any] = []
    prepared: list[Any] = []
    ran: list[Any] = []
    monkeypatch.setattr(tune, "check_overrides", recorder(checked))
    monkeypatch.setattr(cli, "prepare_data", recorder(prepared))
    monkeypatch.setattr(tune, "run", recorder(ran, {"best": Path("a/b"), "n": 2}))
    assert cli.main(["tune"]) == 0
    assert cli.main(["tune", "-S", "train.lr=0.5", "--trials", "3", "--workers", "2", "--apply"]) == 0
    assert checked == [(([],), {}), ((["train.lr=0.5"],), {})]
    assert prepared == [((Paths(project.root),), {})] * 2
    [(args0, kw0), (args1, kw1)] = ran
    assert kw0 == {"trials": None, "workers": None, "apply": False, "overrides": []} and args0[1] == Paths(project.root)
    assert kw1 == {"trials": 3, "workers": 2, "apply": True, "overrides": ["train.lr=0.5"]}
    assert args0[0].train.lr != 0.5 and args1[0].train.lr == 0.5  # the -S applies to the sweep
    assert args0[0].register.model_name == "penguins"
    assert capsys.readouterr() == ('{\n  "best": "a/b",\n  "n": 2\n}\n' * 2, "")


def test_tune_on_a_deployment_hands_every_option_to_the_sweep_flow(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainflow import tune

    swept: list[Any] = []
    monkeypatch.setattr(tune, "check_overrides", lambda overrides: None)
    monkeypatch.setattr(cli, "prepare_data", recorder([], AssertionError("prepared data for a deployment")))
    fake_module(monkeypatch, "flows.sweep", sweep=recorder(swept, {"study": "s"}))
    assert cli.main(["tune", "--deployment", "tune_worker/tw", "-S", "seed=3", "--trials", "4"]) == 0
    assert swept == [
        (
            (),
            {
                "root": str(project.root),
                "overrides": ["seed=3"],
                "trials": 4,
                "workers": None,
                "deployment": "tune_worker/tw",
                "apply": False,
            },
        ),  # fmt: skip
    ]
    assert capsys.readouterr() == ('{\n  "study": "s"\n}\n', "")


@pytest.mark.parametrize(("argv", "said"), [(["--trials", "0"], "--trials must be at least 1, not 0"),
                                            (["--workers", "-1"], "--workers must be at least 1, not -1")])  # fmt: skip
def test_tune_refuses_fewer_than_one_trial_or_worker(
    argv: list[str], said: str, project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainflow import tune

    monkeypatch.setattr(tune, "run", recorder([], AssertionError("ran")))
    assert cli.main(["tune", *argv]) == 2
    assert capsys.readouterr() == ("", f"error: {said}\n")


def test_prepare_data_runs_and_commits_only_the_changed_data_stages(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tasks import dvc

    ran: list[Any] = []
    committed: list[Any] = []
    cli.prepare_data(project)  # not a DVC project: nothing to do
    (project.root / ".dvc").mkdir()
    monkeypatch.setattr(dvc, "changed", lambda root, stage: stage == "split")
    monkeypatch.setattr(dvc, "commit", recorder(committed))
    monkeypatch.setattr(stages, "run_stage", lambda stage, params, paths: ran.append((stage, paths)))
    cli.prepare_data(project)
    assert ran == [("split", project)] and committed == [((project.root, "split"), {})]
    assert capsys.readouterr() == ("", "[trainflow] split: running\n")


# --- stage, and what every command does on the way out ----------------------------------------------------------------


def test_stage_runs_the_named_stage_and_prints_its_result_under_its_name(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--accept-schema reaches ingest as accept_schema=True; without it no option is passed. Under torchrun only
    rank 0 prints."""
    calls: list[Any] = []
    monkeypatch.setattr(stages, "run_stage", recorder(calls, {"rows": 5, "at": Path("x")}))
    monkeypatch.delenv("RANK", raising=False)
    assert cli.main(["stage", "split"]) == 0
    assert cli.main(["stage", "ingest", "--accept-schema"]) == 0
    monkeypatch.setenv("RANK", "1")
    assert cli.main(["stage", "train"]) == 0
    assert [(args[0], args[2], kwargs) for args, kwargs in calls] == [
        ("split", Paths(project.root), {}),
        ("ingest", Paths(project.root), {"accept_schema": True}),
        ("train", Paths(project.root), {}),
    ]
    assert calls[0][0][1].register.model_name == "penguins"
    body = '  "rows": 5,\n    "at": "x"\n  }\n}\n'
    assert capsys.readouterr() == ('{\n  "split": {\n  ' + body + '{\n  "ingest": {\n  ' + body, "")


def test_accept_schema_on_another_stage_is_refused(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(stages, "run_stage", recorder([], AssertionError("ran")))
    assert cli.main(["stage", "train", "--accept-schema"]) == 2
    assert capsys.readouterr() == ("", "error: --accept-schema applies to `trainflow stage ingest` only\n")


def test_a_stage_that_fails_on_the_s_params_puts_params_yaml_back_and_says_what_ran_with_them(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The stage records itself in dvc.lock (as `dvc repro` would) and then fails: params.yaml is restored, the
    error comes after the line saying so, then the advice naming the stage that ran with the -S params."""
    before = project.params.read_bytes()

    def fails(stage: str, params: Any, paths: Paths) -> None:
        assert params.train.lr == 0.25  # the stage ran with the override
        (paths.root / "dvc.lock").write_text("stages:\n  train:\n    outs:\n    - path: models/final\n")
        raise UserError("train: bad data")

    monkeypatch.setattr(stages, "run_stage", fails)
    assert cli.main(["stage", "train", "-S", "train.lr=0.25"]) == 2
    assert project.params.read_bytes() == before
    assert capsys.readouterr() == (
        "",
        f"{project.params}: put back as it was before -S (the command failed on them)\n"
        "error: train: bad data\n"
        "Before the failure, train ran with the -S params and DVC recorded them: models/final now come from those "
        "params, while those of evaluate and register are still from the params before: they do not fit together "
        "(e.g. new splits beside the old model, which `trainflow stage evaluate` can fail on). To rebuild every "
        "output from params.yaml as it is now, run `trainflow run` (or `dvc repro`): it reruns train and whatever "
        "depends on them. To keep the -S params instead, fix what failed, then run `trainflow run -S train.lr=0.25`.\n",
    )


def test_a_stage_that_fails_without_s_params_leaves_params_yaml_and_prints_only_the_error(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(stages, "run_stage", recorder([], UserError("split: no rows")))
    assert cli.main(["stage", "split"]) == 2
    assert capsys.readouterr() == ("", "error: split: no rows\n")


@pytest.mark.parametrize(
    ("raised", "code", "err"),
    [
        (Preempted("train: SIGTERM at step 7"), 75, "preempted: train: SIGTERM at step 7\n"),
        (UserError("data.source: no such file"), 2, "error: data.source: no such file\n"),
        (ServiceError("MLflow did not answer"), 1, "error: MLflow did not answer\n"),
        (KeyboardInterrupt(), 130, "interrupted; finished outputs are intact, rerun to continue\n"),
    ],
)
def test_each_kind_of_failure_has_its_line_and_exit_code(
    raised: BaseException, code: int, err: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_dispatch", recorder([], raised))
    assert cli.main(["run"]) == code
    assert capsys.readouterr() == ("", err)


def test_an_error_s_notes_follow_it_and_anything_unexpected_shows_its_traceback_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    error = UserError("first")
    error.add_note("then this")
    error.add_note("and this")
    monkeypatch.setattr(cli, "_dispatch", recorder([], error))
    assert cli.main(["run"]) == 2
    assert capsys.readouterr() == ("", "error: first\nthen this\nand this\n")
    monkeypatch.setattr(cli, "_dispatch", recorder([], RuntimeError("kaboom")))
    assert cli.main(["run"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("Traceback (most recent call last):\n")
    assert err.endswith("RuntimeError: kaboom\n")


def test_the_quiet_service_defaults_are_set_unless_the_environment_sets_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key in cli.ENV_DEFAULTS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("PREFECT_LOGGING_LEVEL", "DEBUG")
    monkeypatch.setattr(cli, "_dispatch", lambda args: 0)
    assert cli.main(["run"]) == 0
    assert {k: os.environ[k] for k in cli.ENV_DEFAULTS} == {
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
        "PREFECT_LOGGING_LEVEL": "DEBUG",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "DO_NOT_TRACK": "1",
    }


# --- params -----------------------------------------------------------------------------------------------------------


def test_params_check_and_schema_say_what_they_checked(project: Paths, capsys: pytest.CaptureFixture[str]) -> None:
    from trainflow.params import schema

    assert cli.main(["params", "check"]) == 0
    out, err = capsys.readouterr()
    assert err == f"{project.params}: ok\n" and json.loads(out)["register"]["model_name"] == "penguins"
    assert cli.main(["params", "check", "-S", "seed=5"]) == 0
    out, err = capsys.readouterr()
    assert err == f"{project.params}: ok with the -S overrides\n" and json.loads(out)["seed"] == 5
    assert cli.main(["params", "schema"]) == 0
    assert capsys.readouterr() == (json.dumps(schema(), indent=2) + "\n", "")
    assert cli.main(["params", "schema", "-S", "seed=-x"]) == 2  # the overrides are validated even here
    assert capsys.readouterr().out == ""


# --- run --------------------------------------------------------------------------------------------------------------


def test_advice_names_each_stage_that_ran_and_what_came_of_it() -> None:
    before = {"ingest": {"outs": [{"path": "a"}]}, "split": {"outs": [{"path": "b"}]}}
    after = {
        "ingest": {"outs": [{"path": "a2"}, {"md5": "no path"}]},
        "split": {"outs": [{"path": "b2"}, {"path": "c2"}]},
        "train": "not a record",
        "evaluate": {"outs": [{"path": "r/m.json"}]},
        "register": {"outs": [{"path": "r/reg.json"}]},
        "elsewhere": {"outs": [{"path": "z"}]},
    }
    assert cli.rebuild_advice(["seed=1", "data.exclude=[a, b]"], before, after) == (
        "Before the failure, ingest, split, train, evaluate and register ran with the -S params and DVC recorded "
        "them: a2, b2, c2, r/m.json, r/reg.json now come from those params, not from params.yaml as it is now. To "
        "rebuild every output from params.yaml as it is now, run `trainflow run` (or `dvc repro`): it reruns ingest, "
        "split, train, evaluate and register and whatever depends on them. To keep the -S params instead, fix what "
        "failed, then run `trainflow run -S seed=1 -S 'data.exclude=[a, b]'`."
    )
    assert cli.rebuild_advice([], {"train": "x"}, {"train": "y"}) == (
        "Before the failure, train ran with the -S params and DVC recorded them: their outputs now come from those "
        "params, while those of evaluate and register are still from the params before: they do not fit together "
        "(e.g. new splits beside the old model, which `trainflow stage evaluate` can fail on). To rebuild every "
        "output from params.yaml as it is now, run `trainflow run` (or `dvc repro`): it reruns train and whatever "
        "depends on them. To keep the -S params instead, fix what failed, then run `trainflow run `."
    )
    assert cli.rebuild_advice(["x=1"], {"elsewhere": 1}, {"elsewhere": 2}) is None


@pytest.mark.parametrize(
    ("text", "stages_"),
    [
        (None, {}),
        ("stages: [1, 2]\n", {}),
        ("[1, 2]\n", {}),
        ("stages: {a: [", {}),
        ("schema: '2.0'\nstages:\n  train:\n    cmd: t\n", {"train": {"cmd": "t"}}),
    ],
)
def test_locked_stages_is_dvc_lock_s_stages_or_nothing(
    text: str | None, stages_: dict[str, Any], tmp_path: Path
) -> None:
    if text is not None:
        (tmp_path / "dvc.lock").write_text(text)
    assert cli.locked_stages(tmp_path) == stages_


def test_prefect_api_url_comes_from_the_environment_first_and_none_without_a_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREFECT_API_URL", "http://env:4200/api")
    assert cli.prefect_api_url() == "http://env:4200/api"
    monkeypatch.delenv("PREFECT_API_URL")
    monkeypatch.delenv("PREFECT_PROFILE", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    assert cli.prefect_api_url() is None  # no profiles.toml
    (tmp_path / "profiles.toml").write_text("not = [toml")
    assert cli.prefect_api_url() is None
    (tmp_path / "profiles.toml").write_text('active = "local"\n[profiles.local]\nPREFECT_LOGGING_LEVEL = "INFO"\n')
    assert cli.prefect_api_url() is None  # a profile without a server


def push_setup(monkeypatch: pytest.MonkeyPatch, remote: str | None, pushed: Any) -> list[Any]:
    from tasks import dvc

    calls: list[Any] = []
    monkeypatch.setattr(dvc, "default_remote", lambda root: remote)
    monkeypatch.setattr(dvc, "push", recorder(calls, pushed))
    return calls


def test_push_unchanged_pushes_to_the_default_remote_and_says_how_many_files_went(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = push_setup(monkeypatch, "store", 4)
    cli.push_unchanged(project)
    assert calls == [((project.root, "store"), {})]
    assert capsys.readouterr() == ("[trainflow] push: 4 file(s) sent to DVC remote 'store'\n", "")
    calls = push_setup(monkeypatch, None, 4)
    cli.push_unchanged(project)  # no remote: nothing to push
    write_overrides(project.params, ["deploy.push=false"])
    calls += push_setup(monkeypatch, "store", 4)
    cli.push_unchanged(project)  # deploy.push off
    assert calls == [] and capsys.readouterr() == ("", "")


def test_a_failed_push_names_the_remote_and_the_failure_and_a_full_remote_speaks_for_itself(
    project: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    push_setup(monkeypatch, "store", OSError("connection refused"))
    with pytest.raises(ServiceError) as err:
        cli.push_unchanged(project)
    assert str(err.value) == (
        "push to DVC remote 'store' failed (OSError: connection refused); the outputs are intact here: rerun "
        "`trainflow run` (or `dvc push`) once the remote answers"
    )
    full = UserError("the remote is full")
    push_setup(monkeypatch, "store", full)
    with pytest.raises(UserError) as raised:
        cli.push_unchanged(project)
    assert raised.value is full


# --- predict_file: what `trainflow predict` prints is its result ------------------------------------------------------


class Scorer:
    """An exported tabular model that predicts "p<row>" and records how it was asked."""

    def __init__(self) -> None:
        self.pre = types.SimpleNamespace(image_column=None, target="label", task="classification", width=2, columns=[])
        self.asked: list[Any] = []

    def predict_frame(self, frame: Any, batch_size: int, **where: Any) -> Any:
        self.asked.append((list(frame.columns), batch_size, where))
        return frame.assign(prediction=[f"p{i}" for i in range(len(frame))])


def test_predict_file_writes_the_rows_with_their_predictions_and_says_what_it_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scorer = Scorer()
    monkeypatch.setattr(batch_predict, "load", lambda model: scorer)
    source = tmp_path / "in.csv"
    source.write_text("x1,x2\n1,2\n3,4\n5,6\n")
    out = tmp_path / "out.tsv"
    assert batch_predict.predict_file("models:/m/1", source, out, 7) == {
        "model": "models:/m/1",
        "input": str(source),
        "output": str(out),
        "rows": 3,
        "task": "classification",
    }
    assert out.read_text() == "x1\tx2\tprediction\n1\t2\tp0\n3\t4\tp1\n5\t6\tp2\n"
    assert scorer.asked == [(["x1", "x2"], 7, {"where": str(source), "base": tmp_path.resolve()})]


def test_a_parquet_input_over_the_budget_is_streamed_and_says_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pandas as pd

    scorer = Scorer()
    monkeypatch.setattr(batch_predict, "load", lambda model: scorer)
    source = tmp_path / "in.parquet"
    pd.DataFrame({"x1": [1, 3], "x2": [2, 4]}).to_parquet(source, index=False)
    out = tmp_path / "out.jsonl"
    assert batch_predict.predict_file("m", source, out, 5, memory_budget_mb=1e-9) == {
        "model": "m",
        "input": str(source),
        "output": str(out),
        "rows": 2,
        "task": "classification",
    }
    assert out.read_text() == '{"x1": 1, "x2": 2, "prediction": "p0"}\n{"x1": 3, "x2": 4, "prediction": "p1"}\n'
    assert scorer.asked == [(["x1", "x2"], 5, {"where": str(source), "base": None})]
    err = capsys.readouterr().err
    assert err.startswith(f"predict: {source} is 0.0 MiB once read, over the 0 MiB budget: streamed a block at a time")


# --- arrival: the event a new file sends, and a failed `dvc add` ------------------------------------------------------


def test_each_new_file_sends_one_event_about_the_deployment_with_what_was_added(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import prefect.settings

    sent: list[Any] = []

    async def send(events: list[Any]) -> None:
        sent.extend(events)

    monkeypatch.setattr(prefect.settings, "get_current_settings", lambda: types.SimpleNamespace(
        api=types.SimpleNamespace(url="http://prefect:4200/api")))  # fmt: skip
    monkeypatch.setattr(arrival, "_send", send)
    added = [arrival.Added("data/raw/s/a.csv", "a" * 64, 3, new=True), arrival.Added("data/raw/s/b.csv", "b", 1, True)]
    assert arrival.emit_events("nightly", Paths(tmp_path), added) is True
    assert [(e.event, dict(e.resource.root), e.payload) for e in sent] == [
        (
            "trainflow.data.added",
            {"prefect.resource.id": "trainflow.project.nightly", "prefect.resource.name": str(tmp_path)},
            {"file": "data/raw/s/a.csv", "sha256": "a" * 64, "rows": 3},
        ),
        (
            "trainflow.data.added",
            {"prefect.resource.id": "trainflow.project.nightly", "prefect.resource.name": str(tmp_path)},
            {"file": "data/raw/s/b.csv", "sha256": "b", "rows": 1},
        ),
    ]


def test_without_a_prefect_server_no_event_is_sent_and_the_line_says_how_to_retrain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import prefect.settings

    monkeypatch.setattr(prefect.settings, "get_current_settings", lambda: types.SimpleNamespace(
        api=types.SimpleNamespace(url=None)))  # fmt: skip
    assert arrival.emit_events("n", Paths(tmp_path), [arrival.Added("f", "s", 1, True)]) is False
    assert capsys.readouterr() == (
        "",
        "trainflow data add: PREFECT_API_URL is not set, so no deployment hears of it; run `trainflow run` to "
        "retrain now\n",
    )


def test_a_server_that_refuses_the_event_is_a_service_error_saying_the_files_are_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import prefect.settings

    async def refuse(events: list[Any]) -> None:
        raise ConnectionError("refused")

    monkeypatch.setattr(prefect.settings, "get_current_settings", lambda: types.SimpleNamespace(
        api=types.SimpleNamespace(url="http://p/api")))  # fmt: skip
    monkeypatch.setattr(arrival, "_send", refuse)
    with pytest.raises(ServiceError) as err:
        arrival.emit_events("n", Paths(tmp_path), [arrival.Added("f", "s", 1, True)])
    assert str(err.value) == (
        "the files are in place, but the Prefect server at http://p/api did not take the trainflow.data.added event "
        "(refused); run `trainflow run` to retrain, or rerun nothing and let the cron pick the files up"
    )


@pytest.mark.parametrize(
    ("stdout", "stderr", "said"),
    [
        ("", "  ERROR: not a git repo \n", "ERROR: not a git repo"),
        ("output only\n", "", "output only"),
        ("", "", "exit code 3, no output"),
    ],
)
def test_a_failed_dvc_add_shows_its_stderr_else_its_stdout_else_its_exit_code(
    stdout: str, stderr: str, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    ran: list[Any] = []

    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        ran.append((cmd, kwargs))
        return subprocess.CompletedProcess(cmd, 3, stdout, stderr)

    monkeypatch.setattr(arrival.subprocess, "run", run)
    (tmp_path / ".dvc").mkdir()
    with pytest.raises(UserError) as err:
        arrival._dvc_add(Paths(tmp_path), tmp_path / "data/raw/s/new.csv")
    assert str(err.value) == (
        "trainflow data add: data/raw/s/new.csv is in place but `dvc add data/raw/s/new.csv` failed: "
        f"{said}; fix that and run it yourself"
    )
    assert ran == [
        (
            [sys.executable, "-m", "dvc", "add", "--quiet", "data/raw/s/new.csv"],
            {"cwd": tmp_path, "capture_output": True, "text": True},
        )
    ]


# --- lineage and the model names verify and `models show` take --------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "named"),
    [
        ("m@champion", ("m", "champion")),
        ("models:/m@challenger", ("m", "challenger")),
        ("models:/team/m/3", ("team/m", "3")),
        ("m/12", ("m", "12")),
        ("a@b/c", ("a", "b/c")),
    ],
)
def test_a_model_reference_is_its_name_and_its_alias_or_version(model: str, named: tuple[str, str]) -> None:
    from trainflow.registry.verify import resolve

    assert resolve(model) == named


@pytest.mark.parametrize("model", ["m", "models:/m", "@champion", "m@", "/3", "m/"])
def test_a_reference_without_a_version_says_how_to_name_one(model: str) -> None:
    from trainflow.registry.verify import resolve

    with pytest.raises(UserError) as err:
        resolve(model)
    assert str(err.value) == f"verify {model}: name a version, as NAME@champion, NAME@challenger or NAME/3"


def test_the_commit_is_dirty_when_a_tracked_file_other_than_dvc_lock_differs(tmp_path: Path) -> None:
    import subprocess

    from trainflow.registry.lineage import git_commit

    assert git_commit(tmp_path) == ("unknown", False)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    (tmp_path / "params.yaml").write_text("seed: 1\n")
    (tmp_path / "dvc.lock").write_text("{}\n")
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", "-A"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=tmp_path, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    (tmp_path / "untracked.txt").write_text("x")
    (tmp_path / "dvc.lock").write_text("stages: {}\n")
    assert git_commit(tmp_path) == (head, False)
    (tmp_path / "params.yaml").write_text("seed: 2\n")
    assert git_commit(tmp_path) == (head, True)


# --- run: the flow, and a run with nothing to do ----------------------------------------------------------------------


class FlowState:
    def __init__(self, name: str, message: str | None = None, results: dict[str, Any] | None = None) -> None:
        self.name, self.message, self.results = name, message, results

    def result(self) -> dict[str, Any] | None:
        return self.results


def run_setup(monkeypatch: pytest.MonkeyPatch, state: FlowState) -> tuple[list[Any], list[Any]]:
    from trainflow.stages import report

    flows: list[Any] = []
    summaries: list[Any] = []
    fake_module(monkeypatch, "flows.training_pipeline", training_pipeline=recorder(flows, state))
    monkeypatch.setattr(report, "summary", recorder(summaries, "the summary"))
    monkeypatch.setenv("PREFECT_API_URL", "http://prefect:4200/api")  # a server: no local one, no DVC check first
    return flows, summaries


def test_run_hands_the_root_to_the_flow_and_prints_the_summary_of_its_results(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    flows, summaries = run_setup(monkeypatch, FlowState("Completed", results={"train": {"epochs": 2}}))
    assert cli.main(["run"]) == 0
    assert flows == [((), {"root": str(project.root), "caller_reports_errors": True, "return_state": True})]
    assert summaries == [((Paths(project.root), {"train": {"epochs": 2}}), {})]
    assert capsys.readouterr() == ("the summary\n", "")


@pytest.mark.parametrize(("message", "said"), [("SIGTERM at step 3", "SIGTERM at step 3"), (None, "train: preempted")])
def test_a_preempted_flow_exits_75_saying_so(
    message: str | None,
    said: str,
    project: Paths,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, summaries = run_setup(monkeypatch, FlowState("Preempted", message))
    assert cli.main(["run"]) == 75
    assert summaries == [] and capsys.readouterr() == ("", f"preempted: {said}\n")


def test_a_run_with_nothing_to_do_pushes_and_summarises_every_stage_as_skipped(
    project: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tasks import dvc

    flows, summaries = run_setup(monkeypatch, FlowState("Completed"))
    monkeypatch.delenv("PREFECT_API_URL")
    monkeypatch.setenv("PREFECT_HOME", str(project.root / "no-prefect"))
    monkeypatch.setattr(dvc, "changed_stages", lambda root: [])
    pushed = push_setup(monkeypatch, "store", 0)
    assert cli.main(["run"]) == 0
    skipped = {"skipped": True}
    assert summaries == [
        (
            (Paths(project.root), {"ingest": skipped, "split": skipped, "train": skipped, "evaluate": skipped,
                                   "register": skipped}),
            {},
        )
    ]  # fmt: skip
    assert flows == [] and pushed == [((project.root, "store"), {})]
    assert capsys.readouterr() == ("[trainflow] push: 0 file(s) sent to DVC remote 'store'\nthe summary\n", "")
