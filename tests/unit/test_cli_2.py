"""The command line as a shell user meets it (issue 30): a reader that stops early ends it quietly, `--version`,
`params check` prints JSON, `models list` prints counts as integers and what each version predicts, the run summary
says which model to load and which features the -S overrides left, and progress suits where stderr goes."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainflow import cli
from trainflow.core.io import write_json
from trainflow.core.paths import Paths
from trainflow.core.progress import PlainProgress, progress
from trainflow.data.schema import Schema
from trainflow.stages import report

REPO = Path(__file__).resolve().parents[2]


# --- (a) a closed pipe ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["params", "schema"], ["params", "check"]])
def test_a_reader_that_stops_early_ends_the_command_quietly(params_file: Path, command: list[str]) -> None:
    """`trainflow ... | head -1`: head exits after its line and the pipe closes. Here the pipe is closed before the
    command writes anything, so every write fails, as the writes after head's first line do."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainflow", *command],
        cwd=params_file.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err  # 128 + SIGPIPE, as a shell reports a writer stopped by the pipe
    assert "BrokenPipeError" not in err and "Traceback" not in err, err  # was a traceback, exit 1


class ClosedPipe(io.StringIO):
    """stdout once its reader has gone: every write and flush fails as a write to a closed pipe does."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def test_models_list_into_a_closed_pipe_ends_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainflow import tracking
    from trainflow.registry import registry

    monkeypatch.setattr(tracking, "configure", lambda root: None)
    monkeypatch.setattr(registry, "list_versions", lambda name: [version(2), version(1)])
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert cli.main(["models", "list", "--name", "m"]) == 141  # was 1
    assert capsys.readouterr().err == ""  # was the BrokenPipeError traceback


class ClosedPipeOnFd(ClosedPipe):
    """A closed pipe with a descriptor, as the real sys.stdout has: here a pipe of the test's own, so that pytest's
    capture is never touched."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd

    def fileno(self) -> int:
        return self.fd


def test_a_closed_pipe_s_descriptor_is_pointed_at_dev_null_so_the_exit_flush_is_quiet(
    params_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What is still buffered is flushed again when the interpreter exits: into the closed pipe it would print
    "Exception ignored ... BrokenPipeError", so main() points the descriptor at /dev/null."""
    import os

    read_end, write_end = os.pipe()
    try:
        monkeypatch.chdir(params_file.parent)
        monkeypatch.setattr(sys, "stdout", ClosedPipeOnFd(write_end))
        assert cli.main(["params", "schema"]) == 141
        assert os.path.samestat(os.fstat(write_end), os.stat(os.devnull))  # no longer the pipe
        assert capsys.readouterr().err == ""
    finally:
        os.close(read_end)
        os.close(write_end)


# --- (b) --version ----------------------------------------------------------------------------------------------------


def test_version_is_the_package_s(capsys: pytest.CaptureFixture[str]) -> None:
    expected = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"trainflow {expected}\n"


# --- (c) params check prints JSON -------------------------------------------------------------------------------------


def test_params_check_prints_the_resolved_params_as_json_on_stdout(
    params_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    written = yaml.safe_load(params_file.read_text())
    monkeypatch.chdir(params_file.parent)
    assert cli.main(["params", "check"]) == 0
    out, err = capsys.readouterr()
    resolved = json.loads(out)  # stdout is JSON alone: was "params.yaml: ok" then (with -S only) the JSON
    assert resolved["train"]["lr"] == written["train"]["lr"] and resolved["seed"] == written["seed"]
    assert set(written) <= set(resolved)
    assert "params.yaml: ok" in err  # the human line goes to stderr
    assert cli.main(["params", "check", "-S", "train.lr=0.5", "-S", "data.exclude=[a, b]"]) == 0
    resolved = json.loads(capsys.readouterr().out)
    assert resolved["train"]["lr"] == 0.5 and resolved["data"]["exclude"] == ["a", "b"]
    assert cli.main(["params", "check", "-S", "train.lr=-1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "train.lr" in err  # invalid: nothing on stdout for a script to mistake for params


# --- (d) models list --------------------------------------------------------------------------------------------------


def version(number: int, **more: Any) -> dict[str, Any]:
    return {
        "version": number,
        "aliases": [],
        "metrics": {"accuracy": 0.951219, "n_test": 41.0},  # as the registry's tags give them back: floats
        "data_hash": "0123456789abcdef.dir",
        "run_id": "abcdef0123456789",
        "champion_change": "",
        **more,
    }


def test_models_list_shows_counts_as_integers_and_what_each_version_predicts() -> None:
    text = cli.models_table(
        "m",
        [
            version(2, aliases=["champion"], target="species", task="classification"),
            version(1, target="body_mass_g", task="regression", metrics={"r2": 1.0, "n_test": 40.0}),
            version(0),  # registered before target and task were tagged
        ],
    )
    header, *rows = [line.split() for line in text.splitlines()[1:]]
    cells = [dict(zip(header, row)) for row in rows]
    assert cells[0]["n_test"] == "41" and cells[0]["accuracy"] == "0.9512"  # was 41.0000
    assert cells[1]["n_test"] == "40" and cells[1]["r2"] == "1.0000"  # a metric that happens to be whole stays one
    assert (cells[0]["target"], cells[0]["task"]) == ("species", "classification")
    assert (cells[1]["target"], cells[1]["task"]) == ("body_mass_g", "regression")
    assert (cells[2]["target"], cells[2]["task"]) == ("-", "-")


# --- item 7 and (f): the run summary ----------------------------------------------------------------------------------


def registration(champion: bool) -> dict[str, Any]:
    return {
        "model_name": "penguins",
        "version": 3,
        "model_uri": "models:/penguins/3",
        "gate_metric": "accuracy",
        "value": 0.9,
        "previous_champion": 2,
        "previous_value": 0.95,
        "champion": champion,
        "champion_version": 3 if champion else 2,
        "decision": "...",
    }


@pytest.mark.parametrize(("champion", "uri"), [(True, "models:/penguins@champion"), (False, "models:/penguins/3")])
def test_load_it_loads_this_run_s_model(tmp_path: Path, champion: bool, uri: str) -> None:
    """A version that did not become champion is not what `@champion` loads: the line names the version."""
    paths = Paths(tmp_path)
    write_json(paths.registration, registration(champion))
    lines = report.summary(paths, {}).splitlines()
    assert f"  load it:  trainflow.serving.load('{uri}')" in lines
    md = report.registry_markdown(registration(champion))
    assert ("Load this run's version: `trainflow.serving.load('models:/penguins/3')`" in md) is not champion


def split_schema(paths: Paths, used: list[str], **data_params: Any) -> None:
    params = {"source": "data/raw/p.csv", "target": "species", "features": None, "exclude": [], **data_params}
    schema = Schema(
        source="data/raw/p.csv",
        target="species",
        task="classification",
        features=used,
        kinds=dict.fromkeys(used, "numeric"),  # type: ignore[arg-type]
        classes=["Adelie", "Gentoo"],
        n_rows=10,
        data_params=params,
    )
    write_json(paths.split_schema, schema.to_json())


def test_the_summary_shows_the_features_data_features_or_data_exclude_left(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    split_schema(paths, ["bill_length_mm", "flipper_length_mm"], exclude=["id", "island"])
    lines = report.summary(paths, {}).splitlines()
    assert "  features: 2 used: bill_length_mm, flipper_length_mm (data.exclude: [id, island])" in lines
    split_schema(paths, ["bill_length_mm"], features=["bill_length_mm"])
    assert "  features: 1 used: bill_length_mm (data.features: [bill_length_mm])" in report.summary(paths, {})
    many = [f"f{i}" for i in range(15)]
    split_schema(paths, many, exclude=["id"])
    assert "  features: 15 used: f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, ... (3 more)" in report.summary(
        paths, {}
    )
    split_schema(paths, many)  # every column: nothing chosen, nothing to say
    assert "features:" not in report.summary(paths, {})


# --- (e) progress that suits where stderr goes ------------------------------------------------------------------------


def test_plain_progress_is_a_line_every_tenth_of_the_way() -> None:
    out = io.StringIO()
    bar = PlainProgress(95, desc="train", unit="upd", stream=out)
    for n in range(1, 96):
        bar.update(1)
        if n == 50:
            bar.set_postfix(loss="0.4123", refresh=False)
    bar.close()
    lines = out.getvalue().splitlines()
    counts = [int(line.split()[1].split("/")[0]) for line in lines]
    assert counts == [10, 20, 30, 40, 50, 60, 70, 80, 90, 95]  # each tenth (of 95: steps of 10), then the end
    assert lines[0].startswith("train: 10/95 upd (11%)") and lines[-1].startswith("train: 95/95 upd (100%)")
    assert "loss=0.4123" in lines[5] and "loss" not in lines[4]
    resumed = io.StringIO()
    bar = PlainProgress(100, desc="train", unit="upd", initial=100, stream=resumed)
    bar.close()
    assert resumed.getvalue() == ""  # resumed at the end: nothing happened, nothing said


def test_training_into_a_log_writes_plain_lines_not_bars(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """stderr piped or in a file (here captured: not a terminal): no carriage-return redraws, at most 11 lines."""
    sys.path.insert(0, str(REPO / "tests" / "engine"))
    try:
        from engine_kit import make_trainer, mlp, table
    finally:
        sys.path.remove(str(REPO / "tests" / "engine"))

    trainer = make_trainer(tmp_path, mlp(), progress=True, epochs=3, batch_size=16)
    trainer.fit(table(), table(seed=1))
    err = capsys.readouterr().err
    assert "\r" not in err  # was tqdm's bar: a redraw per update, kept by the log as text
    lines = [line for line in err.splitlines() if line.startswith("train: ")]
    total = trainer.plan.total
    assert 1 <= len(lines) <= 11 and lines[-1].startswith(f"train: {total}/{total} upd (100%)"), err
    assert "loss=" in lines[-1]


def test_a_terminal_gets_the_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    from tqdm.auto import tqdm

    monkeypatch.setattr(sys, "stderr", Terminal())
    bar = progress(10, desc="train", unit="upd")
    bar.close()
    assert isinstance(bar, tqdm)
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    assert isinstance(progress(10, desc="train", unit="upd"), PlainProgress)
    quiet = progress(10, desc="train", unit="upd", enabled=False)
    quiet.update(10)
    quiet.close()
    assert log.getvalue() == ""


# --- item 5: a `trainflow run -S` that failed after some stages ran (the run itself: tests/flows) --------------------


def lock(**stages: str) -> dict[str, object]:
    """dvc.lock's stages, each with one output and the given md5."""
    return {name: {"cmd": f"trainflow stage {name}", "outs": [{"path": f"out/{name}", "md5": md5}]} for name, md5 in
            stages.items()}  # fmt: skip


def test_the_advice_names_what_ran_with_the_s_params_and_what_to_run() -> None:
    before = lock(ingest="a", split="b", train="c", evaluate="d", register="e")
    assert cli.rebuild_advice(["train.lr=1"], before, before) is None  # nothing recorded anew: nothing mixed
    after = {**before, **lock(ingest="A", split="B")}
    advice = cli.rebuild_advice(["data.exclude=[a, b]"], before, after)
    assert advice is not None
    assert "ingest and split ran with the -S params and DVC recorded them: out/ingest, out/split now come" in advice
    assert "those of train, evaluate and register are still from the params before" in advice
    assert "run `trainflow run` (or `dvc repro`)" in advice and "trainflow run -S 'data.exclude=[a, b]'" in advice
    everything = lock(ingest="A", split="B", train="C", evaluate="D", register="E")
    advice = cli.rebuild_advice(["seed=1"], {}, everything)  # the first run: no dvc.lock before it
    assert advice is not None and "now come from those params, not from params.yaml as it is now" in advice
