"""A TensorBoard writer that fails (to write, to close, to open) warns once, is dropped, and training goes on
without it (trainflow.tracking.TensorBoardLogger), called in-process."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest


class Writer:
    def __init__(self, fail_on: str) -> None:
        self.fail_on, self.closed, self.points = fail_on, 0, []

    def add_scalar(self, key: str, value: float, step: int) -> None:
        if self.fail_on == "write":
            raise OSError("disk full")
        self.points.append((key, value, step))

    def close(self) -> None:
        self.closed += 1
        if self.fail_on == "close":
            raise OSError("gone")


@pytest.mark.parametrize(("fail_on", "what"), [("write", "writing metrics"), ("close", "closing the event file")])
def test_a_failing_tensorboard_writer_warns_once_and_is_dropped(fail_on: str, what: str, tmp_path: Path) -> None:
    from trainflow.tracking import TensorBoardLogger

    logger = TensorBoardLogger.__new__(TensorBoardLogger)
    writer = Writer(fail_on)
    logger.log_dir, logger.error, logger._writer = tmp_path / "tb", None, writer
    exc = "OSError: disk full" if fail_on == "write" else "OSError: gone"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger.log({"loss": 1}, 3)
        logger.close()
        logger.log({"loss": 2}, 4)  # dropped: nothing more is written
        logger.close()
    assert logger.error == f"{what}: {exc}" and logger._writer is None
    assert [str(w.message) for w in caught] == [
        f"TensorBoard logging to {tmp_path / 'tb'} failed while {what} ({exc}); training goes on without it (MLflow "
        "still has the metrics)"
    ]
    # a failed write closes the writer, then close() finds none; a failed close is that one close
    assert writer.closed == 1
    assert writer.points == ([] if fail_on == "write" else [("loss", 1.0, 3)])


def test_a_tensorboard_writer_that_cannot_open_warns_and_logs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.utils.tensorboard

    from trainflow.tracking import TensorBoardLogger

    def refuse(log_dir: str) -> None:
        raise PermissionError(f"no access to {log_dir}")

    monkeypatch.setattr(torch.utils.tensorboard, "SummaryWriter", refuse)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger = TensorBoardLogger(tmp_path / "tb")
        logger.log({"loss": 1.0}, 1)
        logger.close()
    assert logger.error == f"opening the event file: PermissionError: no access to {tmp_path / 'tb'}"
    assert len(caught) == 1 and "failed while opening the event file (PermissionError" in str(caught[0].message)
