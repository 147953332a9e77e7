"""What users can type, as `--help` shows it: each command's help pinned exactly (the frozen CLI surface), what the
help says -S does and what comes out, each `models` action with what it does, the usage error of no command, and
`--version`."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from trainflow import cli

REPO = Path(__file__).resolve().parents[2]


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


@pytest.mark.parametrize("command", ["run", "stage"])
def test_help_says_what_s_does_and_what_comes_out(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "written into params.yaml" in text and "params.yaml is put back as it was" in text
    assert "models/final/" in text and "reports/metrics.json" in text


def test_models_help_lists_each_action_with_what_it_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["models", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for line in (
        "list every version, newest first",
        "promote make VERSION the champion",
        "rollback champion back to the previous champion",
        "show print the model card of a version (NAME@ALIAS or NAME/VERSION)",
    ):
        assert line in text


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """`trainflow` alone: argparse's usage error (exit 2) naming the missing command, not a run of nothing."""
    with pytest.raises(SystemExit) as exit_:
        cli.main([])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "usage: trainflow" in err and "the following arguments are required: command" in err


def test_version_is_the_package_s(capsys: pytest.CaptureFixture[str]) -> None:
    expected = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"trainflow {expected}\n"
