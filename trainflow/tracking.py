"""MLflow tracking: where runs go, the training run (which never lets tracking fail training), the logger that keeps
MLflow off the training hot path, and the registered model's pyfunc.

The engine talks to the Logger protocol (`log(metrics, step)`, `close()`); this module is the MLflow side of it, and
with tracking.tensorboard a TensorBoard logger beside it (`loggers`). mlflow and tensorboard are imported lazily so
the CLI starts fast.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from trainflow.core import processes
from trainflow.core.io import sha256_files, write_json
from trainflow.core.logger import Logger

# Tags of an MLflow run that holds a trainflow model: the content hash of the exported model directory, and the URI
# of the model logged from it. Register finds a model's run by them, so it never logs (or registers) one model twice.
MODEL_HASH_TAG = "trainflow.model_sha256"
MODEL_URI_TAG = "trainflow.model_uri"

# How long one MLflow HTTP call may try before it counts as failed, unless set in the environment. MLflow's defaults
# (7 retries, exponential backoff, 120 s timeouts) keep a call to a stopped server going for minutes; training must
# not wait that long to learn that tracking is down, and register is retried by its Prefect task anyway.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}


def tracking_uri(root: Path) -> str:
    """MLFLOW_TRACKING_URI if set, else a SQLite store at the project root (absolute, so the cwd never matters)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(root / 'mlflow.db').resolve()}"


def configure(root: Path) -> str:
    """Point mlflow at this project's store, with short HTTP retries (HTTP_DEFAULTS; the environment wins)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    for key, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    import mlflow

    uri = tracking_uri(root)
    mlflow.set_tracking_uri(uri)
    return uri


def ensure_experiment(name: str, root: Path) -> str:
    import mlflow

    exp = mlflow.get_experiment_by_name(name)
    if exp is not None:
        return str(exp.experiment_id)
    # A local store: artifacts go next to the project, not into whatever the current directory is. A tracking server
    # (or a database every machine reaches) chooses where they go: a path in this workspace would send every
    # teammate's models to a directory on their own disk, where no one else can load them.
    local = urlparse(mlflow.get_tracking_uri()).scheme in ("", "file", "sqlite")
    location = (root / "mlartifacts").resolve().as_uri() if local else None
    return str(mlflow.create_experiment(name, artifact_location=location))


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


class MLflowLogger:
    """Sends metrics to MLflow from a background thread, so tracking never slows or fails training.

    `log()` only appends to in-memory buffers and returns. A daemon thread sends what is pending with
    `MlflowClient.log_batch` (at most 1000 metrics per call) once `flush_every` points are pending, every
    `flush_interval_s`, and at `close()`. A failing tracking server warns once and is not tried again; one slower
    than `close_timeout_s` at close is given up on. In either case every point logged is written to `fallback`
    as JSON (a list of `{"step": step, **metrics}`, one per `log()` call).
    """

    MAX_BATCH = 1000  # MLflow's limit on metrics per log_batch call

    def __init__(
        self,
        run_id: str,
        fallback: Path,
        flush_every: int = 20,
        flush_interval_s: float = 5.0,
        close_timeout_s: float = 30.0,
        on_failure: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        if flush_interval_s <= 0 or close_timeout_s < 0:
            raise ValueError("flush_interval_s must be > 0 and close_timeout_s >= 0")
        import mlflow

        self.run_id = run_id
        self.fallback = fallback
        self.on_failure = on_failure  # told of a failure instead of the logger warning itself (TrainingRun warns once)
        self.flush_every = max(1, flush_every)
        self.flush_interval_s = flush_interval_s
        self.close_timeout_s = close_timeout_s
        # The store the run lives in, fixed now: the tracking URI may change before the thread sends.
        self._tracking_uri = mlflow.get_tracking_uri()
        self._cond = threading.Condition()
        self._pending: list[tuple[str, float, int, int]] = []  # (key, value, timestamp ms, step)
        self._points: list[dict[str, Any]] = []  # every point logged, for the fallback file
        self._closed = False
        self._stopping = False  # close() asked the thread to send what is left and exit
        self._abandoned = False  # close() gave up waiting: the thread sends nothing more and stays quiet
        # No run (tracking was down when it should have started): nothing is sent, every point goes to `fallback`.
        self._error: BaseException | None = None if run_id else RuntimeError("no MLflow run to log to")
        self._timed_out = False
        self._keep = False  # the owner's run failed elsewhere: keep every point in `fallback` though sending worked
        self._client: Any = None  # made in the thread, on first send
        self._thread = threading.Thread(target=self._run, name=f"mlflow-logger-{run_id}", daemon=True)
        self._thread.start()

    @property
    def failed(self) -> bool:
        """True once tracking failed or was given up on: the metrics then go to `fallback` at close."""
        return self._error is not None or self._timed_out

    def keep_locally(self) -> None:
        """Write every point to `fallback` too (now if closed, else at close): the run they belong to is incomplete."""
        with self._cond:
            self._keep = True
            closed = self._closed
        if closed:
            self._write_fallback()

    def log(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        values = {k: float(v) for k, v in metrics.items()}
        with self._cond:
            if self._closed:
                raise RuntimeError("MLflowLogger.log() called after close()")
            self._points.append({"step": step, **values})
            if self._error is None:
                self._pending += [(k, v, now, step) for k, v in values.items()]
                if len(self._pending) >= self.flush_every:
                    self._cond.notify()

    def close(self) -> None:
        """Send what is pending (waiting at most `close_timeout_s`); on any failure write every point to `fallback`."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._stopping = True
            self._cond.notify()
        self._thread.join(self.close_timeout_s)
        if self._thread.is_alive():
            with self._cond:
                self._abandoned = True
                self._timed_out = self._error is None
            if self._timed_out:
                self._warn(
                    f"MLflow tracking is too slow (still sending after {self.close_timeout_s:g}s); "
                    f"giving up on it, metrics are kept in {self.fallback}",
                    stacklevel=3,  # the caller of close()
                )
        if self.failed or self._keep:
            self._write_fallback()

    def _write_fallback(self) -> None:
        with self._cond:
            points = list(self._points)
        write_json(self.fallback, points)
        print(f"train: metrics kept locally in {self.fallback}", file=sys.stderr)

    def _run(self) -> None:
        """The background thread: send pending points in batches until close() or the first failure."""
        deadline = time.monotonic() + self.flush_interval_s
        while True:
            with self._cond:
                while not self._stopping and len(self._pending) < self.flush_every:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                if self._abandoned:
                    return
                batch, self._pending = self._pending, []
                stopping = self._stopping
            deadline = time.monotonic() + self.flush_interval_s
            if batch and not self._send(batch):
                return
            if stopping:
                with self._cond:
                    if not self._pending:
                        return

    def _send(self, batch: list[tuple[str, float, int, int]]) -> bool:
        try:
            from mlflow.entities import Metric
            from mlflow.tracking import MlflowClient

            if self._client is None:
                self._client = MlflowClient(tracking_uri=self._tracking_uri)
            client = self._client
            for i in range(0, len(batch), self.MAX_BATCH):
                chunk = batch[i : i + self.MAX_BATCH]
                client.log_batch(self.run_id, metrics=[Metric(k, v, t, s) for k, v, t, s in chunk], synchronous=True)
        except Exception as exc:  # noqa: BLE001 - tracking must never stop training
            with self._cond:
                self._error = exc
                self._pending.clear()
                quiet = self._abandoned
            if quiet:
                pass
            elif self.on_failure is not None:
                self.on_failure("sending metrics", exc)
            else:
                self._warn(
                    f"MLflow logging failed ({type(exc).__name__}: {exc}); metrics are kept in {self.fallback}", 2
                )
            return False
        return True

    @staticmethod
    def _warn(message: str, stacklevel: int) -> None:
        try:
            warnings.warn(message, stacklevel=stacklevel)
        except Exception:  # noqa: BLE001 - under `-W error` a warning raises; it must not kill the thread
            print(f"warning: {message}", file=sys.stderr)


class TensorBoardLogger:
    """Writes metrics as TensorBoard scalars into `log_dir` (torch's SummaryWriter, imported on first use: it is
    heavy). Like MLflowLogger it never fails training: the first error (opening, writing or closing) warns once and
    turns it off; the other loggers go on. SummaryWriter queues events and writes them from its own thread."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.error: str | None = None
        self._writer: Any = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(log_dir))
        except Exception as exc:  # noqa: BLE001 - tracking must never stop training
            self._failed("opening the event file", exc)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self._writer is None:
            return
        try:
            for key, value in metrics.items():
                self._writer.add_scalar(key, float(value), step)
        except Exception as exc:  # noqa: BLE001 - tracking must never stop training
            self._failed("writing metrics", exc)

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is None:
            return
        try:
            writer.close()  # writes what is queued
        except Exception as exc:  # noqa: BLE001 - tracking must never stop training
            self._failed("closing the event file", exc)

    def _failed(self, what: str, exc: BaseException) -> None:
        self.error = f"{what}: {type(exc).__name__}: {exc}"
        writer, self._writer = self._writer, None
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()
        MLflowLogger._warn(
            f"TensorBoard logging to {self.log_dir} failed while {what} ({type(exc).__name__}: {exc}); training goes "
            "on without it (MLflow still has the metrics)",
            stacklevel=3,
        )


class Loggers:
    """Several loggers as one (MLflow and TensorBoard): each gets every point, close() closes every one."""

    def __init__(self, loggers: Sequence[Logger]) -> None:
        self.loggers = list(loggers)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for logger in self.loggers:
            logger.log(metrics, step)

    def close(self) -> None:
        errors = []
        for logger in self.loggers:  # a failing one still lets the others flush
            try:
                logger.close()
            except Exception as exc:  # noqa: BLE001 - re-raised below, once all are closed
                errors.append(exc)
        if errors:
            raise errors[0]


def run_folder(run_id: str | None) -> str:
    """A run's own TensorBoard subfolder: its start time (UTC, so folders sort by time) and MLflow run id (or a
    random one when tracking is down), so reruns never write into each other's events."""
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}_{run_id or 'no-mlflow-' + uuid.uuid4().hex[:8]}"


def loggers(run: TrainingRun, tensorboard: Path | None) -> Logger:
    """The run's metrics logger: MLflow, plus TensorBoard in a subfolder of `tensorboard` (tracking.tensorboard)."""
    mlflow_logger = run.logger()
    if tensorboard is None:
        return mlflow_logger
    return Loggers([mlflow_logger, TensorBoardLogger(tensorboard / run_folder(run.run_id))])


class TrainingRun:
    """The MLflow run of one training, whose failures never fail training.

    Every MLflow call goes through `_guarded`: the first one that fails warns once — what failed, at which tracking
    URI, where the metrics are kept instead, and that register logs the model once the server answers — and turns
    tracking off for the rest of the run. `record()` is what reports/train_run.json holds; a run with no `model_uri`
    (never started, or cut off before the model was logged) is completed by the register stage (`log_pending_model`).
    """

    def __init__(self, root: Path, experiment: str, fallback: Path) -> None:
        self.root = root
        self.experiment = experiment
        self.fallback = fallback
        self.uri = configure(root)
        self.experiment_id: str | None = None
        self.run_id: str | None = None
        self.model_uri: str | None = None
        self.error: str | None = None
        self._logger: MLflowLogger | None = None
        self._lock = threading.Lock()

    def start(
        self, params: dict[str, Any], tags: dict[str, str], run_name: str | None = None, pipeline: bool = False
    ) -> None:
        """A new run with `params` and `tags` (tag mlflow.parentRunId makes it a child of that run).

        `pipeline`: the train stage's run, made while this process holds the workspace. It records its workspace and
        process, and ends the runs an earlier train stage of the workspace left RUNNING when its process died."""

        def go() -> None:
            from mlflow.entities import Param
            from mlflow.tracking import MlflowClient

            client = MlflowClient(self.uri)
            self.experiment_id = ensure_experiment(self.experiment, self.root)
            all_tags = dict(tags)
            if pipeline:
                all_tags |= {WORKSPACE_TAG: processes.workspace_tag(self.root), PROCESS_TAG: processes.process_tag()}
                try:
                    end_orphans(client, self.experiment_id, all_tags[WORKSPACE_TAG])
                except Exception as exc:  # noqa: BLE001 - bookkeeping of older runs never costs this run its tracking
                    print(f"train: could not end the MLflow runs a dead process left RUNNING: {exc!r}", file=sys.stderr)
            self.run_id = client.create_run(self.experiment_id, tags=all_tags, run_name=run_name).info.run_id
            items = [Param(k, str(v)) for k, v in flatten(params).items()]
            for i in range(0, len(items), 100):  # MLflow's limit on params per log_batch call
                client.log_batch(self.run_id, params=items[i : i + 100], synchronous=True)

        self._guarded("starting the run", go)

    def attach(self, run_id: str) -> None:
        """Carry on an existing run (a resumed sweep trial) instead of starting one."""
        self.run_id = run_id

    def set_tags(self, tags: dict[str, str]) -> None:
        def go() -> None:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(self.uri)
            for key, value in tags.items():
                client.set_tag(str(self.run_id), key, value)

        self._guarded("tagging the run", go)

    def logger(self, **kwargs: Any) -> MLflowLogger:
        """The metrics logger of this run; with no run (tracking was down at the start) it keeps every point locally."""
        self._logger = MLflowLogger(self.run_id or "", self.fallback, on_failure=self._failed, **kwargs)
        return self._logger

    def log_metrics(self, metrics: dict[str, float]) -> None:
        def go() -> None:
            from mlflow.tracking import MlflowClient

            for key, value in metrics.items():
                MlflowClient(self.uri).log_metric(str(self.run_id), key, value)

        self._guarded("logging the final metrics", go)

    def log_artifact(self, path: Path, directory: str) -> None:
        def go() -> None:
            from mlflow.tracking import MlflowClient

            MlflowClient(self.uri).log_artifact(str(self.run_id), str(path), directory)

        self._guarded(f"logging {path.name}", go)

    def log_model(self, final: Path, example: Any) -> None:
        def go() -> None:
            self.model_uri = log_pyfunc(str(self.run_id), final, example)

        self._guarded("logging the model", go)

    def finish(self, status: str = "FINISHED") -> None:
        def go() -> None:
            from mlflow.tracking import MlflowClient

            MlflowClient(self.uri).set_terminated(str(self.run_id), status)

        self._guarded("ending the run", go)

    def record(self) -> dict[str, Any]:
        """What reports/train_run.json holds: the run, its model, and the tracking error that left them missing."""
        return {
            "run_id": self.run_id,
            "experiment_id": self.experiment_id,
            "model_uri": self.model_uri,
            "tracking_uri": self.uri,
            "tracking_error": self.error,
        }

    def _guarded(self, what: str, call: Callable[[], None]) -> None:
        if self.error is not None or (self.run_id is None and what != "starting the run"):
            return
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - tracking must never fail training
            self._failed(what, exc)

    def _failed(self, what: str, exc: BaseException) -> None:
        with self._lock:
            if self.error is not None:
                return
            self.error = f"{what}: {type(exc).__name__}: {exc}"
        if self._logger is not None:  # the warning below promises the metrics are kept locally, whenever it failed
            self._logger.keep_locally()
        message = (
            f"MLflow tracking at {self.uri} failed while {what} ({type(exc).__name__}: {exc}). Training goes on "
            f"without it: metrics are kept in {self.fallback}, everything else in models/ and reports/; "
            "`trainflow stage register` logs the model to MLflow once the server answers."
        )
        try:
            warnings.warn(message, stacklevel=2)
        except Exception:  # noqa: BLE001 - under `-W error` a warning raises; it must not fail training
            print(f"warning: {message}", file=sys.stderr)


WORKSPACE_TAG = "trainflow.workspace"  # host:path of the workspace a train stage's run trained in
PROCESS_TAG = "trainflow.process"  # the process that made the run (trainflow.core.processes.process_tag)


def end_orphans(client: Any, experiment_id: str, workspace_tag: str) -> list[str]:
    """End as KILLED the RUNNING runs of this workspace's train stage whose process is gone (SIGKILLed, or its
    machine went down, so it never ended them); returns their ids. Each gets a tag saying why."""
    quoted = workspace_tag.replace("'", "\\'")
    found = client.search_runs(
        [experiment_id], filter_string=f"tags.`{WORKSPACE_TAG}` = '{quoted}' and attributes.status = 'RUNNING'"
    )
    ended = []
    for run in found:
        process = run.data.tags.get(PROCESS_TAG, "")
        if processes.process_alive(process) is not False:
            continue
        why = (
            f"its process ({process}) ended while the run was RUNNING, without ending it (killed, or its machine went "
            "down); ended by the next train stage of the workspace"
        )
        client.set_tag(run.info.run_id, "trainflow.ended", why)
        client.set_terminated(run.info.run_id, "KILLED")
        print(f"train: MLflow run {run.info.run_id} was left RUNNING by a dead process: KILLED", file=sys.stderr)
        ended.append(run.info.run_id)
    return ended


def model_hash(final: Path) -> str:
    """The content hash of an exported model directory (weights, config, preprocessing, training summary)."""
    return sha256_files(sorted(p for p in final.iterdir() if p.is_file()))


def run_of_model(experiment_id: str, final: Path, flavor: str = "package") -> tuple[str, str | None] | None:
    """(run id, URI of the model logged as `flavor`, or None) of the run in `experiment_id` that holds the model in
    `final`, if one does."""
    from mlflow.tracking import MlflowClient

    runs = MlflowClient().search_runs(
        [experiment_id], filter_string=f"tags.`{MODEL_HASH_TAG}` = '{model_hash(final)}'", max_results=10
    )
    if not runs:
        return None
    tag = uri_tag(flavor)
    with_model = [r for r in runs if tag in r.data.tags]
    run = (with_model or runs)[0]
    return run.info.run_id, run.data.tags.get(tag)


def uri_tag(flavor: str) -> str:
    """The run tag holding the URI of its model logged as `flavor` (register.flavor)."""
    return MODEL_URI_TAG if flavor == "package" else f"{MODEL_URI_TAG}.{flavor}"


def log_pyfunc(run_id: str, final: Path, example: Any, flavor: str = "package") -> str:
    """Log the exported model in `final` into run `run_id` as an MLflow pyfunc and tag the run with its hash and URI;
    returns its models:/ URI. `example`: a few rows of the raw input, for the signature.

    flavor package (the default): the pyfunc's code is the installed trainflow's (`loader_module="trainflow.serving"`,
    trainflow pinned by version in its requirements); its data is models/final. No trainflow code is stored in the
    artifact store and loading unpickles nothing; what keeps the store's writers from changing MLmodel to load code
    from there is the manifest register records in the registry (`trainflow.artifacts.manifest`), checked by trainflow's
    loading only. A user model's module travels with the model (code_paths), since the model cannot be built without
    it. flavor code (register.flavor: code, asked for): MLflow models-from-code, `trainflow/serving_code.py` with the
    trainflow package stored beside it, for machines without trainflow installed; loading it runs that stored code."""
    import mlflow
    import torch
    from mlflow.models import ModelSignature, infer_signature
    from mlflow.tracking import MlflowClient
    from mlflow.types.schema import AnyType, ColSpec
    from mlflow.types.schema import Schema as InputSchema

    import trainflow
    from trainflow.artifacts.predict import ExportedModel
    from trainflow.models import user_source

    exported = ExportedModel.load(final)
    pre = exported.pre
    columns = [*pre.raw_features, *[c for c in (pre.text_column, pre.image_column) if c]]  # images: paths or bytes
    inputs = example[columns]
    # Inputs of any type: the model's own preprocessing reads what `trainflow predict` reads (a table read with
    # pandas from the raw file: ints where training saw floats, "yes"/"no", dates as text, "?" and blanks). A typed
    # signature would make MLflow refuse those before the model sees them. Columns the model does not use are
    # dropped; a missing one is MLflow's error, naming it.
    signature = ModelSignature(
        inputs=InputSchema([ColSpec(AnyType(), c) for c in columns]),
        outputs=infer_signature(inputs, exported.predict_frame(inputs)).outputs,
    )
    requirements = [f"torch=={torch.__version__.split('+')[0]}", "safetensors", "pandas", "numpy", "onnxruntime",
                    "pydantic", "pyyaml"]  # fmt: skip
    requirements += [f"trainflow=={trainflow.__version__}"] if flavor == "package" else []  # code: stored with it
    requirements += ["tokenizers"] if pre.text_column else ["pillow"] if pre.image_column else []
    requirements += ["transformers"] if type(exported.model).__module__ == "trainflow.models.hf" else []
    with warnings.catch_warnings(), mlflow.start_run(run_id=run_id):
        # The signature is given; an input example would only make MLflow load and run the model once more.
        warnings.filterwarnings("ignore", message=".*An input example was not provided")  # text is ANSI-coloured
        user = [source["source"]] if (source := user_source(exported.model)) else []
        package = Path(trainflow.__file__).parent
        how: dict[str, Any] = (
            {"loader_module": "trainflow.serving", "data_path": str(final), "code_paths": user or None}
            if flavor == "package"
            else {"python_model": str(package / "serving_code.py"), "artifacts": {"model_dir": str(final)},
                  "code_paths": [str(package), *user]}
        )  # fmt: skip
        # Listing requirements skips MLflow's slow inference of them.
        info = mlflow.pyfunc.log_model(name="model", signature=signature, pip_requirements=requirements, **how)
    client = MlflowClient()
    client.set_tag(run_id, MODEL_HASH_TAG, model_hash(final))
    client.set_tag(run_id, uri_tag(flavor), str(info.model_uri))
    return str(info.model_uri)
