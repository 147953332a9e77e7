"""The batch_predict flow: score a file with a registered model (by default the champion) and write the predictions.

    from flows.batch_predict import batch_predict
    batch_predict("models:/trainflow-digits@champion", "data/new.csv", "predictions/new.parquet")

The same code as `trainflow predict`. Deploy it like training_pipeline (`batch_predict.serve(...)`) to score new files
on a schedule.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task

from tasks.retry import OUTSIDE_WORLD
from trainflow.artifacts.batch_predict import predict_file
from trainflow.artifacts.predict import BATCH_SIZE


@task(name="predict", **OUTSIDE_WORLD)  # loads from the registry: retried with backoff, unless the input is bad
def predict(model: str, input: str, output: str, batch_size: int) -> dict[str, object]:
    return predict_file(model, Path(input), Path(output), batch_size)


@flow(name="batch_predict")
def batch_predict(model: str, input: str, output: str, batch_size: int = BATCH_SIZE) -> dict[str, object]:
    """Score every row of `input` (csv, tsv, parquet, jsonl) with `model`; write rows + predictions to `output`."""
    from trainflow import tracking
    from trainflow.core.paths import Paths

    tracking.configure(Paths.default().root)  # models:/ URIs resolve against the project's registry
    return predict(model, input, output, batch_size)
