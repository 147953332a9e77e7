"""The train section's values (trainflow.params): durations (train.max_time), the world size the params alone know,
and train.global_batch against batch_size, accumulate and the world size."""

from __future__ import annotations

import pytest

from trainflow import params as pm
from trainflow.params import TrainParams


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(90, 90.0), (1.5, 1.5), ("20s", 20.0), ("45m", 2700.0), ("2h", 7200.0), ("1h30m", 5400.0), ("1d", 86400.0),
     ("1d 2h 3m 4.5s", 93784.5), ("0.5h", 1800.0)],
)  # fmt: skip
def test_durations_are_seconds_or_days_hours_minutes_seconds(value: float | str, seconds: float) -> None:
    from trainflow.params import duration_seconds

    assert duration_seconds(value) == seconds


@pytest.mark.parametrize("value", ["", "3x", "h", "1h1d"])
def test_a_duration_that_is_none_says_how_to_write_one(value: str) -> None:
    from trainflow.params import duration_seconds

    with pytest.raises(ValueError) as bad:
        duration_seconds(value)
    assert str(bad.value) == f"{value!r} is not a duration; write seconds (3600) or e.g. 20s, 45m, 2h, 1h30m, 1d"


def test_durations_with_spaces_and_parts() -> None:
    assert pm.duration_seconds(" 1h 30m ") == 5400.0
    assert pm.duration_seconds("2d") == 172800.0
    assert pm.duration_seconds("1.5m") == 90.0
    with pytest.raises(ValueError) as bad:  # a number as text has no unit
        pm.duration_seconds("10")
    assert str(bad.value) == "'10' is not a duration; write seconds (3600) or e.g. 20s, 45m, 2h, 1h30m, 1d"
    assert TrainParams.model_validate({"max_time": "1h"}).max_time == 3600.0
    assert TrainParams.model_validate({"max_time": None}).max_time is None


def test_known_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert pm.train._known_world_size(3) == 3
    assert pm.train._known_world_size("auto") is None
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert pm.train._known_world_size(3) == 3
    monkeypatch.setenv("RANK", "0")
    assert pm.train._known_world_size(3) is None
    monkeypatch.delenv("WORLD_SIZE")
    assert pm.train._known_world_size(3) == 3


def test_global_batch_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    train = TrainParams.model_validate({"batch_size": 8, "accumulate": 2, "global_batch": 64, "world_size": 4})
    assert pm.global_batch_problem(train, 4) is None
    assert pm.global_batch_problem(train, 2) == (
        "train.global_batch (64) is not train.batch_size * train.accumulate * world size (8 * 2 * 2 = 32); make them "
        "agree, set global_batch: null, or set batch_size: auto to have batch_size and accumulate chosen for it"
    )
    assert pm.global_batch_problem(TrainParams.model_validate({"batch_size": 8}), 3) is None
    auto = TrainParams.model_validate({"batch_size": "auto", "global_batch": 64})
    assert pm.global_batch_problem(auto, 3) is None
    # under torchrun the params alone do not know the world size: no check until the train stage
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert TrainParams.model_validate({"batch_size": 8, "global_batch": 64}).global_batch == 64
