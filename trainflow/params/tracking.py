"""tracking: MLflow (and TensorBoard) logging."""

from __future__ import annotations

from pydantic import Field

from trainflow.params.base import Section


class TrackingParams(Section):
    experiment: str = Field("trainflow", min_length=1, description="MLflow experiment name for training runs.")
    tensorboard: bool = Field(
        False,
        description="Also write the training metrics as TensorBoard event files under reports/tensorboard/, a "
        "subfolder per run (sweep trials: tune/<study>/trial_NNNN/); `tensorboard --logdir reports/tensorboard`.",
    )
