"""Test isolation: every test gets its own MLflow store and project dir; Prefect never touches the home directory.

PREFECT_HOME and Prefect's settings are read when prefect is imported, so they are set here, at collection time.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.projects import (
    FAST,
    REPO,
    _forget_set_tracking_uri,
    blobs,
    committed,
    fresh_copy,
    make_project,
    run_blobs_once,
)

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
        # engine/preempt.py: ranks exchange their stop flags after every update, so a test's signal at update k stops
        # them after update k (tests/engine/test_preempt_ranks.py tests the cadence itself)
        "TRAINFLOW_PREEMPT_CHECK_S": "0",
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

# The slow tier's files, longest first (each file's total in a `--durations=0` run of the tier; test_slurm, skipped
# where that was measured, where an earlier run put it): scripts/test.sh --slow
# hands whole files to its two workers in this order (--no-loadscope-reorder), so that the last to start are short
# and neither worker runs a long file alone at the end. Order only: files not named here run after these, as collected.
SLOW_LONGEST_FIRST = tuple(
    f"tests/{name}.py"
    for name in (
        "flows/test_scheduled_crash", "flows/test_preempt_flow", "reliability/test_kill_anywhere", "stages/test_tune",
        "stages/test_preempt_anywhere", "stages/test_verify", "registry/test_access_control",
        "stages/test_distributed_stage", "flows/test_your_data_flows", "reliability/test_tracking_outage",
        "flows/test_interrupt_run", "reliability/test_twice_at_once", "registry/test_concurrent_promotions",
        "stages/test_tune_ray", "flows/test_slurm", "flows/test_team", "stages/test_tune_faults",
        "flows/test_data_trigger", "reliability/test_disk_full", "stages/test_two_nodes", "flows/test_retrain_script",
        "reliability/test_corrupt_files", "flows/test_deployment", "contracts/test_gpu_check_runs_on_cpu",
        "engine/test_distributed", "flows/test_team_prefect",
        "stages/test_images", "stages/test_preempt", "stages/test_tune_team", "engine/test_crash_resume",
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


@pytest.fixture
def backends(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The global switches configure_backends sets (train.deterministic, train.tf32), restored after the test: the rest
    of the suite runs in the same process."""
    import torch  # here, not at the top: most tests never import it

    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.are_deterministic_algorithms_enabled(),
    )
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[0], saved[1]
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[2], saved[3]
    torch.use_deterministic_algorithms(saved[4])


@pytest.fixture
def iris_project(tmp_path: Path) -> Path:
    """The repo's pipeline on the built-in iris data (150 rows), trained briefly."""
    return make_project(tmp_path / "proj", {"data.source": "builtin:iris", "register.model_name": "iris", **FAST})


@pytest.fixture
def csv_project(tmp_path: Path) -> Iterator[Path]:
    root = make_project(
        tmp_path / "proj",
        {"data.source": "data/raw/blobs.csv", "data.target": "label", "register.model_name": "blobs", **FAST},
    )
    blobs().to_csv(root / "data/raw/blobs.csv", index=False)
    yield root


@pytest.fixture(scope="module")
def _blobs_run_once(tmp_path_factory: pytest.TempPathFactory, _empty_mlflow_store: Path) -> Path:
    return run_blobs_once(tmp_path_factory.mktemp("blobs-run"), _empty_mlflow_store, blobs())


@pytest.fixture
def trained(_blobs_run_once: Path, _isolated_tracking: None) -> Path:
    """csv_project after one whole pipeline run (version 1 of "blobs", its champion), a fresh copy per test: the run
    is made once per module."""
    return fresh_copy(_blobs_run_once)


@pytest.fixture
def params_file(tmp_path: Path) -> Path:
    """A copy of this repo's params.yaml (as committed) to change."""
    (tmp_path / "params.yaml").write_bytes(committed("params.yaml")["params.yaml"])
    return tmp_path / "params.yaml"
