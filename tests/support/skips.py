"""What the skipped-update tests share on the CPU (tests/engine) and the GPU: the optimizers, which updates are
non-finite, and each optimizer's rate."""

from __future__ import annotations

import typing

from trainflow.params import TrainParams

OPTIMIZERS = typing.get_args(TrainParams.model_fields["optimizer"].annotation)
BAD = {1, 2, 7}  # 1-based attempts: updates 0 and 1 (the first two) and a later one are non-finite
LR = {"adamw": 2e-3, "sgd": 0.05}
