"""The one interface between training and whatever records its metrics: the engine calls `log(metrics, step)` and
`close()`; trainflow.tracking implements it for MLflow and TensorBoard, the sweeps wrap it to report to Optuna or
Ray. Here, below both, so that neither imports the other for it."""

from __future__ import annotations

from typing import Protocol


class Logger(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...
    def close(self) -> None: ...


class NullLogger:
    """Records nothing: ranks other than 0, and trainings without tracking."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        pass

    def close(self) -> None:
        pass
