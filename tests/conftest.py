"""Test isolation: every test gets its own MLflow store and project dir; Prefect never touches the home directory.

PREFECT_HOME and Prefect's settings are read when prefect is imported, so they are set here, at collection time.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]

pytest_plugins = ["timeout_backstop"]  # pytest-timeout's limit, also for a test hung holding the GIL

# bench/mutation.sh sets HYPOTHESIS_PROFILE=mutation: the same examples every run, so a mutant's verdict does not
# depend on which random examples were drawn.
from hypothesis import settings as _hypothesis  # noqa: E402

_hypothesis.register_profile("mutation", derandomize=True, database=None)
_hypothesis.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
_PREFECT_HOME = tempfile.mkdtemp(prefix="trainflow-prefect-")
os.environ.update(
    {
        "PREFECT_HOME": _PREFECT_HOME,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "DO_NOT_TRACK": "1",
        "TRAINFLOW_RETRY_DELAY_S": "0",  # tasks/retry.py: retries of the outside-world tasks start at once
        # Hugging Face: never the hub, never the home cache (tests build their tiny models: tiny_bert)
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": tempfile.mkdtemp(prefix="trainflow-hf-"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
)
os.environ.pop("PREFECT_API_URL", None)
# Prefect configures logging once per process, when prefect.main is first imported (`import prefect` alone is lazy):
# the root logger gets a console handler bound to the sys.stderr of that moment. First imported inside a test with
# capfd/capsys, it holds that test's capture file, closed at teardown, and every later library warning (urllib3's
# retries) prints "--- Logging error ---" and a traceback into a later test's stderr. Import it here, under pytest's
# session-long capture (~1 s per worker).
import prefect.main  # noqa: E402, F401

# The slow tier's files, longest first (each file's total in a `--durations=0` run of it): scripts/test.sh --slow
# hands whole files to its two workers in this order (--no-loadscope-reorder), so that the last to start are short
# and neither worker runs a long file alone at the end. Order only: files not named here run after these, as collected.
SLOW_LONGEST_FIRST = tuple(
    f"tests/{name}.py"
    for name in (
        "reliability/test_kill_anywhere", "stages/test_tune", "flows/test_preempt_flow", "stages/test_preempt_anywhere",
        "stages/test_verify", "stages/test_distributed_stage", "flows/test_your_data_flows",
        "reliability/test_tracking_outage", "flows/test_interrupt_run", "reliability/test_twice_at_once",
        "flows/test_scheduled_crash", "stages/test_tune_ray", "flows/test_slurm", "stages/test_tune_faults",
        "flows/test_retrain_script", "stages/test_images", "stages/test_preempt", "flows/test_data_trigger",
        "reliability/test_disk_full", "reliability/test_corrupt_files", "engine/test_distributed",
        "flows/test_deployment", "engine/test_crash_resume",
    )
)  # fmt: skip
assert all((REPO / path).is_file() for path in SLOW_LONGEST_FIRST), "a file moved: name it anew in SLOW_LONGEST_FIRST"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: n for n, path in enumerate(SLOW_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))  # stable: a file keeps its order


# dvc.yaml runs `trainflow stage ...` through the shell: make this interpreter's scripts reachable.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[None]:
    """One local Prefect server for every test that runs flows in this process (~10 s to start)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield


def _tracking_dirs() -> set[str]:
    """The directories under the repo's own MLflow stores (what `trainflow run` here writes, never a test)."""
    return {d for store in ("mlruns", "mlartifacts") for d, _, _ in os.walk(REPO / store)}


@pytest.fixture(scope="session")
def _empty_mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow SQLite store, its schema made: MLflow's migrations take ~2 s on a fresh file (in the test's
    process, or in every `trainflow` subprocess it starts), a copy of a migrated one milliseconds. Made once per
    worker, from a directory of its own (the Default experiment's artifact location is resolved from the current
    directory: never the repo's)."""
    from mlflow.tracking import MlflowClient

    db = tmp_path_factory.mktemp("mlflow-empty") / "mlflow.db"
    cwd = os.getcwd()
    os.chdir(db.parent)
    try:
        MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    finally:
        os.chdir(cwd)
    return db


def _forget_set_tracking_uri() -> None:
    """Drop what `mlflow.set_tracking_uri` left in this worker (trainflow.tracking.configure in an in-process stage,
    a chaos check pointing at its server): it outranks MLFLOW_TRACKING_URI, so a later test's client would reach an
    earlier test's store, or its stopped server. Only when mlflow is imported already: importing it costs seconds."""
    utils = sys.modules.get("mlflow.tracking._tracking_service.utils")
    if utils is not None:
        utils._tracking_uri = None  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _isolated_tracking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _empty_mlflow_store: Path) -> Iterator[None]:
    """Each test's own MLflow store (MLFLOW_TRACKING_URI), a copy of an empty one, beside tmp_path rather than in it:
    tests list what they wrote in tmp_path."""
    store = tmp_path.with_name(f"{tmp_path.name}-mlflow") / "mlflow.db"
    store.parent.mkdir(exist_ok=True)
    shutil.copyfile(_empty_mlflow_store, store)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    monkeypatch.delenv("TRAINFLOW_ROOT", raising=False)
    _forget_set_tracking_uri()
    before = _tracking_dirs()
    yield
    _forget_set_tracking_uri()
    # An experiment created in a test's fresh database keeps its artifacts in ./mlruns of the working directory: a
    # test that logs from the repo's directory writes there. Caught here, by the test that did it.
    leaked = sorted(_tracking_dirs() - before)
    assert not leaked, f"the test wrote into the repo's MLflow store: {leaked[:3]}; monkeypatch.chdir(tmp_path) first"


# Files a project needs for DVC to run the pipeline: its definition and the library code stages depend on (as in
# this working copy: the code under test), and its defaults (as committed: see `committed`).
PROJECT_FILES = ("dvc.yaml", ".dvcignore", ".dvc/.gitignore", "trainflow")
DEFAULTS = ("params.yaml", ".dvc/config", "data/raw")


@functools.cache
def committed(rel: str, root: Path = REPO) -> dict[str, bytes]:
    """The files at `rel` (a file or a folder) as the last commit of `root` has them, by path under `root`.

    What a user changes by following the README (params.yaml after `-S` overrides, their own data in data/raw, a DVC
    remote in .dvc/config) is their working state, which no test may build on: tests start from the committed
    defaults. Outside a git checkout of its own (an unpacked archive, mutmut's copy in mutants/), the files on disk."""
    git = ["git", "-C", str(root)]
    top = subprocess.run([*git, "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root.resolve():
        on_disk = [root / rel] if (root / rel).is_file() else sorted(p for p in (root / rel).rglob("*") if p.is_file())
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in on_disk}
    names = subprocess.run([*git, "ls-tree", "-r", "--name-only", "HEAD", "--", rel], capture_output=True, text=True)
    return {
        name: subprocess.run([*git, "show", f"HEAD:{name}"], capture_output=True, check=True).stdout
        for name in names.stdout.splitlines()
    }


def model_run(client: Any, experiment: str, where: Path) -> str:
    """A run holding a stand-in model (a directory with an MLmodel file: what register_model looks for)."""
    run_id = str(client.create_run(experiment).info.run_id)
    model = where / run_id / "model"
    model.mkdir(parents=True)
    (model / "MLmodel").write_text("flavors: {}\n")
    client.log_artifacts(run_id, str(model), "model")
    return run_id


def make_project(dest: Path, params: dict[str, object] | None = None) -> Path:
    """A fresh git + DVC project in `dest` holding this repo's pipeline, optionally with params overrides."""
    dest.mkdir(parents=True, exist_ok=True)
    for rel in PROJECT_FILES:
        src = REPO / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    (dest / "data/raw").mkdir(parents=True)  # where a test's own data goes
    for rel in DEFAULTS:
        for name, content in committed(rel).items():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes(content)
    if params:
        from trainflow.params import write_overrides

        write_overrides(dest / "params.yaml", [f"{k}={v}" for k, v in params.items()])
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=dest, check=True)
    subprocess.run([*git, "add", "-A"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=dest, check=True)
    return dest


FAST = {"train.epochs": 4, "train.progress": "false", "train.batch_size": 16}


@pytest.fixture
def iris_project(tmp_path: Path) -> Path:
    """The repo's pipeline on the built-in iris data (150 rows), trained briefly."""
    return make_project(tmp_path / "proj", {"data.source": "builtin:iris", "register.model_name": "iris", **FAST})


def blobs(n: int = 240, classes: int = 3, features: int = 4, seed: int = 0, separation: float = 6.0) -> pd.DataFrame:
    """Gaussian blobs; with the default separation any working classifier scores near 1.0 on them, with ~1 they
    overlap, so a model makes mistakes (and macro and micro averages differ)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    centers = rng.normal(0, separation, (classes, features))
    x = centers[y] + rng.normal(0, 1, (n, features))
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(features)])
    frame["label"] = np.array(["a", "b", "c", "d", "e"])[y]
    return frame


@pytest.fixture
def csv_project(tmp_path: Path) -> Iterator[Path]:
    root = make_project(
        tmp_path / "proj",
        {"data.source": "data/raw/blobs.csv", "data.target": "label", "register.model_name": "blobs", **FAST},
    )
    blobs().to_csv(root / "data/raw/blobs.csv", index=False)
    yield root


def split_project(root: Path, settings: dict[str, object]) -> Path:
    """make_project's project with its splits made and committed to DVC in this process (as `dvc repro split` would:
    a `trainflow` command then finds nothing to ingest or split) and its MLflow database created: what a module
    fixture prepares once for its tests to copy, so that none pays for ingest, split or MLflow's migrations."""
    from mlflow.tracking import MlflowClient

    from tasks import dvc
    from trainflow.core.paths import Paths
    from trainflow.params import load_params
    from trainflow.stages import run_stage

    make_project(root, settings)
    paths = Paths(root)
    for stage in ("ingest", "split"):
        run_stage(stage, load_params(paths.params), paths)
        dvc.commit(root, stage)
    MlflowClient(f"sqlite:///{root / 'mlflow.db'}").search_experiments()
    return root


def run_blobs_once(base: Path, empty_store: Path, data: pd.DataFrame) -> Path:
    """csv_project's project on `data`, run through every stage in-process once, in base/work/proj, and kept as
    base/pristine with its MLflow store as base/mlflow.db: what a module fixture builds for `fresh_copy` to hand out.
    A whole run is seconds; a module's tests that start from a finished run share one."""
    from trainflow.core.paths import Paths
    from trainflow.params import load_params
    from trainflow.stages import STAGES, run_stage

    root = make_project(
        base / "work" / "proj",
        {"data.source": "data/raw/blobs.csv", "data.target": "label", "register.model_name": "blobs", **FAST},
    )
    data.to_csv(root / "data/raw/blobs.csv", index=False)
    shutil.copyfile(empty_store, base / "mlflow.db")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{base / 'mlflow.db'}")
        paths = Paths(root)
        for stage in STAGES:
            run_stage(stage, load_params(paths.params), paths)
    _forget_set_tracking_uri()
    shutil.copytree(root, base / "pristine", symlinks=True)
    return base


def fresh_copy(base: Path) -> Path:
    """A fresh copy of run_blobs_once's project, and of its MLflow store as the running test's (MLFLOW_TRACKING_URI).
    The copy goes back to the path it ran at, since the store holds absolute artifact paths under it: so a module's
    tests that use it must run one after another (as they do: --dist loadfile keeps a file on one worker)."""
    work = base / "work"
    shutil.rmtree(work)
    shutil.copytree(base / "pristine", work / "proj", symlinks=True)
    shutil.copyfile(base / "mlflow.db", os.environ["MLFLOW_TRACKING_URI"].removeprefix("sqlite:///"))
    return work / "proj"


@pytest.fixture(scope="module")
def _blobs_run_once(tmp_path_factory: pytest.TempPathFactory, _empty_mlflow_store: Path) -> Path:
    return run_blobs_once(tmp_path_factory.mktemp("blobs-run"), _empty_mlflow_store, blobs())


@pytest.fixture
def trained(_blobs_run_once: Path, _isolated_tracking: None) -> Path:
    """csv_project after one whole pipeline run (version 1 of "blobs", its champion), a fresh copy per test: the run
    is made once per module."""
    return fresh_copy(_blobs_run_once)


def retrain(root: Path, seed: int) -> None:
    """A new training run, as after new data or params: the same model, trained from another seed (new weights)."""
    from trainflow.core.paths import Paths
    from trainflow.params import load_params, write_overrides
    from trainflow.stages import run_stage

    paths = Paths(root)
    write_overrides(paths.params, [f"seed={seed}"])
    for stage in ("train", "evaluate"):
        run_stage(stage, load_params(paths.params), paths)


def wait_for_http(url: str, alive: Callable[[], str | None], seconds: float, interval: float = 0.3) -> None:
    """Poll `url` until it answers 200; `alive()` returns why the server process died (None while it runs)."""
    deadline = time.monotonic() + seconds
    while True:
        died = alive()
        assert died is None, died
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{url} did not answer in {seconds:g} s"
        time.sleep(interval)


@pytest.fixture
def params_file(tmp_path: Path) -> Path:
    """A copy of this repo's params.yaml (as committed) to change."""
    (tmp_path / "params.yaml").write_bytes(committed("params.yaml")["params.yaml"])
    return tmp_path / "params.yaml"


def tiny_bert(directory: Path, words: list[str], labels: int = 2, seed: int = 0, dropout: float = 0.1) -> Path:
    """A tiny random BERT (2 layers of width 32) and its WordPiece tokenizer over `words`, written by save_pretrained
    into `directory`: what a user's local pretrained model looks like, without a download."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {w: i for i, w in enumerate([*special, *dict.fromkeys(w.lower() for w in words)])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]",
    ).save_pretrained(directory)  # fmt: skip
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=labels,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)  # fmt: skip
    torch.manual_seed(seed)
    BertForSequenceClassification(config).save_pretrained(directory)
    return directory


def tiny_decoder(
    directory: Path, words: list[str], kind: str = "gpt2", labels: int = 2, seed: int = 0, dropout: float = 0.1
) -> Path:
    """A tiny random decoder classifier, `kind` "gpt2" or "llama" (2 layers of width 32; Llama's with grouped-query
    attention), and a word-level tokenizer over `words` with no pad token, as GPT-2's and Llama's have none. Id 0 is
    "!", a real token, as in GPT-2. Written by save_pretrained into `directory`, like `tiny_bert`."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import (
        AutoModelForSequenceClassification,
        GPT2Config,
        LlamaConfig,
        PretrainedConfig,
        PreTrainedTokenizerFast,
    )

    vocab = {w: i for i, w in enumerate(["!", *dict.fromkeys(w.lower() for w in words if w != "!"), "<unk>"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(directory)
    end = vocab["<unk>"]  # bos and eos in the vocabulary; no pad id
    config: PretrainedConfig
    if kind == "gpt2":
        config = GPT2Config(vocab_size=len(vocab), n_embd=32, n_layer=2, n_head=2, n_positions=64, num_labels=labels,
                            resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, bos_token_id=end,
                            eos_token_id=end)  # fmt: skip
    elif kind == "llama":
        config = LlamaConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                             num_labels=labels, attention_dropout=dropout, bos_token_id=end,
                             eos_token_id=end)  # fmt: skip
    else:
        raise ValueError(f"kind {kind!r}: one of 'gpt2', 'llama'")
    torch.manual_seed(seed)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(directory)
    return directory
